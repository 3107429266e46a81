"""``generate_sql_postgres``: epoch throughput into Postgres with primary-key upserts.

generate → the blackhole scenario's SQL → ``postgres`` sink (``INSERT … ON CONFLICT (id) DO
UPDATE``), in-process on the shared session. The hand-written job does what a careful PySpark user
would: collect the micro-batch as Arrow, render it as CSV with Arrow's writer, ``COPY`` it into a
temporary staging table and upsert from there, one transaction per batch. Both sides write fresh
tables in the same database, so neither pays for conflicts the other created.

Postgres comes from ``fixtures/services/up postgres``; when its ``STREAMLING__POSTGRES_SINK__*``
exports are not in the environment the scenario starts (or reuses) the service itself.
"""

from __future__ import annotations

import io
import statistics
import time
import uuid
from importlib.util import find_spec
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
    import psycopg
    from pyspark.sql import DataFrame

NAME = "generate_sql_postgres"
DEFAULT_ROWS = 1_000_000
#: smaller epochs than the blackhole scenario: four per run, so per-epoch durations mean something.
ROWS_PER_BATCH = 250_000
PARTITIONS = 2
PHASES = (*RUNTIME_PHASES, *(f"streamling.sinks.postgres:PostgresSink.{m}" for m in
                             ("open", "write", "_ensure_table", "partition_writer")))
SCHEMA = "bench"
SERVICE_UP = ROOT / "fixtures" / "services" / "up"


def ensure_postgres() -> str | None:
    """Make the Postgres exports visible to this process; returns why not, if impossible."""
    return ensure_services("postgres", present=("STREAMLING__POSTGRES_SINK__PORT",))


def _connect(conninfo: str) -> psycopg.Connection[Any]:
    import psycopg

    return psycopg.connect(conninfo, application_name="streamling-bench", options="-c TimeZone=UTC")


class HandwrittenUpsert:
    """The hand-written foreachBatch: Arrow → CSV → COPY into a temp table → one upsert, one commit.

    The temp table is created once per connection (``ON COMMIT DELETE ROWS`` empties it at each
    commit) and the target table on the first batch, inside the timed run as streamling's are.
    """

    def __init__(self, conninfo: str, table: str) -> None:
        self.conninfo = conninfo
        self.table = table
        self.conn: psycopg.Connection[Any] | None = None
        #: per batch: ms spent collecting, rendering CSV, in COPY, in the upsert + commit.
        self.phases: list[dict[str, float]] = []

    def __call__(self, batch: DataFrame, _batch_id: int) -> int:
        import pyarrow.csv as pacsv

        t0 = time.perf_counter()
        batch.createOrReplaceTempView("orders")
        data = batch.sparkSession.sql(SQL).drop("_gs_op").toArrow()
        t1 = time.perf_counter()
        if self.conn is None:
            self.conn = _connect(self.conninfo)
            with self.conn.cursor() as cur:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
                cur.execute(f"CREATE TABLE IF NOT EXISTS {self.table} "
                            "(id BIGINT PRIMARY KEY, customer TEXT, total DOUBLE PRECISION)")
                cur.execute("CREATE TEMP TABLE stage (id BIGINT, customer TEXT, total DOUBLE PRECISION) "
                            "ON COMMIT DELETE ROWS")
            self.conn.commit()
        t2 = time.perf_counter()
        buf = io.BytesIO()
        pacsv.write_csv(data, buf, pacsv.WriteOptions(include_header=False))
        t3 = time.perf_counter()
        with self.conn.cursor() as cur:
            with cur.copy("COPY stage (id, customer, total) FROM STDIN (FORMAT csv)") as copy:
                copy.write(buf.getvalue())
            t4 = time.perf_counter()
            cur.execute(f"INSERT INTO {self.table} AS t (id, customer, total) SELECT id, customer, total FROM stage "
                        "ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, total = EXCLUDED.total")
        self.conn.commit()
        t5 = time.perf_counter()
        self.phases.append({k: round(v * 1000, 1) for k, v in
                            {"collect": t1 - t0, "connect_setup": t2 - t1, "csv": t3 - t2, "copy": t4 - t3,
                             "upsert_commit": t5 - t4}.items()})
        return data.num_rows

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _drop(conninfo: str, table: str) -> int:
    """Row count of a finished run's table (a sanity check), then drop it to keep the DB small."""
    with _connect(conninfo) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM {table}")
        row = cur.fetchone()
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        return int(row[0]) if row else 0


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    source = {"rows": rows, "rows_per_batch": min(ROWS_PER_BATCH, rows), "partitions": PARTITIONS,
              "profile": "orders"}
    if find_spec("streamling.sinks.postgres") is None:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped="streamling.sinks.postgres is not there yet")
    reason = ensure_postgres()
    if reason:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped=reason)
    spark = shared_session()
    with temp_dir("pg-settings") as workdir:
        conn = bench_settings(workdir, "bench_pg").postgres_connection_for("out")
    conninfo = conn.conninfo()
    expected_rows: list[int] = []

    def streamling_side() -> dict[str, Any]:
        table = f"sl_{uuid.uuid4().hex[:10]}"
        sink = {"type": "postgres", "schema": SCHEMA, "table": table}
        with temp_dir("pg") as workdir:
            out = run_streamling(spark, generate_yaml(source, SQL, sink), workdir, rows, phases=PHASES)
        out["table_rows"] = _drop(conninfo, f"{SCHEMA}.{table}")
        expected_rows.append(out["table_rows"])
        return out

    def handwritten_side() -> dict[str, Any]:
        upsert = HandwrittenUpsert(conninfo, f"{SCHEMA}.hw_{uuid.uuid4().hex[:10]}")
        try:
            with temp_dir("pg-hw") as workdir:
                out = run_handwritten(spark, source, upsert, workdir, rows)
        finally:
            upsert.close()
        out["table_rows"] = _drop(conninfo, upsert.table)
        out["phases"] = upsert.phases
        expected_rows.append(out["table_rows"])
        return out

    sides = {"streamling": Side("streamling"), "handwritten": Side("handwritten")}
    log(f"{NAME}: {rows:,} rows into {conn.describe()}, {opts.runs} runs")
    interleaved(opts.runs, {"streamling": streamling_side, "handwritten": handwritten_side}, sides, log)
    result = summarize(NAME, rows, source, sides, {"sql": SQL, "postgres": conn.describe(),
                                                   "spark": session_facts(spark)})
    hw_phases = [p for run in sides["handwritten"].runs for p in run.get("phases", [])]
    medians = {key: round(statistics.median(p[key] for p in hw_phases), 1)
               for key in ("collect", "csv", "copy", "upsert_commit") if hw_phases}
    result.params["handwritten_phases"] = medians
    result.notes += [f"hand-written {key}: median {ms:.0f} ms per epoch" for key, ms in medians.items()]
    if len(set(expected_rows)) != 1:
        result.notes.append(f"the runs left different row counts in their tables: {sorted(set(expected_rows))}")
    return result
