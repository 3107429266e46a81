"""A bundle's job runner survives its host: runs live in Postgres, a runner on host B stands by, and
when host A's runner is SIGKILLed, B takes the lease, fences the driver A's runner left behind (it
stops at once, uncommitted) and starts the continuous job again on host B from its checkpoint on HDFS.
Rows continue in Postgres: every id once, none missing. A deploy from host A then moves the job on
host B into its running driver (no restart), and a cancel from host A stops it there.

The bundle root is on the S3-compatible store: each host's runner works on its own mirror of it
(``STREAMLING_MIRROR_DIR``), so host B has no view of what host A's runner wrote but what the store
holds. Host B's runner runs in host B's network namespace with this machine's files otherwise, as a
second machine with streamling installed would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import attempts, bundle, runs, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.slow]

NOTEBOOK = """\
# Databricks notebook source
# MAGIC %%streamling source numbers
# MAGIC type: generate
# MAGIC rows: 10000000
# MAGIC rows_per_second: 200
# MAGIC rows_per_batch: 200
# MAGIC primary_key: id

# COMMAND ----------

# MAGIC %%streamling sink db --from numbers
# MAGIC type: postgres
# MAGIC schema: takeover
# MAGIC table: {table}
"""


def _host_env(base: dict[str, str], host: str, address: str) -> dict[str, str]:
    """What each host's runner environment holds: its name, the address its drivers advertise, and
    its own mirror of the bundle root."""
    return {**base, "STREAMLING_HOST": host, "SPARK_LOCAL_IP": address, "SPARK_LOCAL_HOSTNAME": address,
            "STREAMLING_MIRROR_DIR": str(Path(base["STREAMLING_TEST_MIRRORS"]) / host)}


@pytest.fixture
def project(tmp_path: Path, two_hosts: dict[str, str], postgres_service: dict[str, str], s3: dict[str, str],
            unique_name: str) -> Iterator[tuple[Path, dict[str, str]]]:
    address = postgres_service.get("STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS")
    if not address:
        pytest.fail("postgres does not listen on host A's end of the two-host pair: restart it with "
                    "`fixtures/services/down postgres; fixtures/services/up postgres` as root")
    pg = {"host": address, "port": postgres_service["STREAMLING__POSTGRES_SINK__PORT"],
          "user": postgres_service["STREAMLING__POSTGRES_SINK__USER"],
          "db": postgres_service["STREAMLING__POSTGRES_SINK__DB"], "sslmode": "disable"}
    root = tmp_path / "project"
    root.mkdir()
    (root / "ingest.py").write_text(NOTEBOOK.format(table=unique_name))
    hdfs = two_hosts["STREAMLING_TEST_HDFS_URL"]
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: takeover}}
        workspace: {{root_path: "s3a://{s3['STREAMLING_TEST_S3_BUCKET']}/tests/{unique_name}/root"}}
        resources:
          jobs:
            ingest:
              continuous: {{}}
              tasks:
                - task_key: main
                  notebook_task: {{notebook_path: ./ingest.py}}
                  min_retry_interval_millis: 1000
        targets:
          cluster:
            default: true
            mode: production
            config:
              checkpoint_interval_sec: 1
              state_dir: {hdfs}/tests/{unique_name}/state
              spark:
                master: {two_hosts['STREAMLING_TEST_MULTIHOST_MASTER']}
                conf:
                  spark.hadoop.dfs.replication: "1"
                  spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms: "20"
                  spark.hadoop.fs.s3a.endpoint: "{s3['STREAMLING_TEST_S3_ENDPOINT']}"
                  spark.hadoop.fs.s3a.path.style.access: "true"
                  spark.hadoop.fs.s3a.endpoint.region: us-east-1
                  spark.hadoop.fs.s3a.access.key: "{s3['STREAMLING_TEST_S3_ACCESS_KEY']}"
              postgres_sink: {pg}
              job_runner:
                store: postgres
                postgres: {pg}
                lease_secs: 5
    """))
    password = postgres_service["STREAMLING__POSTGRES_SINK__PASS"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    env.update(STREAMLING__POSTGRES_SINK__PASS=password, STREAMLING__JOB_RUNNER__POSTGRES__PASS=password)
    env["STREAMLING__SPARK__CONF__spark.hadoop.fs.s3a.secret.key"] = s3["STREAMLING_TEST_S3_SECRET_KEY"]
    env["STREAMLING_TEST_MIRRORS"] = str(tmp_path / "mirrors")
    yield root, env
    bundle(root, _host_env(env, "host-a", two_hosts["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]), "destroy",
           "--auto-approve")


def _uploaded_log(root: Path, env: dict[str, str], run_id: int, number: int) -> str:
    out = bundle(root, env, "logs", str(run_id), "--attempt", str(number)).stdout
    return "" if "(no log)" in out else out


def _rows(pg: Any, table: str) -> tuple[int, int, int, int]:
    try:
        count, distinct, low, high = pg.execute(
            f'SELECT count(*), count(DISTINCT id), min(id), max(id) FROM takeover."{table}"').fetchone()
    except Exception:  # not created yet
        return 0, 0, 0, -1
    return int(count), int(distinct), int(low or 0), int(-1 if high is None else high)


def test_a_runner_on_another_host_takes_over_and_rows_continue_once(
        project: tuple[Path, dict[str, str]], two_hosts: dict[str, str], pg: Any, unique_name: str,
        tmp_path: Path) -> None:
    root, env = project
    host_a = _host_env(env, "host-a", two_hosts["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"])
    host_b = _host_env(env, "host-b", "10.213.77.2")
    deployed = bundle(root, host_a, "deploy")  # starts host A's runner, which starts the continuous job
    assert deployed.returncode == 0, deployed.stderr
    wait_for(lambda: _rows(pg, unique_name)[0] >= 400, 300, "rows from host A's driver")

    # Host B's runner stands by: the lease is A's.
    runner_b_log = tmp_path / "runner-b.log"
    with runner_b_log.open("w") as out:
        runner_b = subprocess.Popen(["ip", "netns", "exec", "streamling-hostb", sys.executable, "-m", "streamling.cli",
                                     "bundle", "runner", "-t", "cluster"], cwd=root, env=host_b, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "stands by" in runner_b_log.read_text(), 60, "host B's runner to stand by")
        schema = "streamling_runs_takeover_cluster"
        holder_host, runner_a = pg.execute(f"SELECT host, pid FROM {schema}.runner_lease").fetchone()
        assert holder_host == "host-a"
        [first] = [a for a in attempts(root, host_a, "ingest") if a["state"] == "running"]
        assert first["host"] == "host-a"

        os.kill(runner_a, signal.SIGKILL)  # host A's runner dies; its driver does not
        killed = time.monotonic()
        wait_for(lambda: pg.execute(f"SELECT host FROM {schema}.runner_lease").fetchone()[0] == "host-b", 60,
                 "host B's runner to take the lease")
        took = time.monotonic() - killed
        wait_for(lambda: any(a["state"] == "running" and a["host"] == "host-b"
                             for a in attempts(root, host_a, "ingest")), 60, "the task to start on host B")
        # Host A's driver has ended (fenced): every row from now on is written by host B's driver.
        fenced_at = _rows(pg, unique_name)[0]
        wait_for(lambda: _rows(pg, unique_name)[0] >= fenced_at + 600, 300, "rows from host B's driver")
        print(f"runner SIGKILL → lease on host B {took:.1f}s → rows again {time.monotonic() - killed:.1f}s")

        history = attempts(root, host_a, "ingest")
        fenced = next(a for a in history if a["id"] == first["id"])
        assert fenced["state"] == "fenced" and fenced["exit_code"] == 75, fenced
        assert "took over supervision" in Path(fenced["log_path"]).read_text()
        assert history[-1]["host"] == "host-b" and history[-1]["state"] == "running"
        assert len(history) == 2, history  # one driver per host: no restart loop, no second writer

        # A changed source cannot resume from the checkpoint on HDFS: the deploy says so (it cannot list
        # HDFS, the run store knows the task ran) and changes nothing.
        notebook = NOTEBOOK.format(table=unique_name)
        (root / "ingest.py").write_text(notebook.replace("rows_per_second: 200", "rows_per_second: 300"))
        refused = bundle(root, host_a, "deploy")
        assert refused.returncode == 1 and "cannot resume from it" in refused.stderr, refused.stderr
        # A deploy from host A reaches the job on host B: its driver swaps the new definition in after
        # its epoch, in the same JVM on the same checkpoint (host B's runner fetches deployment 2 from
        # the store into its mirror, where it and its driver shake hands).
        (root / "ingest.py").write_text(notebook.replace(
            "# MAGIC %%streamling sink db --from numbers",
            "# MAGIC %%streamling transform kept --from numbers\n# MAGIC SELECT * FROM numbers WHERE id >= 0\n\n"
            "# COMMAND ----------\n\n# MAGIC %%streamling sink db --from kept"))
        redeployed = bundle(root, host_a, "deploy")
        assert redeployed.returncode == 0, redeployed.stderr
        moved = wait_for(lambda: next((r for r in runs(root, host_a, "ingest") if r["deployment"] == 2), None),
                         120, "the run to move to deployment 2")
        assert moved["message"] == "moved to deployment 2 in its running driver (no restart)", moved
        assert len(attempts(root, host_a, "ingest")) == 2  # no new driver

        # Host A's CLI talks to host B's runner through the store: the run stops there after its epoch
        # (a continuous job then starts its next run, as on Databricks; destroy ends that one).
        cancelled = bundle(root, host_a, "cancel", "--job", "ingest")
        assert cancelled.returncode == 0, cancelled.stderr
        run = wait_for(lambda: next((r for r in runs(root, host_a, "ingest") if r["run_id"] == first["run_id"]
                                     and r["state"] == "cancelled"), None), 120, "run 1 to stop on host B")
        last = run["attempts"][-1]
        # host A reads the log host B's runner uploaded to the store when the attempt ended
        text = wait_for(lambda: _uploaded_log(root, host_a, first["run_id"], last["number"]), 60,
                        "host B's log in the store")
        assert (last["host"], last["state"], last["exit_code"]) == ("host-b", "cancelled", 0), \
            "\n".join(line for line in text.splitlines() if " ERROR " in line or "Error" in line) or text[-3000:]
    finally:
        os.killpg(runner_b.pid, signal.SIGTERM)
        runner_b.wait(timeout=60)

    count, distinct, low, high = _rows(pg, unique_name)
    assert (count, distinct, low) == (high + 1, high + 1, 0), (count, distinct, low, high)
