"""``gs_functions``: what Streamling's own SQL functions cost when Spark built-ins can express them.

generate → SQL calling ``_gs_split_string_to_array``, ``_gs_generate_series`` and
``_gs_byte_to_hex`` → blackhole. The translator rewrites the three calls into Spark expressions
(``split`` on a quoted separator, ``sequence`` guarded by Streamling's step rules,
``lower(hex(…))``). Four sides on the same source and session:

- ``streamling``: the pipeline with the ``_gs_*`` SQL;
- ``handwritten_gs``: a hand-written ``foreachBatch`` job running the translator's output for that
  SQL over each micro-batch (``noop`` writer);
- ``handwritten``: the same job running the query written directly with Spark built-ins;
- ``streamling_plain``: the pipeline with the three calls left out (what their work itself costs).

``handwritten_gs`` ÷ ``handwritten`` isolates the rewrites from everything else (the goal: within
10 %, i.e. ≥ 0.9); ``streamling`` ÷ ``handwritten`` is the usual streamling-vs-PySpark ratio.
"""

from __future__ import annotations

from collections.abc import Callable
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
from scenarios.inprocess import generate_yaml, run_handwritten, run_streamling
from streamling.spec.sql import rewrite_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "gs_functions"
DEFAULT_ROWS = 2_000_000
ROWS_PER_BATCH = 500_000
PARTITIONS = 2

#: Streamling SQL: the three functions as a Streamling pipeline writes them.
GS_SQL = ("SELECT id, _gs_split_string_to_array(customer, '-') AS parts, "
          "_gs_generate_series(1, quantity) AS series, "
          "_gs_byte_to_hex(CAST(customer AS BINARY)) AS hexed FROM orders")
#: Spark SQL: the same columns from Spark built-ins, as a PySpark user would write them.
BUILTIN_SQL = ("SELECT id, split(customer, '-', -1) AS parts, "
               "sequence(1L, CAST(quantity AS BIGINT)) AS series, "
               "lower(hex(CAST(customer AS BINARY))) AS hexed, _gs_op FROM orders")
#: Streamling SQL without the functions: the inputs they read, projected as they are.
PLAIN_SQL = "SELECT id, customer AS parts, quantity AS series, customer AS hexed FROM orders"


def source_options(rows: int) -> dict[str, Any]:
    return {"rows": rows, "rows_per_batch": min(ROWS_PER_BATCH, rows), "partitions": PARTITIONS,
            "profile": "orders"}


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    spark = shared_session()
    source = source_options(rows)
    gs_yaml = generate_yaml(source, GS_SQL, {"type": "blackhole"})
    plain_yaml = generate_yaml(source, PLAIN_SQL, {"type": "blackhole"})

    def streamling_side() -> dict[str, Any]:
        with temp_dir("gs-functions") as workdir:
            return run_streamling(spark, gs_yaml, workdir, rows)

    def plain_side() -> dict[str, Any]:
        with temp_dir("gs-plain") as workdir:
            return run_streamling(spark, plain_yaml, workdir, rows)

    translated = rewrite_sql(GS_SQL, {"orders": "orders"})

    def noop(sql: str) -> Callable[[DataFrame, int], None]:
        def batch_fn(batch: DataFrame, _batch_id: int) -> None:
            batch.createOrReplaceTempView("orders")
            batch.sparkSession.sql(sql).write.format("noop").mode("overwrite").save()
        return batch_fn

    def handwritten_side() -> dict[str, Any]:
        with temp_dir("gs-functions-hw") as workdir:
            return run_handwritten(spark, source, noop(BUILTIN_SQL), workdir, rows)

    def handwritten_gs_side() -> dict[str, Any]:
        with temp_dir("gs-functions-hw-gs") as workdir:
            return run_handwritten(spark, source, noop(translated), workdir, rows)

    sides = {name: Side(name) for name in ("streamling", "handwritten_gs", "handwritten", "streamling_plain")}
    log(f"{NAME}: {rows:,} rows, {opts.runs} runs")
    interleaved(opts.runs, {"streamling": streamling_side, "handwritten_gs": handwritten_gs_side,
                            "handwritten": handwritten_side, "streamling_plain": plain_side}, sides, log)
    return summarize(rows, source, sides, {"gs_sql": GS_SQL, "translated_sql": translated, "builtin_sql": BUILTIN_SQL,
                                           "plain_sql": PLAIN_SQL, "spark": session_facts(spark)})


def summarize(rows: int, source: dict[str, Any], sides: dict[str, Side], extra: dict[str, Any]) -> ScenarioResult:
    """Median rows/s of each side; ratios oriented so that 1.0 is parity and higher is better."""
    sl, hw, plain = sides["streamling"], sides["handwritten"], sides["streamling_plain"]
    hw_gs = sides["handwritten_gs"]
    result = ScenarioResult(NAME, {"rows": rows, "source": source, **extra}, sides)
    result.figures = {
        "streamling (_gs_* functions) rows/s": (sl.median("rows_per_s"), "rows/s"),
        "hand-written, translated _gs_* SQL rows/s": (hw_gs.median("rows_per_s"), "rows/s"),
        "hand-written (Spark built-ins) rows/s": (hw.median("rows_per_s"), "rows/s"),
        "streamling without the functions rows/s": (plain.median("rows_per_s"), "rows/s"),
        "streamling wall": (sl.median("wall_s"), "s"),
        "hand-written wall": (hw.median("wall_s"), "s"),
        "streamling without the functions wall": (plain.median("wall_s"), "s"),
    }
    result.ratios = {
        "rewrites vs built-ins (hand-written both)": hw_gs.median("rows_per_s") / hw.median("rows_per_s"),
        "rewrites vs built-ins (paired per round)": paired_ratio(hw_gs, hw, "rows_per_s"),
        "rows_per_s vs hand-written": sl.median("rows_per_s") / hw.median("rows_per_s"),
        "rows_per_s vs hand-written (paired per round)": paired_ratio(sl, hw, "rows_per_s"),
        "rows_per_s vs without the functions": sl.median("rows_per_s") / plain.median("rows_per_s"),
    }
    return result
