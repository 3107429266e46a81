"""``bundle_jobs``: a notebook deployed with ``streamling bundle`` as a supervised job.

A temporary bundle holds one Databricks-source notebook (``generate`` → SQL projection →
``postgres`` sink upserting on ``id``) on a production target with its own ``root_path`` and
``config: {checkpoint_interval_sec: 1, spark: {master: …}}``, once on ``local[2]`` and once on the
standalone cluster of ``fixtures/services/up spark`` (client mode: the driver runs here, the
executors on the two one-core workers). Everything goes through the CLI as a user types it.

- **deploy → first row**: a ``continuous`` job (generate at 2,000 rows/s, unbounded). Seconds from
  starting ``streamling bundle deploy`` until Postgres shows the first row (polled every 0.1 s).
- **redeploy → first new row**: while that job runs, ``REDEPLOYS`` times a changed SQL (the total
  plus ``k × 1,000,000``, so the sink tells the new definition's rows apart) is deployed with
  ``streamling bundle deploy``; seconds from the CLI returning (and from its start) until Postgres
  shows a row of the new definition. The running driver swaps it in (same process, no JVM
  restart: checked, and recorded as ``same_driver``).
- **driver kill → new row**: the running attempt's process group (the driver and its JVM) is
  SIGKILLed; seconds until a row with an id above everything written before the kill appears,
  i.e. the runner noticed, started a new attempt at once (a first failure has no back-off),
  and that attempt resumed from the checkpoint. After ``bundle destroy`` (which lets the epoch
  in flight finish) the table must hold every id from 0 to its largest exactly once. Measured with
  the warm standby and without one (a cold driver); on the cluster also with a standby that keeps
  one warm executor (``job_runner.standby_executors: 1``, the job capped at the other cores with
  ``spark.cores.max``).
- **throughput**: the same notebook on a bounded source (200,000 rows, 20,000 per epoch) as a
  one-off job, ``streamling bundle run load``, on a target without pooled warm drivers; and once more
  with one (``warm_drivers: 1``): the runner starts that driver's JVM once the job has committed its
  first epoch, on the same cores, and the ratio of the two is what that start costs a short job.
  Next to them, the hand-written job of ``generate_sql_postgres`` (same ``generate`` source,
  ``foreachBatch`` collecting Arrow, CSV, ``COPY`` into a staging table, one upsert per batch) with
  the projection instead of the filter,
  run as its own process with a session from streamling's ``build_session`` on the same master
  (``python -m scenarios.bundle_jobs --handwritten …``). Rows/s is taken from Spark's checkpoint on
  both sides: source rows ÷ (mtime of the last ``commits/N`` − mtime of ``offsets/0``), i.e. the
  epochs themselves, without JVM start-up. The job's wall time (driver launched by the runner →
  its task returned, read from the driver's exit file; hand-written: process launched → job
  returned) is reported and compared too.

Continuous and throughput runs each get a fresh bundle root and a fresh table, destroyed and
dropped afterwards.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scenarios.common import (
    ROOT,
    VENV_BIN,
    Options,
    ScenarioResult,
    Side,
    bench_settings,
    interleaved,
    load_avg,
    log,
    paired_ratio,
    temp_dir,
)
from scenarios.generate_sql_postgres import SCHEMA, SERVICE_UP, _connect, ensure_postgres
from streamling.util import process_alive

NAME = "bundle_jobs"
PROJECTION = "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders"
RATE = 2000  # rows/s of the continuous job
DEFAULT_ROWS = 200_000  # the throughput job's bounded source
ROWS_PER_BATCH = 20_000
PARTITIONS = 2
#: two measured runs per target and measurement unless ``--runs`` is given: each run starts JVMs.
DEFAULT_RUNS = 2
#: streaming time between the first row and the kill, so that a few epochs are committed.
KILL_AFTER_SECS = 6.0
#: changed-SQL redeploys measured per continuous run (each one swapped in by the same warm driver)
REDEPLOYS = 3
#: streaming time between two redeploys: a few epochs of each definition
REDEPLOY_GAP_SECS = 3.0
#: the k-th redeployed definition adds k × this to ``total``: its rows are the ones at or above it
MARK = 1_000_000
WAIT_SECS = 300.0
POLL_SECS = 0.1
HANDWRITTEN_MARK = "BUNDLE_JOBS_RESULT "

NOTEBOOK = """\
# Databricks notebook source
# MAGIC %load_ext streamling

# COMMAND ----------

# MAGIC %config StreamlingMagics.application_id = '{app}'

# COMMAND ----------

# MAGIC %%streamling source orders
# MAGIC type: generate
# MAGIC {bound}
# MAGIC rows_per_batch: {rows_per_batch}
# MAGIC partitions: {partitions}
# MAGIC primary_key: id

# COMMAND ----------

# MAGIC %%streamling transform projected --from orders
# MAGIC {sql}

# COMMAND ----------

# MAGIC %%streamling sink out --from projected
# MAGIC type: postgres
# MAGIC schema: {schema}
# MAGIC table: {table}
"""


# --- services -------------------------------------------------------------------------------------


def _spark_cluster() -> tuple[dict[str, str], str | None]:
    """``fixtures/services/up spark``'s exports (it reuses a running cluster), or why not."""
    if not SERVICE_UP.exists():
        return {}, f"{SERVICE_UP.relative_to(ROOT)} is missing"
    proc = subprocess.run([str(SERVICE_UP), "spark"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        return {}, f"fixtures/services/up spark failed: {proc.stderr.strip()[-500:]}"
    exports: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        parts = shlex.split(line)
        if len(parts) == 2 and parts[0] == "export" and "=" in parts[1]:
            key, value = parts[1].split("=", 1)
            exports[key] = value
    if "STREAMLING_TEST_SPARK_MASTER" not in exports:
        return {}, "fixtures/services/up spark printed no STREAMLING_TEST_SPARK_MASTER"
    return exports, None


def _cluster_busy(ui: str | None) -> dict[str, Any]:
    """Applications and cores in use on the cluster before a run: another application holding the
    workers' cores makes ours wait for executors, which would show up as start-up time."""
    if not ui:
        return {}
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=5) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError):
        return {}
    return {"active_apps": len(doc.get("activeapps", [])), "cores_used": doc.get("coresused"),
            "alive_workers": doc.get("aliveworkers")}


def _cluster_cores(ui: str | None) -> int | None:
    """The cores of the cluster's live workers (its master's JSON), or None."""
    if not ui:
        return None
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=5) as resp:
            return int(json.loads(resp.read()).get("cores") or 0)
    except (OSError, ValueError):
        return None


# --- Postgres -------------------------------------------------------------------------------------


class Table:
    """One run's table: polled while the job runs, checked and dropped at the end."""

    def __init__(self, conninfo: str, name: str) -> None:
        self.conninfo = conninfo
        self.name = name
        self.qualified = f'{SCHEMA}."{name}"'
        self._conn: Any = None

    def _cursor(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = _connect(self.conninfo)
            self._conn.autocommit = True  # a failed poll (no table yet) must not leave a transaction open
        return self._conn.cursor()

    def _largest(self, column: str) -> Any:
        try:
            with self._cursor() as cur:
                cur.execute(f"SELECT max({column}) FROM {self.qualified}")
                row = cur.fetchone()
        except Exception:  # noqa: BLE001 - the table does not exist yet
            return None
        return None if row is None else row[0]

    def max_id(self) -> int | None:
        """The largest id written so far; None while the sink has not created the table or written."""
        value = self._largest("id")
        return None if value is None else int(value)

    def max_total(self) -> float | None:
        """The largest ``total`` so far: the k-th redeployed definition's rows are ≥ k × ``MARK``."""
        value = self._largest("total")
        return None if value is None else float(value)

    def check_and_drop(self) -> dict[str, int]:
        """Rows, smallest and largest id, and how many ids of 0..max are missing; then drop it."""
        out = {"table_rows": 0, "min_id": -1, "max_id": -1, "missing_ids": 0}
        with self._cursor() as cur:
            try:
                cur.execute(f"SELECT count(*), min(id), max(id) FROM {self.qualified}")
                count, low, high = cur.fetchone()
                if count:
                    out = {"table_rows": int(count), "min_id": int(low), "max_id": int(high),
                           "missing_ids": int(high) + 1 - int(count)}
            except Exception:  # noqa: BLE001 - never created: nothing was written
                pass
            cur.execute(f"DROP TABLE IF EXISTS {self.qualified}")
        return out

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _poll(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(POLL_SECS)
    raise TimeoutError(f"no {what} after {timeout:.0f}s")


# --- the bundle -----------------------------------------------------------------------------------


class Bundle:
    """A temporary bundle with one notebook job on one production target, driven through the CLI."""

    def __init__(self, workdir: Path, master: str, table: str, *, continuous: bool, rows: int,
                 standby: bool = True, keep: tuple[int, int] | None = None) -> None:
        """``standby`` also sets ``warm_drivers``: one pooled warm driver with, none without. ``keep``:
        (executors the standby keeps warm, ``spark.cores.max`` that leaves them free)."""
        import yaml

        self.dir = workdir / "bundle"
        self.root = workdir / "root"
        self.job = "stream" if continuous else "load"
        self.app = f"bench_{self.job}_{uuid.uuid4().hex[:8]}"
        (self.dir / "notebooks").mkdir(parents=True)
        bound = f"rows_per_second: {RATE}" if continuous else f"rows: {rows}"
        self._notebook = functools.partial(NOTEBOOK.format, app=self.app, bound=bound,
                                           rows_per_batch=min(ROWS_PER_BATCH, rows), partitions=PARTITIONS,
                                           schema=SCHEMA, table=table)
        self.write_notebook(PROJECTION)
        # No min_retry_interval_millis: a continuous job's first failure restarts at once by default.
        job: dict[str, Any] = {"tasks": [{"task_key": "main",
                                          "notebook_task": {"notebook_path": f"./notebooks/{self.job}.py"}}]}
        if continuous:
            job = {"continuous": {}, **job}
        doc = {"bundle": {"name": "bench_bundle_jobs"},
               "resources": {"jobs": {self.job: job}},
               "targets": {"bench": {"default": True, "mode": "production",
                                     "workspace": {"root_path": str(self.root)},
                                     "config": {"checkpoint_interval_sec": 1, "spark": {"master": master},
                                                "job_runner": {"standby": standby,
                                                               "warm_drivers": 1 if standby else 0}}}}}
        if keep is not None:
            config = doc["targets"]["bench"]["config"]
            config["spark"]["conf"] = {"spark.cores.max": str(keep[1])}
            config["job_runner"]["standby_executors"] = keep[0]
        self._doc = doc
        (self.dir / "bundle.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
        # The user's environment (Postgres exports, STREAMLING_CACHE_DIR); no stray bundle variables.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("BUNDLE_VAR_") and k != "STREAMLING_BUNDLE_ROOT"}

    def add_job(self, key: str, table: str) -> None:
        """A second continuous job writing ``table`` (the next ``deploy`` ships it)."""
        import yaml

        notebook = NOTEBOOK.format(app=f"bench_{key}_{uuid.uuid4().hex[:8]}", bound=f"rows_per_second: {RATE}",
                                   rows_per_batch=ROWS_PER_BATCH, partitions=PARTITIONS, schema=SCHEMA, table=table,
                                   sql=PROJECTION)
        (self.dir / "notebooks" / f"{key}.py").write_text(notebook)
        self._doc["resources"]["jobs"][key] = {"continuous": {}, "tasks": [{
            "task_key": "main", "notebook_task": {"notebook_path": f"./notebooks/{key}.py"}}]}
        (self.dir / "bundle.yml").write_text(yaml.safe_dump(self._doc, sort_keys=False))

    def write_notebook(self, sql: str) -> None:
        """The notebook with ``sql`` as its transform (the next ``deploy`` ships it)."""
        (self.dir / "notebooks" / f"{self.job}.py").write_text(self._notebook(sql=sql))

    def cli(self, *args: str, timeout: float = WAIT_SECS) -> subprocess.CompletedProcess[str]:
        exe = VENV_BIN / "streamling"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "streamling.cli"]
        return subprocess.run([*cmd, "bundle", *args], cwd=self.dir, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def must(self, *args: str, timeout: float = WAIT_SECS) -> subprocess.CompletedProcess[str]:
        proc = self.cli(*args, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"streamling bundle {' '.join(args)} exited {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        return proc

    def attempts(self) -> list[dict[str, Any]]:
        """Every attempt of every run, oldest first (``bundle runs -o json``)."""
        runs = json.loads(self.must("runs", "-o", "json").stdout)
        return [a for run in reversed(runs) for a in run["attempts"]]

    def checkpoint(self) -> Path | None:
        found = sorted(self.root.glob(f"state/{self.app}/*/checkpoint"))
        return found[0] if found else None

    def destroy(self) -> float:
        """``bundle destroy --auto-approve`` (cancels runs after their epoch); returns its seconds.
        A driver still alive afterwards (it should not be) is killed by its pid."""
        pids = []
        try:
            pids = [int(a["pid"]) for a in self.attempts() if a.get("pid")]
        except Exception:  # noqa: BLE001 - nothing deployed yet
            pass
        t0 = time.monotonic()
        proc = self.cli("destroy", "--auto-approve", timeout=180)
        took = time.monotonic() - t0
        if proc.returncode != 0:
            log(f"    destroy exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        for pid in pids:
            if process_alive(pid):
                log(f"    driver {pid} outlived destroy; killing its process group")
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        return took


def checkpoint_times(checkpoint: Path | None) -> dict[str, Any]:
    """When Spark wrote ``offsets/0``, the first and the last ``commits/N`` (file mtimes)."""
    if checkpoint is None:
        return {}

    def numbered(folder: Path) -> list[Path]:
        files = [p for p in folder.glob("*") if p.name.isdigit()] if folder.is_dir() else []
        return sorted(files, key=lambda p: int(p.name))

    offsets, commits = numbered(checkpoint / "offsets"), numbered(checkpoint / "commits")
    if not offsets or not commits:
        return {}
    return {"first_offset": offsets[0].stat().st_mtime, "first_commit": commits[0].stat().st_mtime,
            "last_commit": commits[-1].stat().st_mtime, "epochs": len(commits)}


# --- one run of each measurement ------------------------------------------------------------------


def _reached(table: Table, mark: int) -> bool:
    return (table.max_total() or 0) >= mark


def redeploys(bundle: Bundle, table: Table) -> list[dict[str, Any]]:
    """``REDEPLOYS`` changed SQLs, each deployed while the job runs: deploy → first row of the new definition."""
    out: list[dict[str, Any]] = []
    [driver] = [a for a in bundle.attempts() if a["state"] == "running"]
    for k in range(1, REDEPLOYS + 1):
        time.sleep(REDEPLOY_GAP_SECS)
        bundle.write_notebook(PROJECTION.replace("AS total", f"+ {k * MARK} AS total"))
        t0 = time.time()
        bundle.must("deploy")
        returned = time.time()
        _poll(functools.partial(_reached, table, k * MARK), WAIT_SECS, f"row of redeployed definition {k}")
        first = time.time()
        running = [a for a in bundle.attempts() if a["state"] == "running"]
        out.append({"cli_s": returned - t0, "first_new_row_s": first - returned, "from_deploy_start_s": first - t0,
                    "same_driver": [a["pid"] for a in running] == [driver["pid"]],
                    "load": load_avg()[0]})
        log(f"    redeploy {k}: deploy CLI {returned - t0:.1f}s, then first new row after {first - returned:.1f}s"
            f"{'' if out[-1]['same_driver'] else ' (the driver was restarted)'}")
    return out


def kill_and_recover(bundle: Bundle, table: Table, standby: bool) -> dict[str, Any]:
    """SIGKILL the running driver's process group; seconds until a row above everything written before
    (with ``standby``, once the task's warm standby driver is ready)."""
    out: dict[str, Any] = {}
    time.sleep(KILL_AFTER_SECS)
    if standby:
        ready = _poll(functools.partial(_ready_standby, bundle.root), WAIT_SECS, "the warm standby")
        from streamling.bundle.warm_drivers import group_rss_mb

        out["standby_rss_mb"] = group_rss_mb(ready)
    [running] = [a for a in bundle.attempts() if a["state"] == "running"]
    killed = time.time()
    os.killpg(int(running["pid"]), signal.SIGKILL)
    time.sleep(0.5)  # a commit the dead driver had already sent is visible by now
    before = table.max_id() or 0
    out["max_id_at_kill"] = before
    _poll(lambda: (table.max_id() or 0) > before, WAIT_SECS, "new row after the driver kill")
    out["recovery_s"] = time.time() - killed
    new = [a for a in bundle.attempts() if a["state"] == "running" and a["pid"] != running["pid"]]
    if new:
        out["restart_launched_s"] = float(new[-1]["started_at"]) - killed
    return out


def deploy_new_job(bundle: Bundle, table: Table, pooled: bool) -> dict[str, Any]:
    """A second continuous job, writing ``table``, deployed while the first runs: deploy → its first
    row in Postgres, started in the pooled warm driver (once it is ready) when ``pooled``, else in a
    cold driver."""
    if pooled:
        _poll(functools.partial(_ready_standby, bundle.root, True), WAIT_SECS, "the pooled warm driver")
    bundle.add_job("second", table.name)
    t0 = time.time()
    bundle.must("deploy")
    _poll(lambda: table.max_id() is not None, WAIT_SECS, "the new job's first row")
    first = time.time() - t0
    log(f"    new job deployed → first row {first:.1f}s ({'pooled warm driver' if pooled else 'cold driver'})")
    return {"new_job_first_row_s": first}


def _ready_standby(root: Path, pooled: bool = False) -> int | None:
    """The pid of the warm standby that is ready for the live deployment (or, ``pooled``, of a ready
    pooled warm driver: it is warmed for the target's settings, whichever deployment started it)."""
    version = (root / "current").read_text().strip()
    for ready in (root / "logs" / "standby").glob("*.go.ready"):
        if ready.name.startswith("_pool.") != pooled:
            continue
        try:
            text = ready.with_name(ready.name.replace(".go.ready", ".log")).read_text()
            if (pooled and " ready in " in text and process_alive(int(ready.read_text()))) or \
                    f"(deployment {version}) ready in" in text:
                return int(ready.read_text())
        except (OSError, ValueError):
            continue
    return None


def continuous_run(master: str, conninfo: str, cluster_ui: str | None, kill: bool = True,
                   standby: bool = True, keep: tuple[int, int] | None = None) -> dict[str, Any]:
    """deploy → first row; redeploys → first new rows; SIGKILL the driver → first row of the new
    attempt (unless ``kill`` is False; in the warm standby unless ``standby`` is False, keeping
    warm executors with ``keep``, see ``Bundle``); destroy; check the ids."""
    table, second = Table(conninfo, f"bj_{uuid.uuid4().hex[:10]}"), Table(conninfo, f"bj_{uuid.uuid4().hex[:10]}")
    out: dict[str, Any] = {"cluster": _cluster_busy(cluster_ui)} if cluster_ui else {}
    with tempfile.TemporaryDirectory(prefix="streamling-bench-bundle-") as tmp:
        bundle = Bundle(Path(tmp), master, table.name, continuous=True, rows=ROWS_PER_BATCH, standby=standby,
                        keep=keep)
        try:
            t0 = time.time()
            bundle.must("deploy")
            out["deploy_cli_s"] = time.time() - t0
            _poll(lambda: table.max_id() is not None, WAIT_SECS, "row in Postgres after deploy")
            first_row = time.time()
            out["first_row_s"] = first_row - t0
            [attempt] = [a for a in bundle.attempts() if a["state"] == "running"]
            out["driver_launched_s"] = float(attempt["started_at"]) - t0
            out["driver_to_first_row_s"] = first_row - float(attempt["started_at"])
            out["redeploys"] = redeploys(bundle, table)
            if kill:
                out.update(kill_and_recover(bundle, table, standby))
            if master.startswith("local"):
                # On a standalone cluster the running job's application holds every core
                # (spark.cores.max unset): a second one would get no executor until it ends.
                out.update(deploy_new_job(bundle, second, standby))
            out["attempt_states"] = [a["state"] for a in bundle.attempts()]
            time.sleep(2.0)  # a few epochs of the running attempt before the stop
        finally:
            out["destroy_s"] = bundle.destroy()
            out.update(table.check_and_drop())
            out["new_job_missing_ids"] = second.check_and_drop()["missing_ids"]
            table.close()
            second.close()
    log(f"    ids 0..{out['max_id']}: {out['table_rows']:,} rows, {out['missing_ids']} missing; "
        f"attempts {out.get('attempt_states')}")
    return out


def bundle_run(master: str, conninfo: str, rows: int, cluster_ui: str | None, pooled: bool = False) -> dict[str, Any]:
    """``bundle run load`` of the bounded job on a fresh root; times from the runner's store,
    the driver's exit file and the checkpoint. ``pooled``: the target keeps a pooled warm driver
    (``warm_drivers: 1``), which the runner starts once the job has committed its first epoch."""
    table = Table(conninfo, f"bj_{uuid.uuid4().hex[:10]}")
    out: dict[str, Any] = {"cluster": _cluster_busy(cluster_ui)} if cluster_ui else {}
    with tempfile.TemporaryDirectory(prefix="streamling-bench-bundle-") as tmp:
        bundle = Bundle(Path(tmp), master, table.name, continuous=False, rows=rows, standby=pooled)
        try:
            bundle.must("deploy")
            t0 = time.time()
            bundle.must("run", bundle.job, timeout=WAIT_SECS * 2)
            out["run_cli_s"] = time.time() - t0
            [attempt] = bundle.attempts()
            started = float(attempt["started_at"])
            exit_file = Path(f"{attempt['log_path']}.exit")
            out["launch_s"] = started - t0
            out["job_s"] = exit_file.stat().st_mtime - started
            out["driver_exit_s"] = float(attempt["ended_at"]) - started  # the runner's tick: +0..0.5 s
            out.update(_stream_figures(checkpoint_times(bundle.checkpoint()), started, rows))
        finally:
            bundle.destroy()
            out.update(table.check_and_drop())
            table.close()
    return out


def handwritten_run(master: str, conninfo: str, rows: int, cluster_ui: str | None) -> dict[str, Any]:
    """The hand-written job as its own process on the same master (see ``_handwritten_main``)."""
    table = Table(conninfo, f"hw_{uuid.uuid4().hex[:10]}")
    out: dict[str, Any] = {"cluster": _cluster_busy(cluster_ui)} if cluster_ui else {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"),
                                                                      os.environ.get("PYTHONPATH")]))}
    with temp_dir("bundle-hw") as workdir:
        cmd = [sys.executable, "-m", "scenarios.bundle_jobs", "--handwritten", "--master", master,
               "--table", table.name, "--rows", str(rows), "--workdir", str(workdir)]
        try:
            started = time.time()
            proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=WAIT_SECS * 2)
            out["process_s"] = time.time() - started
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(HANDWRITTEN_MARK)]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"hand-written job exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
            child = json.loads(lines[-1][len(HANDWRITTEN_MARK):])
            out["job_s"] = float(child["t_end"]) - started
            out["query_wall_s"] = child["wall_s"]
            out.update(_stream_figures(checkpoint_times(workdir / "checkpoint"), started, rows))
        finally:
            out.update(table.check_and_drop())
            table.close()
    return out


def _stream_figures(times: dict[str, Any], started: float, rows: int) -> dict[str, Any]:
    if not times:
        return {}
    stream_s = times["last_commit"] - times["first_offset"]
    # After the first epoch: that one also pays for the query's first Python workers and the sink's
    # connection and table, once per process.
    steady_s = times["last_commit"] - times["first_commit"]
    steady_rows = rows - min(ROWS_PER_BATCH, rows)
    return {"stream_s": stream_s, "rows_per_s": rows / stream_s if stream_s > 0 else float("nan"),
            "steady_s": steady_s, "steady_rows_per_s": steady_rows / steady_s if steady_s > 0 else float("nan"),
            "first_epoch_s": times["first_commit"] - times["first_offset"],
            "first_commit_s": times["first_commit"] - started, "epochs": times["epochs"]}


def _handwritten_main(argv: Sequence[str]) -> int:
    """Child process: ``generate_sql_postgres``'s hand-written upsert job with this scenario's
    projection, on a session from streamling's ``build_session`` (same conf as the job's driver)."""
    p = argparse.ArgumentParser()
    p.add_argument("--handwritten", action="store_true")
    p.add_argument("--master", required=True)
    p.add_argument("--table", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--workdir", required=True)
    args = p.parse_args(argv)

    from scenarios import generate_sql_postgres as pg_scenario
    from scenarios.inprocess import run_handwritten
    from streamling.runtime.session import build_session

    # HandwrittenUpsert runs its module's SQL on each batch: here, the notebook's projection.
    pg_scenario.SQL = PROJECTION
    workdir = Path(args.workdir)
    settings = bench_settings(workdir, "bench_bundle_handwritten", spark={"master": args.master})
    spark = build_session(settings, app_name="streamling-bench-handwritten")
    upsert = pg_scenario.HandwrittenUpsert(settings.postgres_connection_for("out").conninfo(),
                                           f'{SCHEMA}."{args.table}"')
    source = {"rows": args.rows, "rows_per_batch": min(ROWS_PER_BATCH, args.rows), "partitions": PARTITIONS,
              "profile": "orders"}
    try:
        result = run_handwritten(spark, source, upsert, workdir, args.rows)
    finally:
        upsert.close()
    t_end = time.time()
    print(HANDWRITTEN_MARK + json.dumps({"t_end": t_end, "wall_s": result["wall_s"], "epochs": result["epochs"]}),
          flush=True)
    return 0


# --- the scenario ---------------------------------------------------------------------------------


def runs_wanted(opts: Options) -> int:
    """``--runs`` when given on the command line, else two (every run starts JVMs)."""
    given = any(a == "--runs" or a.startswith("--runs=") for a in sys.argv[1:])
    return opts.runs if given else DEFAULT_RUNS


def _measured(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    before = load_avg()[0]
    out = fn()
    out["load_before"] = before
    out["load_after"] = load_avg()[0]
    return out


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    runs = runs_wanted(opts)
    params: dict[str, Any] = {"rows": rows, "rows_per_batch": min(ROWS_PER_BATCH, rows), "partitions": PARTITIONS,
                              "rate": RATE, "sql": PROJECTION, "runs_wanted": runs,
                              "kill_after_first_row_s": KILL_AFTER_SECS, "redeploys_per_run": REDEPLOYS}
    reason = ensure_postgres()
    if reason:
        return ScenarioResult(NAME, params, {}, skipped=reason)
    with temp_dir("bundle-settings") as workdir:
        connection = bench_settings(workdir, "bench_bundle").postgres_connection_for("out")
    conninfo = connection.conninfo()
    params["postgres"] = connection.describe()
    cluster, why_not = _spark_cluster()
    targets: dict[str, tuple[str, str | None]] = {"local": ("local[2]", None)}
    notes: list[str] = []
    if cluster:
        targets["cluster"] = (cluster["STREAMLING_TEST_SPARK_MASTER"], cluster.get("STREAMLING_TEST_SPARK_MASTER_UI"))
    else:
        notes.append(f"cluster target skipped: {why_not}")
    params["masters"] = {name: master for name, (master, _) in targets.items()}

    sides: dict[str, Side] = {}
    for name, (master, ui) in targets.items():
        log(f"{NAME} [{name}, {master}]: throughput, {rows:,} rows, {runs} runs after a warm-up per side")
        pair = {f"{name}_{side}": Side(f"{name}_{side}") for side in ("bundle_run", "handwritten", "bundle_run_pooled")}
        interleaved(runs, {f"{name}_bundle_run": functools.partial(bundle_run, master, conninfo, rows, ui),
                           f"{name}_handwritten": functools.partial(handwritten_run, master, conninfo, rows, ui),
                           f"{name}_bundle_run_pooled": functools.partial(bundle_run, master, conninfo, rows, ui,
                                                                          pooled=True)},
                    pair, log)
        sides.update(pair)
        log(f"{NAME} [{name}]: continuous job at {RATE} rows/s, {runs} runs (deploy, kill the driver, destroy)")
        variants = {"warm standby": (f"{name}_continuous", {"standby": True}),
                    "no standby": (f"{name}_continuous_cold", {"standby": False})}
        cores = _cluster_cores(ui)
        if cores is not None and cores > 1:  # one core for the standby's warm executor, the rest the job's
            variants["standby keeping a warm executor"] = (f"{name}_continuous_kept",
                                                            {"standby": True, "keep": (1, cores - 1)})
        for i in range(runs):
            for label, (side_name, options) in variants.items():  # paired, in this order
                result = _measured(functools.partial(continuous_run, master, conninfo, ui, **options))
                sides.setdefault(side_name, Side(side_name)).runs.append(result)
                log(f"  run {i + 1}/{runs} ({label}): deploy → first row {result['first_row_s']:.1f}s, "
                    f"driver kill → new row {result['recovery_s']:.1f}s")
    return summarize(params, sides, notes)


def redeploy_figures(side: Side) -> dict[str, tuple[float, str]]:
    """Median and spread of every redeploy of every continuous run of ``side``."""
    swaps = [r for run in side.runs for r in run.get("redeploys", [])]
    if not swaps:
        return {}
    waits = [r["first_new_row_s"] for r in swaps]
    return {"redeploy: deploy returned → first new row": (statistics.median(waits), "s"),
            "  fastest": (min(waits), "s"), "  slowest": (max(waits), "s"),
            "  redeploys measured": (float(len(swaps)), "count"),
            "  of which swapped in the same driver": (float(sum(bool(r["same_driver"]) for r in swaps)), "count"),
            "redeploy: deploy CLI": (statistics.median(r["cli_s"] for r in swaps), "s"),
            "redeploy: deploy started → first new row": (statistics.median(r["from_deploy_start_s"] for r in swaps),
                                                          "s")}


def summarize(params: dict[str, Any], sides: dict[str, Side], notes: list[str]) -> ScenarioResult:
    result = ScenarioResult(NAME, params, sides, notes=notes)
    for name in ("local", "cluster"):
        if f"{name}_continuous" not in sides:
            continue
        cont, job, hw = sides[f"{name}_continuous"], sides[f"{name}_bundle_run"], sides[f"{name}_handwritten"]
        figures = {
            "deploy → first row in Postgres": (cont.median("first_row_s"), "s"),
            "  of which deploy CLI": (cont.median("deploy_cli_s"), "s"),
            "  runner launched the driver after": (cont.median("driver_launched_s"), "s"),
            "driver SIGKILL → new row (warm standby)": (cont.median("recovery_s"), "s"),
            "  new attempt launched after": (cont.median("restart_launched_s"), "s"),
            "driver SIGKILL → new row (no standby: cold driver)": (sides[f"{name}_continuous_cold"].median(
                "recovery_s"), "s"),
            **({"driver SIGKILL → new row (standby keeping a warm executor)": (sides[f"{name}_continuous_kept"].median(
                "recovery_s"), "s")} if f"{name}_continuous_kept" in sides else {}),
            "standby: driver memory (RSS of the idle driver and its JVM)": (cont.median("standby_rss_mb"), "MB"),
            "new job deployed beside it → its first row (pooled warm driver)": (cont.median("new_job_first_row_s"),
                                                                                  "s"),
            "new job deployed beside it → its first row (cold driver)": (
                sides[f"{name}_continuous_cold"].median("new_job_first_row_s"), "s"),
            "ids missing after kill + destroy (all runs)": (float(sum(r["missing_ids"] for r in cont.runs)), "ids"),
            "bundle run: epochs rows/s": (job.median("rows_per_s"), "rows/s"),
            "hand-written: epochs rows/s": (hw.median("rows_per_s"), "rows/s"),
            "bundle run: rows/s after the 1st epoch": (job.median("steady_rows_per_s"), "rows/s"),
            "hand-written: rows/s after the 1st epoch": (hw.median("steady_rows_per_s"), "rows/s"),
            "bundle run, a pooled warm driver starting beside it: rows/s after the 1st epoch": (
                sides[f"{name}_bundle_run_pooled"].median("steady_rows_per_s"), "rows/s"),
            "bundle run: 1st epoch": (job.median("first_epoch_s"), "s"),
            "hand-written: 1st epoch": (hw.median("first_epoch_s"), "s"),
            "bundle run: driver launch → job done": (job.median("job_s"), "s"),
            "hand-written: process launch → job done": (hw.median("job_s"), "s"),
            "bundle run: CLI wall (run → succeeded)": (job.median("run_cli_s"), "s"),
            "bundle run: driver launch → first commit": (job.median("first_commit_s"), "s"),
            "hand-written: launch → first commit": (hw.median("first_commit_s"), "s"),
        }
        result.figures.update({f"{name}: {k}": v for k, v in figures.items()})
        result.figures.update({f"{name}: {k}": v for k, v in redeploy_figures(cont).items()})
        result.ratios[f"{name} epochs rows/s"] = paired_ratio(job, hw, "rows_per_s")
        result.ratios[f"{name} rows/s after 1st epoch"] = paired_ratio(job, hw, "steady_rows_per_s")
        result.ratios[f"{name} job wall"] = paired_ratio(job, hw, "job_s", higher_is_better=False)
        # what a pooled warm driver's start costs a short job on the same cores (once per deploy)
        result.ratios[f"{name} rows/s after 1st epoch, pooled driver starting beside the job vs not"] = paired_ratio(
            sides[f"{name}_bundle_run_pooled"], job, "steady_rows_per_s")
        for side in (job, hw):
            wrong = sorted({r["table_rows"] for r in side.runs if r["table_rows"] != params["rows"]})
            if wrong:
                result.notes.append(f"{side.name}: tables held {wrong} rows, not {params['rows']:,}")
        busy = [r["cluster"] for s in (cont, job, hw) for r in s.runs if r.get("cluster", {}).get("active_apps")]
        if busy:
            result.notes.append(f"{name}: {len(busy)} runs started while another application used the cluster")
        loads = [r[k] for s in (cont, job, hw) for r in s.runs for k in ("load_before", "load_after")]
        if loads:
            result.notes.append(f"{name}: 1-min load {min(loads):.1f}–{max(loads):.1f} during the measured runs "
                                f"(median {statistics.median(loads):.1f})")
    return result


if __name__ == "__main__":
    if "--handwritten" in sys.argv[1:]:
        sys.exit(_handwritten_main(sys.argv[1:]))
    sys.exit(textwrap.dedent("""\
        usage: python -m scenarios.bundle_jobs --handwritten … (the hand-written job's process);
        run the scenario with: python bench/run.py bundle_jobs"""))
