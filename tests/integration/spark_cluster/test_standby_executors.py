"""A continuous job's warm standby on a cluster that keeps warm executors of its own
(``job_runner.standby_executors``): while the active driver runs on the cores ``spark.cores.max``
gives it, the standby's application holds its executor, warmed (Python workers with the job's modules
imported). When the active driver is SIGKILLed the standby takes over and its first epoch runs on that
executor: no executor starts between the kill and the next rows, and every id is in Postgres once."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jobs import attempts, bundle, ready_standby, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.slow]

NOTEBOOK = """\
# Databricks notebook source
# MAGIC %load_ext streamling

# COMMAND ----------

# MAGIC %config StreamlingMagics.application_id = '{table}'

# COMMAND ----------

# MAGIC %%streamling source orders
# MAGIC type: generate
# MAGIC rows_per_second: 200
# MAGIC rows_per_batch: 100
# MAGIC primary_key: id

# COMMAND ----------

# MAGIC %%streamling sink out --from orders
# MAGIC type: postgres
# MAGIC schema: public
# MAGIC table: {table}
"""


@pytest.fixture
def project(tmp_path: Path, pg_environ: dict[str, str], spark_cluster: dict[str, str],
            unique_name: str) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "stream.py").write_text(NOTEBOOK.format(table=unique_name))
    task = {"task_key": "main", "notebook_task": {"notebook_path": "./notebooks/stream.py"}}
    job = {"continuous": {}, "tasks": [task]}
    # two one-core workers: one core for the active driver, one for its standby's warm executor
    config = {"checkpoint_interval_sec": 1,
              "spark": {"master": spark_cluster["STREAMLING_TEST_SPARK_MASTER"],
                        "conf": {"spark.cores.max": "1", "spark.app.name": unique_name}},
              "job_runner": {"standby": True, "warm_drivers": 0, "standby_executors": 1}}
    (root / "bundle.yml").write_text(yaml.safe_dump({
        "bundle": {"name": "warm_standby_executors"}, "resources": {"jobs": {"stream": job}},
        "targets": {"cluster": {"default": True, "mode": "production",
                                "workspace": {"root_path": str(tmp_path / "root")}, "config": config}}}))
    env = {k: v for k, v in pg_environ.items() if not k.startswith("BUNDLE_VAR_")}
    yield root, env
    bundle(root, env, "destroy", "--auto-approve")


def _cores(ui: str, name: str) -> list[int]:
    """The cores each running application of this test holds (the master's JSON)."""
    with urllib.request.urlopen(f"{ui}/json/", timeout=10) as resp:
        apps = json.load(resp)["activeapps"]
    return sorted(int(app["cores"]) for app in apps if app["name"] == name)


def _ids(pg: Any, table: str) -> tuple[int, int, int, int]:
    try:
        return pg.execute(f'SELECT count(*), count(DISTINCT id), coalesce(min(id), 0), coalesce(max(id), -1) '
                          f'FROM public."{table}"').fetchone()
    except Exception:  # the sink has not created the table yet
        return (0, 0, 0, -1)


def test_a_standby_with_warm_executors_takes_over_without_starting_one(
        project: tuple[Path, dict[str, str]], pg: Any, unique_name: str, spark_cluster: dict[str, str],
        tmp_path: Path) -> None:
    root, env = project
    deployed = bundle(root, env, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    assert "spark.cores.max" not in deployed.stderr  # it leaves the standby its core: no warning
    wait_for(lambda: _ids(pg, unique_name)[0] > 0, 180, "the job's first rows")
    standby = wait_for(lambda: ready_standby(tmp_path / "root", 1), 240, "the warm standby")
    [standby_log] = (tmp_path / "root" / "logs" / "standby").glob("stream.main.*.log")
    warm = standby_log.read_text()
    assert "1 executor(s) registered in" in warm and "streamling.sinks.postgres" in warm, warm[-3000:]
    # both applications hold one core: the active driver's and the standby's warm executor
    assert _cores(spark_cluster["STREAMLING_TEST_SPARK_MASTER_UI"], unique_name) == [1, 1]

    [running] = [a for a in attempts(root, env, "stream") if a["state"] == "running"]
    os.killpg(running["pid"], signal.SIGKILL)
    killed, before = time.monotonic(), _ids(pg, unique_name)[3]
    wait_for(lambda: _ids(pg, unique_name)[3] > before + 200, 120, "rows from the standby")
    print(f"standby with a warm executor: driver SIGKILL → rows again in {time.monotonic() - killed:.1f}s")
    history = attempts(root, env, "stream")
    assert history[0]["state"] == "failed" and history[-1]["pid"] == standby, history
    text = Path(history[-1]["log_path"]).read_text()
    assert "warm standby takes over" in text and "Traceback" not in text, text[-3000:]
    count, distinct, low, high = _ids(pg, unique_name)
    assert (count, distinct, low) == (high + 1, high + 1, 0)
