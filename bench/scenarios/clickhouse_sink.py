"""``clickhouse_sink``: epoch throughput into ClickHouse with ReplacingMergeTree upserts.

generate → the blackhole scenario's SQL → ``clickhouse`` sink (append-only mode: rows plus
``is_deleted`` and ``insert_time``, ``insert_arrow`` in 100k-row inserts), in-process on the
shared session. The hand-written job does what a careful PySpark user would: run the same SQL on
the micro-batch, collect it as Arrow, add the same two columns and ``insert_arrow`` it into a
table of the same engine with clickhouse-connect. Both write fresh tables of the same server.

ClickHouse is the engine behind ``fixtures/services/up clickhouse`` (chdb behind the HTTP
interface); when its ``STREAMLING__CLICKHOUSE_SINK__*`` exports are not in the environment the
scenario starts (or reuses) the service itself. Figures are in-machine: the same engine serves
both sides over loopback HTTP.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from scenarios.common import (
    ROOT,
    Options,
    ScenarioResult,
    Side,
    bench_settings,
    ensure_services,
    interleaved,
    log,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.generate_sql_blackhole import SQL, summarize
from scenarios.inprocess import RUNTIME_PHASES, generate_yaml, run_handwritten, run_streamling

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "clickhouse_sink"
DEFAULT_ROWS = 1_000_000
ROWS_PER_BATCH = 250_000
PARTITIONS = 2
PHASES = (*RUNTIME_PHASES, *(f"streamling.sinks.clickhouse:ClickHouseSink.{m}" for m in
                             ("open", "write", "_collect", "_insert")))
SERVICE_UP = ROOT / "fixtures" / "services" / "up"


def ensure_clickhouse() -> str | None:
    """Make the ClickHouse exports visible to this process; returns why not, if impossible."""
    return ensure_services("clickhouse", present=("STREAMLING__CLICKHOUSE_SINK__URL",))


class HandwrittenInsert:
    """The hand-written foreachBatch: SQL → Arrow → two columns → ``insert_arrow`` per 100k rows."""

    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table
        self.created = False

    def __call__(self, batch: DataFrame, _batch_id: int) -> int:
        import pyarrow as pa
        import pyarrow.compute as pc

        batch.createOrReplaceTempView("orders")
        data = batch.sparkSession.sql(SQL).toArrow()
        if not self.created:
            self.client.command(f"CREATE TABLE {self.table} (id Int64, customer Nullable(String), total "
                                "Nullable(Float64), insert_time DateTime64(6, 'UTC'), is_deleted UInt8) "
                                "ENGINE = ReplacingMergeTree(insert_time, is_deleted) ORDER BY id")
            self.created = True
        ops = data.column("_gs_op")
        rows = data.drop_columns(["_gs_op"]).append_column("is_deleted", pc.cast(pc.equal(ops, "d"), pa.uint8()))
        now = time.time_ns() // 1000
        rows = rows.append_column("insert_time", pa.array([now] * rows.num_rows, pa.timestamp("us", tz="UTC")))
        for start in range(0, rows.num_rows, 100_000):
            self.client.insert_arrow(self.table, rows.slice(start, 100_000))
        return int(rows.num_rows)


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    source = {"rows": rows, "rows_per_batch": min(ROWS_PER_BATCH, rows), "partitions": PARTITIONS,
              "profile": "orders"}
    reason = ensure_clickhouse()
    if reason:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped=reason)
    from streamling.clickhouse import connect

    spark = shared_session()
    with temp_dir("ch-settings") as workdir:
        conn = bench_settings(workdir, "bench_ch").clickhouse_sink
    client = connect(conn)
    counts: list[int] = []

    def final_rows(table: str) -> int:
        count = int(client.query(f"SELECT count() FROM {table} FINAL").result_rows[0][0])
        client.command(f"DROP TABLE IF EXISTS {table}")
        counts.append(count)
        return count

    def streamling_side() -> dict[str, Any]:
        table = f"bench_sl_{uuid.uuid4().hex[:10]}"
        sink = {"type": "clickhouse", "table": table, "primary_key": "id"}
        with temp_dir("ch") as workdir:
            out = run_streamling(spark, generate_yaml(source, SQL, sink), workdir, rows, phases=PHASES)
        out["table_rows"] = final_rows(table)
        return out

    def handwritten_side() -> dict[str, Any]:
        insert = HandwrittenInsert(client, f"bench_hw_{uuid.uuid4().hex[:10]}")
        with temp_dir("ch-hw") as workdir:
            out = run_handwritten(spark, source, insert, workdir, rows)
        out["table_rows"] = final_rows(insert.table)
        return out

    sides = {"streamling": Side("streamling"), "handwritten": Side("handwritten")}
    log(f"{NAME}: {rows:,} rows into {conn.describe()}, {opts.runs} runs")
    try:
        interleaved(opts.runs, {"streamling": streamling_side, "handwritten": handwritten_side}, sides, log)
    finally:
        client.close()
    result = summarize(NAME, rows, source, sides, {"sql": SQL, "clickhouse": conn.describe(),
                                                   "spark": session_facts(spark)})
    if len(set(counts)) != 1:
        result.notes.append(f"the runs left different row counts in their tables: {sorted(set(counts))}")
    return result
