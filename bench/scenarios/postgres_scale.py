"""``postgres_scale``: does the ``postgres`` sink scale with the cluster, and what does an epoch
cost the driver's memory?

generate → the blackhole scenario's SQL → ``postgres`` (primary-key upserts, ``parallelism: 2``),
run as the CLI in its own process, so each run starts with a fresh driver whose memory can be read:
the peak RSS (``VmHWM`` in ``/proc``) of the driver's Python process plus its JVM (Spark's Python
workers and, on a cluster, the executors are not the driver). Two epoch sizes: 10,000 rows (10
epochs) and 1,000,000 rows (2 epochs). Two targets: ``local[2]`` and the 2-worker standalone
cluster of ``fixtures/services/up spark`` (client mode: the driver runs here). Two ways to write,
both of this tree: ``executors`` (``parallelism: 2``: partition writers in Spark tasks) and
``driver`` (no ``parallelism``: the epoch collected on the driver and written by it); the cluster's
executors get the code through ``spark.executorEnv.PYTHONPATH``.

Rows/s counts from the start of the first epoch (its end less its duration, both from the CLI's
log) to the last epoch's commit, so JVM start-up is not in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from scenarios.common import ROOT, Options, ScenarioResult, Side, ensure_services, log, temp_dir
from scenarios.generate_sql_blackhole import SQL
from scenarios.generate_sql_postgres import SCHEMA, _drop, ensure_postgres
from scenarios.inprocess import generate_yaml

NAME = "postgres_scale"
EPOCHS = {"10k": (10_000, 100_000), "1M": (1_000_000, 2_000_000)}  # rows per epoch, rows per run
PARALLELISM = 2
_FLUSHED = re.compile(r"epoch (\d+) flushed .* in (\d+) ms")
_FINALIZED = re.compile(r"epoch (\d+) finalized")


def _peak_rss_kb(pid: int) -> int:
    """VmHWM of ``pid`` and of its direct children (the JVM pyspark launches), in kB."""
    total = 0
    pids = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        match = re.search(r"VmHWM:\s+(\d+) kB", status)
        cmd = Path(f"/proc/{p}/cmdline").read_bytes() if Path(f"/proc/{p}/cmdline").exists() else b""
        if match and (p == pid or b"java" in cmd):
            total += int(match.group(1))
    return total


def one_run(writers: dict[str, Any], master: str, per_epoch: int, rows: int, conninfo: str) -> dict[str, Any]:
    """One CLI run: rows/s, epochs and the driver's peak RSS; the table is checked and dropped."""
    table = f"scale_{uuid.uuid4().hex[:10]}"
    code = ROOT / "src"
    source = {"rows": rows, "rows_per_batch": per_epoch, "partitions": 2, "profile": "orders"}
    sink = {"type": "postgres", "schema": SCHEMA, "table": table, **writers}
    with temp_dir("pg-scale") as workdir:
        (workdir / "pipeline.yaml").write_text(generate_yaml(source, SQL, sink))
        (workdir / "config.yaml").write_text(
            "spark:\n"
            f"  master: \"{master}\"\n"
            "  conf:\n"
            f"    spark.executorEnv.PYTHONPATH: \"{code}\"\n"
            "    spark.cores.max: \"2\"\n"
            f"state_dir: \"{workdir / 'state'}\"\n")
        env = {**os.environ, "PYTHONPATH": str(code)}
        proc = subprocess.Popen([sys.executable, "-m", "streamling.cli", "pipeline.yaml"], cwd=workdir, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines: list[tuple[float, str]] = []
        peak = [0]

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.monotonic(), line))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while proc.poll() is None:
            peak[0] = max(peak[0], _peak_rss_kb(proc.pid))
            time.sleep(0.2)
        reader.join(timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{master} run failed ({proc.returncode}):\n" + "".join(x for _, x in lines[-30:]))
    starts = [t - int(m.group(2)) / 1000 for t, x in lines if (m := _FLUSHED.search(x))]
    ends = [t for t, x in lines if _FINALIZED.search(x)]
    wall = max(ends) - min(starts)
    return {"rows_per_s": rows / wall, "wall_s": wall, "epochs": len(ends), "driver_peak_rss_mb": peak[0] / 1024,
            "table_rows": _drop(conninfo, f"{SCHEMA}.{table}")}


def run(opts: Options) -> ScenarioResult:
    params: dict[str, Any] = {"epochs": EPOCHS, "parallelism": PARALLELISM, "sql": SQL}
    reason = ensure_postgres()
    if reason:
        return ScenarioResult(NAME, params, {}, skipped=reason)
    from scenarios.common import bench_settings

    with temp_dir("pg-settings") as workdir:
        conninfo = bench_settings(workdir, "bench_pg").postgres_connection_for("out").conninfo()
    targets = {"local": "local[2]"}
    why_not = ensure_services("spark", present=("STREAMLING_TEST_SPARK_MASTER",))
    if why_not is None and os.environ.get("STREAMLING_TEST_SPARK_MASTER"):
        targets["cluster"] = os.environ["STREAMLING_TEST_SPARK_MASTER"]
    notes = [] if "cluster" in targets else [f"cluster skipped: {why_not}"]
    sides: dict[str, Side] = {}
    figures: dict[str, tuple[float, str]] = {}
    modes: dict[str, dict[str, Any]] = {"executors": {"parallelism": PARALLELISM}, "driver": {}}
    for target, master in targets.items():
        for code_name, writers in modes.items():
            for size, (per_epoch, rows) in EPOCHS.items():
                key = f"{target}_{code_name}_{size}"
                side = sides[key] = Side(key)
                for i in range(opts.runs):
                    log(f"{NAME}: {key} run {i + 1}/{opts.runs} ({rows:,} rows, {per_epoch:,} per epoch)")
                    before = os.getloadavg()[0]
                    out = one_run(writers, master, per_epoch, rows, conninfo)
                    out["load_before"], out["load_after"] = round(before, 2), round(os.getloadavg()[0], 2)
                    side.runs.append(out)
                    log(f"  {out['rows_per_s']:,.0f} rows/s, driver peak RSS {out['driver_peak_rss_mb']:.0f} MB, "
                        f"load {out['load_before']} -> {out['load_after']}")
                best = max(side.runs, key=lambda r: r["rows_per_s"])
                figures[f"{key} rows/s"] = (best["rows_per_s"], "rows/s")
                figures[f"{key} driver peak RSS"] = (max(r["driver_peak_rss_mb"] for r in side.runs), "MB")
    params["targets"] = targets
    counts = {size: {r["table_rows"] for k, s in sides.items() if k.endswith(size) for r in s.runs} for size in EPOCHS}
    notes += [f"{size}: the runs left different row counts: {sorted(c)}" for size, c in counts.items() if len(c) > 1]
    return ScenarioResult(NAME, params, sides, figures=figures, notes=notes)
