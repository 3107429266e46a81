"""``postgres_aggregate``: epoch throughput of the trigger-maintained aggregate sink.

generate (``cdc`` profile: inserts, updates, deletes) → ``postgres_aggregate`` sink grouping by
customer (count, sum, avg, max). The hand-written job uses the very same landing table, function
and trigger (the sink's own DDL) and does what a PySpark user would: collect the micro-batch as
Arrow, keep the last row per (id, op), render CSV, ``COPY`` it into a staging table and upsert it
into the landing table on (id, op) after deleting all but the previous batch's rows (Streamling's
landing window), one transaction per batch. What separates the two is streamling's per-epoch work and
its replay guard (the epoch mark written in the same transaction).
"""

from __future__ import annotations

import io
import uuid
from typing import TYPE_CHECKING, Any

import yaml

from scenarios.common import (
    Options,
    ScenarioResult,
    Side,
    bench_settings,
    interleaved,
    log,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.generate_sql_blackhole import summarize
from scenarios.generate_sql_postgres import SCHEMA, _connect, ensure_postgres
from scenarios.inprocess import RUNTIME_PHASES, run_handwritten, run_streamling

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

NAME = "postgres_aggregate"
DEFAULT_ROWS = 1_000_000
ROWS_PER_BATCH = 250_000
PHASES = (*RUNTIME_PHASES, *(f"streamling.sinks.postgres_aggregate:PostgresAggregateSink.{m}"
                             for m in ("open", "write", "_collect")))
AGGREGATE = {"group_by": {"customer": {}},
             "aggregate": {"n": {"fn": "count"}, "total": {"fn": "sum", "from": "amount"},
                           "mean": {"fn": "avg", "from": "amount"}, "biggest": {"fn": "max", "from": "amount"}}}


def _yaml(source: dict[str, Any], landing: str, agg: str) -> str:
    return yaml.safe_dump({
        "sources": {"changes": {"type": "generate", "primary_key": "id", **source}},
        "transforms": {},
        "sinks": {"out": {"type": "postgres_aggregate", "from": "changes", "schema": SCHEMA,
                          "landing_table": landing, "agg_table": agg, **AGGREGATE}}}, sort_keys=False)


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    source = {"rows": rows, "rows_per_batch": min(ROWS_PER_BATCH, rows), "partitions": 2, "profile": "cdc"}
    reason = ensure_postgres()
    if reason:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped=reason)
    from streamling.config import load_settings
    from streamling.runtime.planner import analyze, build_plan
    from streamling.spec import parse_pipeline

    spark = shared_session()
    with temp_dir("agg-settings") as workdir:
        settings = bench_settings(workdir, "bench_agg")
    conninfo = settings.postgres_connection_for("out").conninfo()
    totals: list[int] = []

    def drop_and_count(landing: str, agg: str) -> int:
        with _connect(conninfo) as conn, conn.cursor() as cur:
            cur.execute(f"SELECT coalesce(sum(n), 0) FROM {SCHEMA}.{agg}")  # type: ignore[arg-type]
            row = cur.fetchone()
            cur.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{landing}, {SCHEMA}.{agg} CASCADE")  # type: ignore[arg-type]
        totals.append(int(row[0]) if row else 0)
        return totals[-1]

    def streamling_side() -> dict[str, Any]:
        landing, agg = f"sl_l_{uuid.uuid4().hex[:8]}", f"sl_a_{uuid.uuid4().hex[:8]}"
        with temp_dir("agg") as workdir:
            out = run_streamling(spark, _yaml(source, landing, agg), workdir, rows, phases=PHASES)
        out["keys_counted"] = drop_and_count(landing, agg)
        return out

    def handwritten_side() -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        landing, agg = f"hw_l_{uuid.uuid4().hex[:8]}", f"hw_a_{uuid.uuid4().hex[:8]}"
        plan = build_plan(parse_pipeline(_yaml(source, landing, agg)), load_settings(environ={}), dry_run=True)
        analyze(plan, spark)
        ddl = plan.describe()["ddl"]["out"]
        conn = _connect(conninfo)
        with conn.cursor() as cur:
            for statement in ddl:
                cur.execute(statement)
        conn.commit()

        def batch_fn(batch: DataFrame, batch_id: int) -> int:
            data = batch.toArrow()
            numbered = data.append_column("__i", pa.array(range(data.num_rows), pa.int64()))
            last = numbered.group_by(["id", "_gs_op"], use_threads=False).aggregate([("__i", "max")])
            data = data.take(last.column("__i_max")).append_column(
                "_gs_checkpoint_epoch", pa.array([batch_id] * last.num_rows, pa.int64()))
            buf = io.BytesIO()
            pacsv.write_csv(data, buf, pacsv.WriteOptions(include_header=False))
            cols = ", ".join(data.column_names)
            refresh = ", ".join(f"{c} = EXCLUDED.{c}" for c in data.column_names if c not in ("id", "_gs_op"))
            with conn.cursor() as cur:
                cur.execute(f"DELETE FROM {SCHEMA}.{landing} WHERE _gs_checkpoint_epoch <> %s",  # type: ignore[arg-type]
                            (batch_id - 1,))
                cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS stage_{landing} (LIKE {SCHEMA}.{landing}) "  # type: ignore[arg-type]
                            "ON COMMIT DELETE ROWS")
                with cur.copy(f"COPY stage_{landing} ({cols}) FROM STDIN (FORMAT csv)") as copy:  # type: ignore[arg-type]
                    copy.write(buf.getvalue())
                cur.execute(f"INSERT INTO {SCHEMA}.{landing} ({cols}) SELECT {cols} FROM stage_{landing} "  # type: ignore[arg-type]
                            f"ON CONFLICT (id, _gs_op) DO UPDATE SET {refresh}")
            conn.commit()
            return int(data.num_rows)

        try:
            with temp_dir("agg-hw") as workdir:
                out = run_handwritten(spark, source, batch_fn, workdir, rows)
        finally:
            conn.close()
        out["keys_counted"] = drop_and_count(landing, agg)
        return out

    sides = {"streamling": Side("streamling"), "handwritten": Side("handwritten")}
    log(f"{NAME}: {rows:,} CDC events into {settings.postgres_connection_for('out').describe()}, {opts.runs} runs")
    interleaved(opts.runs, {"streamling": streamling_side, "handwritten": handwritten_side}, sides, log)
    result = summarize(NAME, rows, source, sides, {"aggregate": AGGREGATE, "spark": session_facts(spark)})
    if len(set(totals)) != 1:
        result.notes.append(f"the runs counted different numbers of live keys: {sorted(set(totals))}")
    return result
