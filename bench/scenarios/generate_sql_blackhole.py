"""``generate_sql_blackhole``: raw epoch throughput, no external system.

generate (Python data source, Arrow batches) → SQL filter/projection → blackhole (Spark's ``noop``
writer), in-process on the shared session. The hand-written job runs the identical SQL over a temp
view of the same micro-batch and writes it with ``format("noop")``. Whatever separates the two is
streamling's own per-epoch work: planning the DAG, events, the sink's row count, stop handling.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from scenarios.common import (
    Options,
    ScenarioResult,
    Side,
    interleaved,
    log,
    paired_ratio,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.inprocess import RUNTIME_PHASES, generate_yaml, phase_medians, run_handwritten, run_streamling

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "generate_sql_blackhole"
SQL = "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders WHERE amount > 100"
DEFAULT_ROWS = 5_000_000
ROWS_PER_BATCH = 1_000_000
PARTITIONS = 2
PHASES = (*RUNTIME_PHASES, "streamling.sinks.blackhole:BlackholeSink.write")


def source_options(rows: int) -> dict[str, Any]:
    return {"rows": rows, "rows_per_batch": min(ROWS_PER_BATCH, rows), "partitions": PARTITIONS,
            "profile": "orders"}


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    spark = shared_session()
    source = source_options(rows)
    yaml_text = generate_yaml(source, SQL, {"type": "blackhole"})

    def streamling_side() -> dict[str, Any]:
        with temp_dir("blackhole") as workdir:
            return run_streamling(spark, yaml_text, workdir, rows, phases=PHASES)

    def noop_batch(batch: DataFrame, _batch_id: int) -> None:
        batch.createOrReplaceTempView("orders")
        batch.sparkSession.sql(SQL).write.format("noop").mode("overwrite").save()

    def handwritten_side() -> dict[str, Any]:
        with temp_dir("blackhole-hw") as workdir:
            return run_handwritten(spark, source, noop_batch, workdir, rows)

    sides = {"streamling": Side("streamling"), "handwritten": Side("handwritten")}
    log(f"{NAME}: {rows:,} rows, {opts.runs} runs")
    interleaved(opts.runs, {"streamling": streamling_side, "handwritten": handwritten_side}, sides, log)
    return summarize(NAME, rows, source, sides, {"sql": SQL, "spark": session_facts(spark)})


def _epoch_median(side: Side, skip_first: bool) -> float:
    """Median epoch duration over all measured runs; the first epoch of a query also pays for
    the query's first Python worker round-trips, so it is reported apart."""
    values = [ms for run in side.runs for ms in run["epoch_ms"][1 if skip_first else 0:]]
    return statistics.median(values) if values else float("nan")


def summarize(name: str, rows: int, source: dict[str, Any], sides: dict[str, Side],
              extra: dict[str, Any]) -> ScenarioResult:
    """Median figures and the streamling / hand-written ratio (rows/s, higher is better)."""
    sl, hw = sides["streamling"], sides["handwritten"]
    result = ScenarioResult(name, {"rows": rows, "source": source, **extra}, sides)
    skip = bool(sl.runs) and len(sl.runs[0]["epoch_ms"]) > 1
    which = "median epoch, 1st excluded" if skip else "median epoch"
    result.figures = {
        "streamling rows/s": (sl.median("rows_per_s"), "rows/s"),
        "hand-written rows/s": (hw.median("rows_per_s"), "rows/s"),
        "streamling wall": (sl.median("wall_s"), "s"),
        "hand-written wall": (hw.median("wall_s"), "s"),
        "streamling first epoch done": (sl.median("first_epoch_after_s"), "s"),
        "hand-written first epoch done": (hw.median("first_epoch_after_s"), "s"),
        f"streamling {which}": (_epoch_median(sl, skip), "ms"),
        f"hand-written {which}": (_epoch_median(hw, skip), "ms"),
        "streamling start() call": (sl.median("start_call_s"), "s"),
        "streamling start → stopped": (sl.median("total_s"), "s"),
        "hand-written start → terminated": (hw.median("total_s"), "s"),
    }
    result.ratios = {"rows_per_s": sl.median("rows_per_s") / hw.median("rows_per_s"),
                     "rows_per_s (paired per round)": paired_ratio(sl, hw, "rows_per_s"),
                     "epoch": _epoch_median(hw, skip) / _epoch_median(sl, skip)}
    phases = phase_medians(sl.runs)
    result.params["streamling_phases"] = phases
    for label, t in phases.items():
        result.notes.append(f"streamling {label}: {t['calls']:g} call(s) per run, median {t['median_ms']:.0f} ms "
                            f"per call, {t['total_ms']:.0f} ms per run")
    return result
