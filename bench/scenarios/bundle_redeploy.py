"""``bundle_redeploy``: ``bundle_jobs``' hot-redeploy figure alone, without its throughput and kill runs.

A continuous notebook job (``generate`` at 2,000 rows/s → SQL → ``postgres``) is deployed on
``local[2]``; once its first row is in Postgres, a changed SQL is redeployed ``REDEPLOYS`` times
(see ``bundle_jobs.redeploys``): seconds from ``streamling bundle deploy`` returning until the
sink shows a row of the new definition, each swapped in by the running driver (no JVM restart).
After ``bundle destroy`` the table must hold every id from 0 to its largest exactly once. A few
minutes, where ``bundle_jobs`` takes 10–17.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any

from scenarios.bundle_jobs import (
    RATE,
    REDEPLOY_GAP_SECS,
    REDEPLOYS,
    _measured,
    continuous_run,
    redeploy_figures,
    runs_wanted,
)
from scenarios.common import Options, ScenarioResult, Side, bench_settings, log, temp_dir
from scenarios.generate_sql_postgres import ensure_postgres

NAME = "bundle_redeploy"
MASTER = "local[2]"


def run(opts: Options) -> ScenarioResult:
    runs = runs_wanted(opts)
    params: dict[str, Any] = {"master": MASTER, "rate": RATE, "redeploys_per_run": REDEPLOYS,
                              "gap_between_redeploys_s": REDEPLOY_GAP_SECS, "runs_wanted": runs}
    reason = ensure_postgres()
    if reason:
        return ScenarioResult(NAME, params, {}, skipped=reason)
    with temp_dir("bundle-settings") as workdir:
        conninfo = bench_settings(workdir, "bench_bundle").postgres_connection_for("out").conninfo()
    side = Side("local_continuous")
    for i in range(runs):
        log(f"{NAME} [{MASTER}]: run {i + 1}/{runs}: deploy, then {REDEPLOYS} redeploys of a changed SQL")
        side.runs.append(_measured(functools.partial(continuous_run, MASTER, conninfo, None, kill=False)))
    result = ScenarioResult(NAME, params, {side.name: side})
    result.figures.update(redeploy_figures(side))
    result.figures["deploy → first row in Postgres"] = (side.median("first_row_s"), "s")
    result.figures["ids missing after destroy (all runs)"] = (float(sum(r["missing_ids"] for r in side.runs)), "ids")
    loads = [r["load"] for run in side.runs for r in run.get("redeploys", [])]
    loads += [r[k] for r in side.runs for k in ("load_before", "load_after")]
    if loads:
        result.notes.append(f"1-min load {min(loads):.1f}–{max(loads):.1f} during the measured runs "
                            f"(median {statistics.median(loads):.1f})")
    return result
