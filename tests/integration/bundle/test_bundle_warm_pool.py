"""A production target keeps a pooled warm driver (``job_runner.warm_drivers``): the first run of a
job deployed while the runner runs starts in it instead of a cold JVM, and a task whose Spark
settings differ from the target's becomes a cold driver in that same process, with the same rows.
On real Spark and a real Postgres."""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import attempts, bundle, ready_pooled, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres]

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

JOB = """\
    {key}:
      continuous: {{}}
      tasks:
        - task_key: main
          notebook_task: {{notebook_path: ./notebooks/{key}.py}}{extra}
"""


@pytest.fixture
def project(tmp_path: Path, pg_environ: dict[str, str], unique_name: str) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    env = {k: v for k, v in pg_environ.items() if not k.startswith("BUNDLE_VAR_")}
    yield root, env
    bundle(root, env, "destroy", "--auto-approve")


def _write(root: Path, tmp_path: Path, unique_name: str, jobs: dict[str, str]) -> None:
    """The bundle with ``jobs`` (key → extra task YAML), each writing to table ``<unique_name>_<key>``."""
    for key in jobs:
        (root / "notebooks" / f"{key}.py").write_text(NOTEBOOK.format(table=f"{unique_name}_{key}"))
    body = "".join(JOB.format(key=key, extra=extra) for key, extra in jobs.items())
    (root / "bundle.yml").write_text("bundle: {name: pool_check}\nresources:\n  jobs:\n" + body + textwrap.dedent(f"""\
        targets:
          prod:
            default: true
            mode: production
            workspace: {{root_path: {tmp_path / 'root'}}}
            config:
              checkpoint_interval_sec: 1
              spark: {{master: "local[2]"}}
              job_runner: {{standby: false}}
    """))


def _count(pg: Any, table: str) -> int:
    try:
        return int(pg.execute(f'SELECT count(*) FROM public."{table}"').fetchone()[0])
    except Exception:  # the sink has not created the table yet
        return 0


def _ids_once(pg: Any, table: str) -> bool:
    count, distinct, low, high = pg.execute(f'SELECT count(*), count(DISTINCT id), min(id), max(id) '
                                            f'FROM public."{table}"').fetchone()
    return bool(count) and (count, distinct, low) == (high + 1, high + 1, 0)


def test_a_new_jobs_first_run_starts_in_the_pooled_warm_driver(
        project: tuple[Path, dict[str, str]], pg: Any, unique_name: str, tmp_path: Path) -> None:
    root, env = project
    workspace = tmp_path / "root"
    _write(root, tmp_path, unique_name, {"first": ""})
    assert bundle(root, env, "deploy").returncode == 0
    wait_for(lambda: _count(pg, f"{unique_name}_first") > 0, 180, "the first job's rows")
    pooled = wait_for(lambda: ready_pooled(workspace, 1), 180, "the pooled warm driver")
    summary = json.loads(bundle(root, env, "summary", "-o", "json").stdout)
    assert summary["warm_drivers"] == [s for s in summary["warm_drivers"] if s.startswith(f"ready (pid {pooled}, ")]
    assert len(summary["warm_drivers"]) == 1, summary["warm_drivers"]

    # A new job's first run is handed to the warm driver: no JVM start between deploy and its rows.
    _write(root, tmp_path, unique_name, {"first": "", "second": ""})
    started = time.monotonic()
    assert bundle(root, env, "deploy").returncode == 0
    wait_for(lambda: _count(pg, f"{unique_name}_second") > 0, 120, "the second job's rows")
    print(f"deploy → first row of a new job, pooled driver warm: {time.monotonic() - started:.1f}s")
    [second] = attempts(root, env, "second")
    assert second["pid"] == pooled, second
    text = Path(second["log_path"]).read_text()
    assert "pooled warm driver takes over" in text
    # While it waited it started its Python workers (the first epoch reuses them) and analysed a
    # pipeline like the task's, so neither cost is the new job's.
    assert re.search(r"warmed up in [\d.]+s \(2 task\(s\); Python workers with streamling.sinks.blackhole, "
                     r"streamling.sources.generate, streamling.transforms.sql\)", text), text[-3000:]
    assert text.index("warmed up in") < text.index("pooled warm driver takes over")

    # A task whose Spark settings are its own (its cluster's spark_conf) cannot use a session warmed
    # for the target's: the warm driver becomes its cold driver, in the same process, same rows.
    pooled = wait_for(lambda: ready_pooled(workspace, 2), 180, "a new pooled warm driver")
    own_conf = "\n          new_cluster: {spark_conf: {spark.streamling.check: 'on'}}"
    _write(root, tmp_path, unique_name, {"first": "", "second": "", "third": own_conf})
    assert bundle(root, env, "deploy").returncode == 0
    wait_for(lambda: _count(pg, f"{unique_name}_third") >= 200, 180, "the third job's rows")
    [third] = attempts(root, env, "third")
    assert third["pid"] == pooled, third
    text = Path(third["log_path"]).read_text()
    assert "needs a Spark session with other settings than the target's" in text
    assert "pooled warm driver takes over" not in text
    for key in ("first", "second", "third"):
        assert _ids_once(pg, f"{unique_name}_{key}"), key
