"""A notebook deployed as a continuous streaming job, on real Spark and a real Postgres.

One job lives through what production does to it: it starts at deploy, a no-op redeploy leaves it
alone, a changed SQL transform is swapped in by the running driver (same process, no JVM restart)
after its current epoch on the same checkpoint, a SQL that does not analyse leaves the running
version going with the error in the run's record, a Spark conf change relaunches the driver, its
driver is SIGKILLed and the runner restarts it, and a changed source is refused. The table must
hold every generated id exactly once: nothing lost, nothing skipped.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import attempts, bundle, ready_standby, runs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres]

NOTEBOOK = """\
# Databricks notebook source
# MAGIC %load_ext streamling

# COMMAND ----------

# MAGIC %config StreamlingMagics.application_id = 'redeploy_check'

# COMMAND ----------

# MAGIC %%streamling source orders
# MAGIC type: generate
# MAGIC rows_per_second: {rate}
# MAGIC rows_per_batch: 200
# MAGIC primary_key: id

# COMMAND ----------

# MAGIC %%streamling transform tagged --from orders
# MAGIC SELECT id, amount, '{version}' AS version FROM orders

# COMMAND ----------

# MAGIC %%streamling sink out --from tagged
# MAGIC type: postgres
# MAGIC schema: public
# MAGIC table: {table}
"""


@pytest.fixture
def project(tmp_path: Path, pg_environ: dict[str, str], unique_name: str) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "stream.py").write_text(NOTEBOOK.format(rate=200, version="v1", table=unique_name))
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: streaming_check}}
        resources:
          jobs:
            stream:
              continuous: {{}}
              tasks:
                - task_key: main
                  notebook_task: {{notebook_path: ./notebooks/stream.py}}
                  min_retry_interval_millis: 1000
        targets:
          prod:
            default: true
            mode: production
            workspace: {{root_path: {tmp_path / 'root'}}}
            config: {{checkpoint_interval_sec: 1, spark: {{master: "local[2]"}}, job_runner: {{warm_drivers: 0}}}}
    """))
    env = {k: v for k, v in pg_environ.items() if not k.startswith("BUNDLE_VAR_")}
    yield root, env
    bundle(root, env, "destroy", "--auto-approve")


def _ids(pg: Any, table: str) -> list[tuple[int, str]]:
    try:
        return [(int(i), str(v)) for i, v in pg.execute(f'SELECT id, version FROM public."{table}" ORDER BY id')]
    except Exception:  # the sink has not created the table yet
        return []


def _drivers_of(workspace: Path) -> list[int]:
    """Processes of this machine running a driver (or standby) of the target at ``workspace``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"streamling.bundle.driver" in args and str(workspace).encode() in args:
            found.append(int(cmdline.parent.name))
    return found


def _complete(rows: list[tuple[int, str]]) -> bool:
    """Every id from 0 to the largest, once: the generator's rows arrived without a gap."""
    return bool(rows) and [i for i, _ in rows] == list(range(rows[-1][0] + 1))


def test_continuous_notebook_job_swaps_in_its_driver_relaunches_for_spark_conf_and_refuses_a_changed_source(
        project: tuple[Path, dict[str, str]], pg: Any, unique_name: str) -> None:
    root, env = project
    started = time.monotonic()
    deployed = bundle(root, env, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    first = wait_for(lambda: len(_ids(pg, unique_name)) >= 200, 180, "the first rows in Postgres")
    print(f"deploy → 200 rows in Postgres: {time.monotonic() - started:.1f}s")
    assert first
    [attempt] = attempts(root, env)
    assert attempt["state"] == "running"

    # Deploying the same thing again leaves the running driver alone.
    again = bundle(root, env, "deploy")
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr
    assert [a["pid"] for a in attempts(root, env)] == [attempt["pid"]]

    # A changed SQL transform: the running driver swaps it in on the same checkpoint (same process).
    notebook = root / "notebooks" / "stream.py"
    notebook.write_text(NOTEBOOK.format(rate=200, version="v2", table=unique_name))
    changed = bundle(root, env, "deploy")
    assert changed.returncode == 0, changed.stderr
    assert "~ stream (changed: main; run 1 moves to it after its current epoch)" in changed.stdout
    wait_for(lambda: any(v == "v2" for _, v in _ids(pg, unique_name)), 180, "rows of the new definition")
    [run] = wait_for(lambda: [r for r in runs(root, env) if r["deployment"] == 2], 60, "the run on deployment 2")
    [swapped] = run["attempts"]
    assert (swapped["state"], swapped["pid"], swapped["deployment"]) == ("running", attempt["pid"], 2)
    assert run["message"] == "moved to deployment 2 in its running driver (no restart)"
    rows = _ids(pg, unique_name)
    assert _complete(rows), "ids missing across the swap"
    first_v2 = min(i for i, v in rows if v == "v2")
    assert first_v2 > 0 and all(v == "v1" for i, v in rows if i < first_v2), "the new definition started over"

    # A SQL that parses but does not analyse: deploy accepts it, the driver refuses it, v2 goes on.
    notebook.write_text(NOTEBOOK.format(rate=200, version="v3", table=unique_name).replace(
        "'v3' AS version", "no_such_column AS version"))
    broken = bundle(root, env, "deploy")
    assert broken.returncode == 0, broken.stderr
    [run] = wait_for(lambda: [r for r in runs(root, env) if "deployment 3 was not applied" in (r["message"] or "")],
                     120, "the refused deployment in the run's record")
    assert run["message"].startswith("deployment 3 was not applied, the run goes on with deployment 2: sql transform "
                                     "'tagged': "), run["message"]
    assert "no_such_column" in run["message"]
    assert [(a["state"], a["pid"], a["deployment"]) for a in run["attempts"]] == [("running", attempt["pid"], 2)]
    assert run["deployment"] == 2
    after = _ids(pg, unique_name)[-1][0]
    wait_for(lambda: _ids(pg, unique_name)[-1][0] > after + 200, 120, "rows of deployment 2 after the refusal")
    assert {v for _, v in _ids(pg, unique_name)} == {"v1", "v2"}

    # A Spark conf change needs a new JVM: the driver says so, and the runner relaunches it.
    notebook.write_text(NOTEBOOK.format(rate=200, version="v4", table=unique_name))
    config = (root / "bundle.yml").read_text()
    (root / "bundle.yml").write_text(config.replace(
        'spark: {master: "local[2]"}', 'spark: {master: "local[2]", conf: {spark.streamling.check: "on"}}'))
    relaunch = bundle(root, env, "deploy")
    assert relaunch.returncode == 0, relaunch.stderr
    wait_for(lambda: any(v == "v4" for _, v in _ids(pg, unique_name)), 180, "rows after the relaunch")
    moved = attempts(root, env)
    assert [a["state"] for a in moved] == ["redeployed", "running"]
    assert moved[0]["reason"] == ("stopped to move to deployment 4 (deployment 4 needs a new driver JVM: spark.conf "
                                  "changed (spark.streamling.check))")
    assert moved[1]["pid"] != attempt["pid"] and moved[1]["deployment"] == 4
    rows = _ids(pg, unique_name)
    assert _complete(rows), "ids missing across the relaunch"

    # A production target keeps a warm standby driver for the running task, built for deployment 4's
    # definition (the one for the earlier Spark conf was replaced): it runs nothing while it waits.
    standby = wait_for(lambda: ready_standby(root.parent / "root", 4), 240, "the warm standby of deployment 4")
    assert len(attempts(root, env)) == 2
    shown = json.loads(bundle(root, env, "summary", "-o", "json").stdout)["jobs"]["stream"]["standby"]
    assert shown["main"].startswith(f"ready (pid {standby}, ") and shown["main"].endswith(" MB)"), shown

    # SIGKILL the driver: the runner restarts the task from its checkpoint without anyone acting, in
    # the warm standby (its JVM and SparkSession already up).
    before = _ids(pg, unique_name)[-1][0]
    killed_at = time.monotonic()
    os.killpg(moved[-1]["pid"], signal.SIGKILL)
    wait_for(lambda: (r := _ids(pg, unique_name)) and r[-1][0] > before, 180, "rows after the restart")
    print(f"driver killed → next row: {time.monotonic() - killed_at:.1f}s")
    wait_for(lambda: (r := _ids(pg, unique_name)) and r[-1][0] > before + 200, 180, "rows after the restart")
    history = attempts(root, env)
    assert [a["state"] for a in history][:3] == ["redeployed", "failed", "running"], history
    assert history[2]["pid"] == standby and history[2]["deployment"] == 4
    assert "warm standby takes over" in Path(history[2]["log_path"]).read_text()
    assert _complete(_ids(pg, unique_name)), "ids missing across the driver kill"

    # A reconfigured source cannot resume from this checkpoint: refused, nothing changes.
    notebook.write_text(NOTEBOOK.format(rate=300, version="v2", table=unique_name))
    refused = bundle(root, env, "deploy")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == (
        "Error: job 'stream' task 'main': source 'orders' was reconfigured (rows_per_second: 200 → 300) since "
        "deployment 4; the checkpoint of application_id 'redeploy_check' records the old sources' offsets, so the "
        "new definition cannot resume from it — deploy it under a new application_id (in the notebook: %config "
        "StreamlingMagics.application_id = 'redeploy_check_v2'); it then reads its sources from their starting "
        "offsets")
    assert json.loads(bundle(root, env, "summary", "-o", "json").stdout)["deployment"]["version"] == 4

    # destroy stops the job and its standby, and no next run of the continuous job starts behind it
    destroyed = bundle(root, env, "destroy", "--auto-approve")
    assert destroyed.returncode == 0, destroyed.stderr
    wait_for(lambda: not _drivers_of(root.parent / "root"), 60, "every driver of the target to exit")
