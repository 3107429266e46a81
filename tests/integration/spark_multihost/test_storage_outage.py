"""The checkpoint's storage goes away mid-run: the flow restarts its query from the checkpoint with
the flow's retry policy, and either carries on once HDFS is back (every id once in the table) or,
when the attempts run out, stops with the epoch in flight uncommitted and says what to fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from services import ROOT, start_services

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROWS = 2_400  # 8 epochs: 2 before the first outage, 2 before the second, 4 after it
PIPELINE = f"""
sources:
  orders: {{type: generate, rows: {ROWS}, rows_per_second: 300, rows_per_batch: 300, primary_key: id}}
sinks:
  out: {{type: delta, from: orders, path: ./lake}}
"""


def _down_hdfs() -> None:
    subprocess.run([str(ROOT / "fixtures" / "services" / "down"), "hdfs"], check=True, capture_output=True,
                   timeout=120)


def _run_until(proc: subprocess.Popen[bytes], log: Path, epochs: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(re.findall(r"epoch \d+ finalized", log.read_text(errors="replace"))) < epochs:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def _run_through_outage(cmd: list[str], cwd: Path, env: dict[str, str], log: Path,
                        outage_secs: float | None) -> tuple[int, str]:
    """Run the CLI, stop HDFS after its second epoch (for ``outage_secs``, or for good: None), and
    return its exit code and log."""
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _run_until(proc, log, 2)
        _down_hdfs()
        if outage_secs is not None:
            time.sleep(outage_secs)
            start_services("hdfs")
        code = proc.wait(timeout=300)
    return code, log.read_text()


def test_a_storage_outage_is_retried_then_given_up_and_resumed_without_loss(
        tmp_path: Path, two_hosts: dict[str, str], spark: Any, unique_name: str) -> None:
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    env = {**os.environ, "STREAMLING__SPARK__MASTER": "local[1]", "STREAMLING__ADMIN_API_PORT": "0",
           "STREAMLING__APPLICATION_ID": unique_name,
           "STREAMLING__STATE_DIR": f"{two_hosts['STREAMLING_TEST_HDFS_URL']}/tests/{unique_name}/state",
           "STREAMLING__RETRY__INITIAL_BACKOFF_MS": "200", "STREAMLING__RETRY__MAX_BACKOFF_MS": "1000",
           # Hadoop's client tries a refused connection 10 times, 1 s apart, inside each of the flow's
           # attempts: fail fast so the flow's retry policy is what the test watches.
           "STREAMLING__SPARK__CONF__spark.hadoop.ipc.client.connect.max.retries": "1",
           "STREAMLING__SPARK__CONF__spark.hadoop.ipc.client.connect.retry.interval": "200",
           # the second run resumes the first one's checkpoint: a backend that keeps positions
           "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Sqlite",
           "STREAMLING__STATE_BACKEND__SQLITE__DATABASE_PATH": str(tmp_path / "state.db")}
    cli = [str(Path(sys.executable).with_name("streamling")), "pipeline.yaml"]
    try:
        # 1. Three attempts, HDFS stays away: the run stops, its epoch in flight uncommitted.
        code, text = _run_through_outage(cli, tmp_path, {**env, "STREAMLING__RETRY__MAX_ATTEMPTS": "3"},
                                         tmp_path / "give_up.log", None)
        assert code == 1, text[-3000:]
        errors = [line for line in text.splitlines() if " ERROR " in line]
        assert errors and re.search(r"cannot (write the checkpoint at|look up) hdfs://\S+: .*Connection refused.* — "
                                    r"check that the hdfs storage at hdfs://\S+ is up and reachable from this host",
                                    errors[-1]), text[-3000:]
        assert "gave up after 3 attempts; the epoch in flight was not committed" in text, text[-3000:]
        assert "restarting it from its checkpoint in" in text and "Traceback" not in text

        # 2. HDFS back: the run resumes from the checkpoint; a shorter outage mid-run is ridden out.
        start_services("hdfs")
        code, text = _run_through_outage(cli, tmp_path, {**env, "STREAMLING__RETRY__MAX_ATTEMPTS": "30"},
                                         tmp_path / "resume.log", 6)
        assert code == 0, text[-3000:]
        assert "restarting it from its checkpoint in" in text and "pipeline finished" in text, text[-3000:]
        assert "flow 'orders': resuming the checkpoint at hdfs://" in text, text[-3000:]
    finally:
        start_services("hdfs")
    table = spark.read.format("delta").load(str(tmp_path / "lake"))
    assert table.selectExpr("count(*)", "count(DISTINCT id)", "min(id)", "max(id)").first() == (ROWS, ROWS, 0, ROWS - 1)
