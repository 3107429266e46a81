"""``clickhouse_source``: paged scan throughput of the ClickHouse source.

A ``MergeTree`` table of N order rows ordered by ``id`` → ``clickhouse`` source (pages of
``page_size`` rows, one per epoch, read by the executors over HTTP with Arrow) → blackhole. The
hand-written job is what a PySpark user writes without a streaming source: a loop on the driver
that asks clickhouse-connect for the next ``page_size`` rows after the last id (``query_arrow``),
turns each page into a DataFrame and writes it with Spark's ``noop`` writer. Both read the same
table of the same server (``fixtures/services/up clickhouse``); figures are rows/s and pages/s.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from scenarios.clickhouse_sink import ensure_clickhouse
from scenarios.common import (
    Options,
    ScenarioResult,
    Side,
    bench_settings,
    interleaved,
    log,
    paired_ratio,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.inprocess import RUNTIME_PHASES, run_streamling

NAME = "clickhouse_source"
DEFAULT_ROWS = 2_000_000
PAGE_SIZE = 500_000
PHASES = (*RUNTIME_PHASES, "streamling.sinks.blackhole:BlackholeSink.write")


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    reason = ensure_clickhouse()
    if reason:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped=reason)
    from streamling.clickhouse import connect

    spark = shared_session()
    with temp_dir("ch-settings") as workdir:
        conn = bench_settings(workdir, "bench_ch_src").clickhouse_source
    client = connect(conn)
    table = f"bench_src_{uuid.uuid4().hex[:10]}"
    client.command(f"CREATE TABLE {table} (id UInt64, customer String, amount Float64, created_at DateTime) "
                   "ENGINE = MergeTree ORDER BY id")
    client.command(f"INSERT INTO {table} SELECT number, concat('customer-', toString(number % 1000)), "
                   f"(number * 37) % 100000 / 100, toDateTime('2026-01-01 00:00:00') + number FROM numbers({rows})")
    yaml_text = (f"sources:\n  orders: {{type: clickhouse, table_name: {table}}}\ntransforms: {{}}\n"
                 "sinks:\n  out: {type: blackhole, from: orders}\n")

    def streamling_side() -> dict[str, Any]:
        with temp_dir("ch-src") as workdir:
            out = run_streamling(spark, yaml_text, workdir, rows, phases=PHASES,
                                 clickhouse_source={"page_size": PAGE_SIZE})
        out["pages_per_s"] = out["epochs"] / out["wall_s"] if out["wall_s"] > 0 else float("nan")
        return out

    def handwritten_side() -> dict[str, Any]:
        t0 = time.perf_counter()
        last, pages, read = -1, 0, 0
        while True:
            page = client.query_arrow(f"SELECT toInt64(id) AS id, customer, amount, "
                                      f"toDateTime64(created_at, 6, 'UTC') AS created_at FROM {table} "
                                      f"WHERE id > {last} ORDER BY id LIMIT {PAGE_SIZE}", use_strings=True)
            if page.num_rows == 0:
                break
            spark.createDataFrame(page).write.format("noop").mode("overwrite").save()
            last = int(page.column("id")[-1].as_py())
            pages += 1
            read += page.num_rows
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "rows_per_s": read / wall, "pages_per_s": pages / wall, "epochs": pages,
                "input_rows": read}

    sides = {"streamling": Side("streamling"), "handwritten": Side("handwritten")}
    log(f"{NAME}: {rows:,} rows in pages of {PAGE_SIZE:,} from {conn.describe()}, {opts.runs} runs")
    try:
        interleaved(opts.runs, {"streamling": streamling_side, "handwritten": handwritten_side}, sides, log)
    finally:
        client.command(f"DROP TABLE IF EXISTS {table}")
        client.close()
    sl, hw = sides["streamling"], sides["handwritten"]
    result = ScenarioResult(NAME, {"rows": rows, "page_size": PAGE_SIZE, "clickhouse": conn.describe(),
                                   "spark": session_facts(spark)}, sides)
    result.figures = {
        "streamling rows/s": (sl.median("rows_per_s"), "rows/s"),
        "hand-written rows/s": (hw.median("rows_per_s"), "rows/s"),
        "streamling pages/s": (sl.median("pages_per_s"), "pages/s"),
        "hand-written pages/s": (hw.median("pages_per_s"), "pages/s"),
        "streamling wall": (sl.median("wall_s"), "s"),
        "hand-written wall": (hw.median("wall_s"), "s"),
    }
    result.ratios = {"rows_per_s": sl.median("rows_per_s") / hw.median("rows_per_s"),
                     "rows_per_s (paired per round)": paired_ratio(sl, hw, "rows_per_s")}
    return result
