"""``kafka_clickhouse``: Streamling's production workload, Kafka (Avro) → SQL → ClickHouse.

The records of ``kafka_avro`` (Confluent Avro from a real broker and schema registry, 1,000
distinct payloads cycled) go through the projection query, keyed by their Kafka offset so every
record is a row of its own, into a ``clickhouse`` sink (append-only mode: ReplacingMergeTree,
``is_deleted`` and ``insert_time``, ``insert_arrow`` in 100k-row inserts). The hand-written job is
``kafka_avro``'s (``readStream.format("kafka")`` → ``from_avro`` → the same SQL) ending in what a
PySpark user writes with clickhouse-connect: collect the micro-batch as Arrow, add the two columns,
``insert_arrow`` it into a table of the same engine.

Streamling's headline for this workload is "0.3 cores where Flink used 10+"; the figures here are
rows/s, CPU µs/record and cores busy of the Spark process tree (JVM, Python driver and workers).
The ClickHouse engine runs in its own process (``fixtures/services/up clickhouse``) and its CPU is
counted on neither side.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

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
from scenarios.kafka_avro import Query, ensure_kafka, prepare_topic, run_handwritten, run_streamling, runs_wanted

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "kafka_clickhouse"
DEFAULT_ROWS = 2_000_000
QUERY = Query("avro_cdc_to_clickhouse",
              "SELECT _kafka_offset AS event_id, id, user_id, email, lower(country) AS country, device, amount, "
              "amount * 1.1 AS amount_with_fee, price, ts FROM src", 1.0)
#: the sink's table for the query above, as the clickhouse sink creates it (key not nullable).
COLUMNS = ("event_id Int64, id Nullable(Int64), user_id Nullable(String), email Nullable(String), "
           "country Nullable(String), device Nullable(String), amount Nullable(Float64), "
           "amount_with_fee Nullable(Float64), price Nullable(Decimal(20, 4)), ts Nullable(Int64)")
INSERT_ROWS = 100_000


def pipeline_yaml(topic: str, table: str) -> str:
    import yaml

    return yaml.safe_dump({
        "sources": {"src": {"type": "kafka", "topic": topic, "starting_offsets": "earliest", "include_metadata": True}},
        "transforms": {"result": {"type": "sql", "sql": QUERY.sql, "primary_key": "event_id"}},
        "sinks": {"out": {"type": "clickhouse", "from": "result", "table": table, "primary_key": "event_id"}},
    }, sort_keys=False)


class HandwrittenInsert:
    """The hand-written batch writer: Arrow → ``is_deleted``/``insert_time`` → ``insert_arrow``."""

    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table
        client.command(f"CREATE TABLE {table} ({COLUMNS}, insert_time DateTime64(6, 'UTC'), is_deleted UInt8) "
                       "ENGINE = ReplacingMergeTree(insert_time, is_deleted) ORDER BY event_id")

    def __call__(self, out: DataFrame, _batch_id: int) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        data = out.toArrow()
        ops = data.column("_gs_op")
        rows = data.drop_columns(["_gs_op"]).append_column("is_deleted", pc.cast(pc.equal(ops, "d"), pa.uint8()))
        now = time.time_ns() // 1000
        rows = rows.append_column("insert_time", pa.array([now] * rows.num_rows, pa.timestamp("us", tz="UTC")))
        for start in range(0, rows.num_rows, INSERT_ROWS):
            self.client.insert_arrow(self.table, rows.slice(start, INSERT_ROWS))


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    runs = runs_wanted(opts)
    reason = ensure_kafka() or ensure_clickhouse()
    if reason:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped=reason)
    from streamling.clickhouse import connect

    spark = shared_session()
    data = prepare_topic(rows)
    with temp_dir("kch-settings") as workdir:
        conn = bench_settings(workdir, "bench_kch").clickhouse_sink
    client = connect(conn)
    counts: list[int] = []

    def final_rows(table: str) -> int:
        counts.append(int(client.query(f"SELECT count() FROM {table} FINAL").result_rows[0][0]))
        client.command(f"DROP TABLE IF EXISTS {table}")
        return counts[-1]

    def streamling_side() -> dict[str, Any]:
        table = f"bench_sl_{uuid.uuid4().hex[:10]}"
        with temp_dir("kch") as workdir:
            out = run_streamling(spark, pipeline_yaml(data.topic, table), workdir, data)
        out["table_rows"] = final_rows(table)
        return out

    def handwritten_side() -> dict[str, Any]:
        insert = HandwrittenInsert(client, f"bench_hw_{uuid.uuid4().hex[:10]}")
        with temp_dir("kch-hw") as workdir:
            out = run_handwritten(spark, QUERY, workdir, data, write=insert)
        out["table_rows"] = final_rows(insert.table)
        return out

    sl, hw = Side("streamling"), Side("handwritten")
    log(f"{NAME}: {rows:,} records from {data.topic} into {conn.describe()}, {runs} runs")
    try:
        interleaved(runs, {"streamling": streamling_side, "handwritten": handwritten_side},
                    {"streamling": sl, "handwritten": hw}, log)
    finally:
        client.close()
    result = ScenarioResult(NAME, {"rows": rows, "runs_wanted": runs, "topic": data.topic, "sql": QUERY.sql,
                                   "clickhouse": conn.describe(), "spark": session_facts(spark)},
                            {"streamling": sl, "handwritten": hw})
    for label, side in (("streamling", sl), ("hand-written", hw)):
        result.figures[f"{label} rows/s"] = (side.median("input_rps"), "rows/s")
        result.figures[f"{label} CPU µs/record"] = (side.median("cpu_us_per_record"), "µs")
        result.figures[f"{label} cores busy"] = (side.median("cores_busy"), "cores")
        result.figures[f"{label} wall"] = (side.median("wall_s"), "s")
    result.ratios["rows/s"] = sl.median("input_rps") / hw.median("input_rps")
    result.ratios["rows/s (paired per round)"] = paired_ratio(sl, hw, "input_rps")
    result.ratios["CPU/record"] = hw.median("cpu_us_per_record") / sl.median("cpu_us_per_record")
    if set(counts) != {rows}:
        result.notes.append(f"the tables held {sorted(set(counts))} rows under FINAL, expected {rows}")
    return result
