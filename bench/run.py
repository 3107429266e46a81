"""Benchmark harness: ``python bench/run.py [scenario…] [--runs N] [--rows N] [--profile]``.

Every scenario compares a streamling pipeline with the hand-written PySpark job doing the same
work on the same Spark settings, prints a table and writes ``bench/results/<scenario>.json``
with the machine facts needed to judge the figures (cores, load, versions, git commit).
Performance claims live here, not as timed assertions in the test suite: a 2-core box shared
with other jobs makes wall-clock thresholds flaky, whereas a ratio next to its load is readable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios.common import (  # noqa: E402 - the scenarios package sits next to this script
    RESULTS_DIR,
    Options,
    ScenarioResult,
    ensure_cache_dir,
    load_avg,
    log,
    machine_facts,
)

SCENARIOS = ("cold_start", "generate_sql_blackhole", "generate_sql_postgres", "kafka_avro", "bundle_jobs",
             "bundle_redeploy", "gs_functions", "clickhouse_sink", "clickhouse_source", "postgres_aggregate",
             "kafka_clickhouse", "plugins", "telemetry", "latency", "postgres_scale", "multihost", "cluster_jars",
             "runner_takeover", "notebook_cold", "runner_overhead")


def _runner(name: str) -> Callable[[Options], ScenarioResult]:
    """Scenarios are imported on demand: ``cold_start`` alone never needs the in-process session."""
    module = importlib.import_module(f"scenarios.{name}")
    return module.run  # type: ignore[no-any-return]


def _fmt(value: float, unit: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if unit == "rows/s":
        return f"{value:,.0f} rows/s"
    return f"{value:.3f} {unit}"


def print_table(result: ScenarioResult, load: tuple[float, float, float]) -> None:
    print(f"\n== {result.scenario}  (load avg before {load[0]}, after {result.params.get('load_after')})")
    if result.skipped:
        print(f"   skipped: {result.skipped}")
        return
    width = max((len(k) for k in [*result.figures, *result.ratios]), default=10) + 2
    for key, (value, unit) in result.figures.items():
        print(f"   {key:<{width}} {_fmt(value, unit)}")
    for key, value in result.ratios.items():
        flag = "" if math.isnan(value) or value >= 0.9 else "   (below the 0.9 goal)"
        print(f"   ratio {key:<{width - 6}} {value:.3f}{flag}")
    for note in result.notes:
        print(f"   note: {note}")
    sys.stdout.flush()


def wait_for_load(limit: float, timeout_secs: float) -> None:
    """On a shared machine a neighbour's test run can double every figure; waiting is cheaper
    than re-running. Gives up (and says so) after ``timeout_secs``: the load is in the JSON anyway."""
    deadline = time.monotonic() + timeout_secs
    while load_avg()[0] >= limit:
        if time.monotonic() > deadline:
            log(f"load still {load_avg()[0]} after {timeout_secs:.0f}s; measuring anyway")
            return
        time.sleep(10)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("scenarios", nargs="*", metavar="scenario", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--runs", type=int, default=3, help="measured runs per side after one warm-up (median)")
    p.add_argument("--rows", type=int, default=None, help="source rows (default: per scenario)")
    p.add_argument("--profile", action="store_true",
                   help="cold_start: one more run of each driver under cProfile (in-process runs time phases anyway)")
    p.add_argument("--max-load", type=float, default=None,
                   help="before each scenario, wait (up to 15 min) for the 1-minute load average to drop below this")
    args = p.parse_args(argv)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    ensure_cache_dir()
    opts = Options(runs=max(1, args.runs), rows=args.rows, profile=args.profile)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.scenarios or SCENARIOS:
        if args.max_load is not None:
            wait_for_load(args.max_load, timeout_secs=900)
        load = load_avg()
        started = time.monotonic()
        try:
            result = _runner(name)(opts)
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others' figures
            log(f"{name} failed: {exc!r}")
            failed += 1
            continue
        result.params["load_before"] = load
        result.params["load_after"] = load_avg()
        result.params["runs"] = opts.runs
        result.params["elapsed_s"] = round(time.monotonic() - started, 1)
        doc = {"machine": machine_facts(), **result.to_json()}
        path = RESULTS_DIR / f"{name}.json"
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print_table(result, load)
        log(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
