"""The ``streamling`` CLI against a Spark standalone cluster: the driver runs here in client mode,
executors on two workers. One worker is SIGKILLed mid-run; Spark reruns its tasks on the other and
the Postgres table still ends with every row exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from services import start_services

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
ROWS = 20_000  # 1,000 per micro-batch at 2,000 rows/s: about 10 s of data


def _master_apps(ui: str) -> dict[str, dict[str, Any]]:
    """Every application the master knows (running or finished), by id."""
    with urllib.request.urlopen(f"{ui}/json/", timeout=10) as resp:
        state = json.load(resp)
    return {app["id"]: app for app in state["activeapps"] + state["completedapps"]}


def _rows_so_far(pg: Any, table: str) -> int:
    try:
        return int(pg.execute(f'SELECT count(*) FROM public."{table}"').fetchone()[0])
    except Exception:  # the sink has not created the table yet
        return 0


def test_cli_on_the_cluster_survives_a_killed_worker(tmp_path: Path, spark_cluster: dict[str, str],
                                                     pg_environ: dict[str, str], pg: Any,
                                                     unique_name: str) -> None:
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
sources:
  orders: {{type: generate, rows: {ROWS}, rows_per_batch: 1000, rows_per_second: 2000, primary_key: id}}
transforms:
  shaped:
    type: sql
    sql: SELECT id, customer, country, amount * quantity AS total FROM orders
sinks:
  db: {{type: postgres, from: shaped, table: {unique_name}}}
""")
    env = {**pg_environ, "STREAMLING_CACHE_DIR": str(ROOT / ".cache"),
           "STREAMLING__SPARK__MASTER": spark_cluster["STREAMLING_TEST_SPARK_MASTER"],
           "STREAMLING__APPLICATION_ID": unique_name, "STREAMLING__STATE_DIR": str(tmp_path / "state"),
           # A name of its own: other drivers may use the same cluster meanwhile.
           "STREAMLING__SPARK__CONF__spark.app.name": unique_name}
    ui = spark_cluster["STREAMLING_TEST_SPARK_MASTER_UI"]
    victim = Path(spark_cluster["STREAMLING_TEST_SPARK_WORKER_PIDFILES"].split(":")[0])
    apps_before = set(_master_apps(ui))
    driver_log = tmp_path / "driver.log"
    proc = None
    try:
        with driver_log.open("w") as log:
            proc = subprocess.Popen([str(Path(sys.executable).with_name("streamling")), str(pipeline)],
                                    cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log)
            deadline = time.monotonic() + 150
            while (seen := _rows_so_far(pg, unique_name)) == 0:
                assert proc.poll() is None, f"the CLI exited early:\n{driver_log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no rows after 150 s:\n{driver_log.read_text()[-3000:]}"
                time.sleep(0.2)
            assert seen < ROWS, "the run ended before a worker could be killed"
            os.kill(int(victim.read_text()), signal.SIGKILL)
            code = proc.wait(timeout=150)
        out = driver_log.read_text()
        assert code == 0, out[-3000:]
        assert "pipeline finished" in out and "Traceback" not in out, out[-3000:]
        count, distinct, low, high = pg.execute(
            f'SELECT count(*), count(DISTINCT id), min(id), max(id) FROM public."{unique_name}"').fetchone()
        assert (count, distinct, low, high) == (ROWS, ROWS, 0, ROWS - 1)

        # The run was the cluster's: one new application, with executors on both workers.
        new = [app for app_id, app in _master_apps(ui).items()
               if app_id not in apps_before and app["name"] == unique_name]
        assert len(new) == 1, new
        state = Path(spark_cluster["STREAMLING_TEST_SPARK_STATE"])
        for worker in ("worker1", "worker2"):
            assert list((state / worker / new[0]["id"]).glob("*/stderr")), f"no executor on {worker}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        start_services("spark")  # restarts the killed worker for later tests
