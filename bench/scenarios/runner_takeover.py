"""``runner_takeover``: how long a continuous bundle job is without a supervisor when its runner's host
dies, with the run store in Postgres and a second runner standing by on the other host.

A bundle (``job_runner.store: postgres``, ``lease_secs`` 5 and 10) runs a continuous generate →
Postgres notebook on the two-host cluster of ``up spark_multihost hdfs`` with checkpoints on HDFS;
host A's runner deploys and supervises it, host B's (in host B's network namespace, sharing the bundle
root as a shared mount would) stands by. Host A's runner is SIGKILLed (its driver lives on), and the
clock runs to: host B holds the lease, host A's driver has stopped (fenced), and the first row written
after that (by host B's new driver, a cold JVM). Each run is one bundle deployed and destroyed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from scenarios.common import Options, ScenarioResult, Side, ensure_services, interleaved, log

NAME = "runner_takeover"
TIMEOUT_SECS = 300
NOTEBOOK = """\
# Databricks notebook source
# MAGIC %%streamling source numbers
# MAGIC type: generate
# MAGIC rows: 100000000
# MAGIC rows_per_second: 200
# MAGIC rows_per_batch: 200
# MAGIC primary_key: id

# COMMAND ----------

# MAGIC %%streamling sink db --from numbers
# MAGIC type: postgres
# MAGIC schema: bench_takeover
# MAGIC table: {table}
"""


def _until(check: Callable[[], Any], what: str) -> float:
    deadline = time.monotonic() + TIMEOUT_SECS
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _bundle(work: Path, env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "streamling.cli", "bundle", *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_SECS)
    if proc.returncode != 0:
        raise RuntimeError(f"bundle {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")


def takeover(lease_secs: int) -> dict[str, Any]:
    import psycopg

    name = f"t{uuid.uuid4().hex[:10]}"
    pg = {"host": os.environ["STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS"],
          "port": os.environ["STREAMLING__POSTGRES_SINK__PORT"], "user": os.environ["STREAMLING__POSTGRES_SINK__USER"],
          "db": os.environ["STREAMLING__POSTGRES_SINK__DB"], "sslmode": "disable"}
    password = os.environ["STREAMLING__POSTGRES_SINK__PASS"]
    work = Path(tempfile.mkdtemp(prefix="streamling-bench-takeover-"))
    (work / "ingest.py").write_text(NOTEBOOK.format(table=name))
    target = {"default": True, "mode": "production", "config": {
        "checkpoint_interval_sec": 1, "state_dir": f"{os.environ['STREAMLING_TEST_HDFS_URL']}/bench/{name}/state",
        "spark": {"master": os.environ["STREAMLING_TEST_MULTIHOST_MASTER"],
                  "conf": {"spark.hadoop.dfs.replication": "1"}},
        "postgres_sink": pg, "job_runner": {"store": "postgres", "postgres": pg, "lease_secs": lease_secs}}}
    task = {"task_key": "main", "notebook_task": {"notebook_path": "./ingest.py"}}
    (work / "bundle.yml").write_text(yaml.safe_dump({
        "bundle": {"name": name}, "workspace": {"root_path": str(work / "root")},
        "resources": {"jobs": {"ingest": {"continuous": {}, "tasks": [task]}}}, "targets": {"cluster": target}}))
    base = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    base.update(STREAMLING__POSTGRES_SINK__PASS=password, STREAMLING__JOB_RUNNER__POSTGRES__PASS=password)
    driver_a = os.environ["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]
    host_a = {**base, "STREAMLING_HOST": "host-a", "SPARK_LOCAL_IP": driver_a, "SPARK_LOCAL_HOSTNAME": driver_a}
    host_b = {**base, "STREAMLING_HOST": "host-b", "SPARK_LOCAL_IP": "10.213.77.2",
              "SPARK_LOCAL_HOSTNAME": "10.213.77.2"}
    schema = f"streamling_runs_{name}_cluster"
    conn = psycopg.connect(host="127.0.0.1", port=pg["port"], user=pg["user"], password=password, dbname=pg["db"],
                           autocommit=True)

    def rows() -> int:
        try:
            return int(conn.execute(f'SELECT count(*) FROM bench_takeover."{name}"').fetchone()[0])
        except psycopg.Error:
            return 0

    def one(sql: str) -> Any:
        found = conn.execute(sql).fetchone()
        return found[0] if found else None

    runner_b = None
    try:
        _bundle(work, host_a, "deploy")
        _until(lambda: rows() >= 400, "rows from host A's driver")
        with (work / "runner-b.log").open("w") as out:
            runner_b = subprocess.Popen(["ip", "netns", "exec", "streamling-hostb", sys.executable, "-m",
                                         "streamling.cli", "bundle", "runner"], cwd=work, env=host_b, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        _until(lambda: "stands by" in (work / "runner-b.log").read_text(), "host B's runner to stand by")
        first_log = one(f"SELECT log_path FROM {schema}.attempts ORDER BY id LIMIT 1")
        os.kill(int(one(f"SELECT pid FROM {schema}.runner_lease")), signal.SIGKILL)
        killed = time.monotonic()
        leased = _until(lambda: one(f"SELECT host FROM {schema}.runner_lease") == "host-b", "the lease on host B")
        fenced = _until(lambda: Path(f"{first_log}.exit").exists(), "host A's driver to stop")
        at_fence = rows()
        resumed = _until(lambda: rows() > at_fence, "a row from host B's driver")
        return {"lease_secs": leased - killed, "fenced_secs": fenced - killed, "next_row_secs": resumed - killed}
    finally:
        try:
            _bundle(work, host_a, "destroy", "--auto-approve")
        finally:
            if runner_b is not None:
                os.killpg(runner_b.pid, signal.SIGKILL)
            conn.execute(f'DROP TABLE IF EXISTS bench_takeover."{name}"')
            conn.close()


def run(options: Options) -> ScenarioResult:
    why = ensure_services("postgres", "hdfs", "spark_multihost", present=(
        "STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS", "STREAMLING_TEST_HDFS_URL", "STREAMLING_TEST_MULTIHOST_MASTER"))
    sides = {n: Side(n) for n in ("lease_5s", "lease_10s")}
    if why:
        return ScenarioResult(NAME, {}, sides, skipped=why)
    interleaved(options.runs, {"lease_5s": lambda: takeover(5), "lease_10s": lambda: takeover(10)}, sides, log)
    result = ScenarioResult(NAME, {"runs": options.runs}, sides)
    result.figures = {f"{side} {what}": (sides[side].median(key), "s") for side in sides
                      for what, key in (("kill → lease on host B", "lease_secs"),
                                        ("kill → host A's driver stopped", "fenced_secs"),
                                        ("kill → next row", "next_row_secs"))}
    result.notes.append("the next row waits for a new driver JVM on host B (cold start with the shipped "
                        "environment); a warm standby driver would remove most of it")
    return result
