"""The ``streamling`` CLI on a cluster of two hosts, with its checkpoints and a Delta table on HDFS
and another Delta table on S3.

Executors on host B have nothing of ours installed: they run the job's packed Python environment,
shipped with the application, and take the connector jars (s3a's ~700 MB included) from their host's
cache. Worker b is SIGKILLed mid-stream (its tasks rerun on host A), then the driver is SIGKILLed and
started again from the checkpoint on HDFS while worker b comes back: the tables end with every id once.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from services import delta_table_on_s3, s3a_conf, start_services

from streamling.runtime.jars import ensure_jars

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROWS = 4_000  # 1,000 per epoch at 1,000 rows/s: 4 epochs, at least 1 of them after the driver is killed

PIPELINE = """
sources:
  orders: {{type: generate, rows: {rows}, rows_per_batch: 1000, rows_per_second: 1000, primary_key: id}}
transforms:
  shaped:
    type: sql
    # _gs_xxhash is a Python (Arrow) UDF: executors on host B need pyarrow, xxhash and streamling
    sql: SELECT id, customer, country, amount * quantity AS total, _gs_xxhash(customer) AS h FROM orders
sinks:
  lake: {{type: delta, from: shaped, path: {lake}}}
"""
#: a second flow: a Python data source, planned by Python in the driver's JVM, read on executors
PLUGIN_FLOW = """
  plugged: {{type: basic_plugin.random_source, max_rows: {rows}, record_batch_size: 1000}}
  random_lake: {{type: delta, from: plugged, path: {lake}}}
"""


def _cli_env(two_hosts: dict[str, str], name: str, state: str) -> dict[str, str]:
    driver = two_hosts["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]
    return {**os.environ, "STREAMLING__SPARK__MASTER": two_hosts["STREAMLING_TEST_MULTIHOST_MASTER"],
            "STREAMLING__APPLICATION_ID": name, "STREAMLING__STATE_DIR": state,
            "STREAMLING__SPARK__CONF__spark.app.name": name,
            "STREAMLING__SPARK__CONF__spark.driver.host": driver,
            "STREAMLING__SPARK__CONF__spark.driver.bindAddress": driver,
            # One DataNode: files keep one copy, and a block's close need not back off 400 ms
            # waiting for a report that a single DataNode sends late.
            "STREAMLING__SPARK__CONF__spark.hadoop.dfs.replication": "1",
            "STREAMLING__SPARK__CONF__spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "20",
            "STREAMLING__ADMIN_API_PORT": "0"}


def _finalized(log: Path) -> int:
    return len(re.findall(r"flow orders: epoch \d+ finalized", log.read_text(errors="replace")))


def _wait_for(proc: subprocess.Popen[bytes], log: Path, epochs: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while _finalized(log) < epochs:
        assert proc.poll() is None, f"the CLI exited early:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"fewer than {epochs} epochs after {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def _host_b_executors(state: Path, app_name: str, since: float) -> list[Path]:
    """Executor folders of this test's applications in worker b's work dir (host B's own disk)."""
    work = state / "hostb" / "work"
    found = []
    for app in work.glob("app-*") if work.exists() else []:
        if app.stat().st_mtime < since:
            continue
        for executor in app.iterdir():
            stderr = executor / "stderr"
            if stderr.exists() and app_name in stderr.read_text(errors="replace"):
                found.append(executor)
    return found


def _host_b_jars(state: Path) -> dict[str, int]:
    """The jars in host B's cache (its own /tmp), by file name, with their sizes."""
    cache = state / "hostb" / "systmp" / "streamling-envs" / "jars"
    return {j.name: j.stat().st_size for j in cache.glob("*@*/*.jar")} if cache.exists() else {}


def test_two_hosts_lose_a_worker_and_the_driver_and_keep_every_row_once(
        tmp_path: Path, two_hosts: dict[str, str], s3: dict[str, str], spark: Any, unique_name: str,
        pg_environ: dict[str, str]) -> None:
    hdfs = two_hosts["STREAMLING_TEST_HDFS_URL"]
    lake = f"{hdfs}/tests/{unique_name}/lake"
    state = f"{hdfs}/tests/{unique_name}/state"
    # Executors on both hosts write this one: host B's get s3a's jars from its own cache.
    random_lake = f"s3a://{s3['STREAMLING_TEST_S3_BUCKET']}/tests/{unique_name}/random"
    pipeline = tmp_path / "pipeline.yaml"
    text = PIPELINE.format(rows=ROWS, lake=lake)
    source, sink = PLUGIN_FLOW.format(rows=ROWS, lake=random_lake).strip("\n").splitlines()
    text = text.replace("transforms:\n", f"{source}\ntransforms:\n").replace("sinks:\n", f"sinks:\n{sink}\n")
    pipeline.write_text(text)
    s3a = {**s3a_conf(s3), "spark.jars": s3["STREAMLING_TEST_S3A_JARS"]}
    # The rerun resumes the killed driver's checkpoint: a backend that keeps positions, and one every
    # host reaches (SQLite is refused on a cluster).
    env = {**_cli_env(two_hosts, unique_name, state), "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Postgres",
           **{k: v for k, v in pg_environ.items() if k.startswith("STREAMLING__STATE_BACKEND__POSTGRES__")},
           **{f"STREAMLING__SPARK__CONF__{k}": v for k, v in s3a.items()}}
    cli = str(Path(sys.executable).with_name("streamling"))
    worker_b = Path(two_hosts["STREAMLING_TEST_MULTIHOST_WORKER_B_PIDFILE"])
    started = time.time()
    first_log, second_log = tmp_path / "driver1.log", tmp_path / "driver2.log"
    try:
        with first_log.open("w") as log:
            first = subprocess.Popen([cli, str(pipeline)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                     stderr=log, start_new_session=True)
            _wait_for(first, first_log, 1)
            os.kill(int(worker_b.read_text()), signal.SIGKILL)  # host B goes away mid-stream
            _wait_for(first, first_log, 2)
            os.killpg(first.pid, signal.SIGKILL)  # and then the driver, between or inside an epoch
            first.wait(timeout=30)
        # Host B's worker comes back while the driver starts again, as a supervisor would have both.
        healing = threading.Thread(target=start_services, args=("spark_multihost",))
        healing.start()
        with second_log.open("w") as log:
            code = subprocess.run([cli, str(pipeline)], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                  stderr=log, timeout=400, start_new_session=True).returncode
        healing.join()
        out = second_log.read_text()
        assert code == 0, out[-3000:]
        assert "pipeline finished" in out and "Traceback" not in out, out[-3000:]
    finally:
        start_services("spark_multihost")

    # Executors on host B ran the shipped environment: nothing of ours is installed there. Their
    # jars came from the host's cache, not with the application: its folders hold streamling's own
    # small jar (the plugin that fills the cache) and no other.
    cluster_state = Path(two_hosts["STREAMLING_TEST_MULTIHOST_STATE"])
    executors = _host_b_executors(cluster_state, unique_name, started)
    assert executors, "no executor of this test ran on host B"
    assert any((e / "streamling_env" / "bin" / "streamling-python").exists() for e in executors)
    assert {j.name for e in executors for j in e.glob("*.jar")} == {"streamling-native.jar"}
    cached = _host_b_jars(cluster_state)
    for jar in [*s3["STREAMLING_TEST_S3A_JARS"].split(","), *map(str, ensure_jars())]:
        assert cached.get(Path(jar).name) == Path(jar).stat().st_size, (jar, sorted(cached))

    # The table, read by a fresh session of this process: every id once, the right values.
    table = spark.read.format("delta").load(lake)
    count, distinct, low, high = table.selectExpr("count(*)", "count(DISTINCT id)", "min(id)", "max(id)").first()
    assert (count, distinct, low, high) == (ROWS, ROWS, 0, ROWS - 1)
    # The S3 table, as its Delta log says: every row once.
    random = delta_table_on_s3(s3, random_lake)
    assert (random.num_rows, len(set(random.column("alphanumeric_field").to_pylist()))) == (ROWS, ROWS)
    import xxhash

    pairs = {(r.customer, r.h) for r in table.select("customer", "h").distinct().collect()}
    assert pairs == {(c, xxhash.xxh3_128_hexdigest(c.encode())) for c, _ in pairs}


def test_workers_without_the_drivers_python_fail_the_first_task_naming_both_versions(
        tmp_path: Path, two_hosts: dict[str, str], unique_name: str) -> None:
    hdfs = two_hosts["STREAMLING_TEST_HDFS_URL"]
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(PIPELINE.format(rows=100, lake=f"{hdfs}/tests/{unique_name}/lake"))
    # Executors find no python3.11 on this PATH (their Java is started by absolute path).
    env = {**_cli_env(two_hosts, unique_name, f"{hdfs}/tests/{unique_name}/state"),
           "STREAMLING__SPARK__CONF__spark.executorEnv.PATH": "/nonexistent"}
    master = env.pop("STREAMLING__SPARK__MASTER")  # given as the flag a user would type instead
    proc = subprocess.run([str(Path(sys.executable).with_name("streamling")), "--master", master, str(pipeline)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    error = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert error and re.search(rf"executors cannot start Python: worker host \S+ has no Python {minor} \(none found\) "
                               rf"but the driver runs Python {re.escape(sys.version.split()[0])}: install Python "
                               rf"{minor} on every worker", error[-1]), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_worker_that_cannot_keep_the_jars_is_named_once_and_the_others_carry_on(
        tmp_path: Path, two_hosts: dict[str, str], unique_name: str) -> None:
    hdfs = two_hosts["STREAMLING_TEST_HDFS_URL"]
    pipeline = tmp_path / "pipeline.yaml"
    # JVM work only (no Python UDF): worker a's executors run it with the driver's own jar files.
    pipeline.write_text("sources:\n  orders: {type: generate, rows: 600, rows_per_batch: 100, "
                        "rows_per_second: 100}\nsinks:\n  out: {type: blackhole, from: orders}\n")
    # No folder can be made under /proc: host B's executors cannot fill their cache.
    env = {**_cli_env(two_hosts, unique_name, f"{hdfs}/tests/{unique_name}/state"),
           "STREAMLING__SPARK__CONF__spark.executorEnv.STREAMLING_WORKER_CACHE": "/proc/streamling-cache"}
    proc = subprocess.run([str(Path(sys.executable).with_name("streamling")), str(pipeline)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pipeline finished" in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "cannot put the application's connector jars" in line]
    assert len(said) == 1, proc.stderr[-3000:]
    assert re.search(r"ERROR HostJars: streamling: worker host streamling-hostb \(executor \d+\) cannot put the "
                     r"application's connector jars in its cache /proc/streamling-cache/jars: .+ Check that every "
                     r"worker reaches the driver \(spark.driver.host\) and has room in /proc/streamling-cache/jars, "
                     r"or point spark.executorEnv.STREAMLING_WORKER_CACHE elsewhere", said[0]), said[0]
