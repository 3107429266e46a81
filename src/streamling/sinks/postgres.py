"""``postgres`` sink: upserts each micro-batch into a Postgres table, honouring ``_gs_op``.

Semantics follow Streamling's sink: the schema and table are created from the input's Spark schema
(nested values as JSONB, ``_gs_op`` not stored; types and the fit of an existing table are
``streamling.postgres.columns``); ``d`` rows delete by primary key, every other row
(``i``, ``u`` or a null op) is ``INSERT … ON CONFLICT (pk) DO UPDATE`` (or ``DO NOTHING``), with
``update_where`` conditions ANDed as ``EXCLUDED.col op t.col``; without a key rows are plain inserts.

Why this shape: the epoch is shaped in Spark (nested values to JSON text, binary to hex). With
``parallelism`` set, it is spread over that many partitions, hashed by primary key so one key's ops
stay, in order, in one writer, and each partition is written by a Spark task (``PartitionWriter`` of
``streamling.sinks.postgres_writer``, through ``mapInArrow``); without it, the driver collects the
epoch as Arrow and runs the same writer itself — one transaction per epoch and no extra Spark stage,
the low-latency default for small CDC epochs, with the epoch held in the driver's memory. A writer
keeps the last row per key (the first with ``on_conflict: nothing``, as Streamling does), sends the
rows through one ``COPY`` (CSV written by Arrow's C++ writer) into a temporary staging table, then
one ``DELETE … USING`` and one ``INSERT … SELECT … ON CONFLICT``, all in one transaction per
partition, and yields one result row. The driver creates the table and, with executor writers,
collects only those rows, so its memory does not grow with the epoch and writers scale with the
cluster. A replayed keyed epoch converges to the same table (a key is always in the same partition).
Keyless partitions record the last epoch they wrote in
``<schema>._streamling_sink_partition_epochs`` inside their transaction; keyless rows are hashed by
all their columns, so a replay after a partial failure writes exactly the partitions that are
missing.

Failures are classified (``streamling.postgres.is_transient``), never retried here nor by Spark (a
writer reports instead of raising): the flow owns the retry policy, so an outage costs exactly its
attempts, one connection attempt per writer. Connections live in one pool per executor process.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import Field, field_validator

from streamling.errors import StreamlingError
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink, TargetReader
from streamling.sinks.postgres_writer import (
    DELETE_COL,
    NODE_KIND,
    RESULT_DDL,
    ROUND_COL,
    SEQ_COL,
    Marks,
    PartitionWriter,
    Statements,
    classify,
)
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamling.postgres import PoolSettings, PostgresPool

log = logging.getLogger(__name__)
T = TypeVar("T")

EPOCHS_TABLE = "_streamling_sink_epochs"  # one mark per sink (postgres_aggregate; this sink before)
PARTITION_MARKS_TABLE = "_streamling_sink_partition_epochs"


# --- the stored columns (their types: streamling.postgres.columns) ---------------------------------

UPDATE_WHERE_OPS = ("=", ">", ">=", "<", "<=", "!=", "<>")


class PostgresSinkOptions(FromNodeOptions):
    type: Literal["postgres"] = "postgres"
    table: str
    schema_: str = Field(default="public", alias="schema")
    on_conflict: Literal["update", "nothing"] = "update"
    update_where: dict[str, str] | None = None
    deduplicate: bool = True

    @field_validator("update_where")
    @classmethod
    def _ops(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for col, op in (value or {}).items():
            if op.strip() not in UPDATE_WHERE_OPS:
                ops = ", ".join(UPDATE_WHERE_OPS)
                raise ValueError(f"operator {op!r} for column '{col}' is not one of {ops}")
        return value


@dataclass(frozen=True)
class _Column:
    """One stored column: its Postgres type and how the batch is shaped before the COPY."""

    name: str
    pg_type: str
    encode: str  # "plain" | "json" (to_json in Spark) | "bytea" (hex text in Spark)


# --- the sink ------------------------------------------------------------------------------------

class PostgresSink(Sink[PostgresSinkOptions]):
    """Writes each epoch to ``schema.table`` from the executors; see the module docstring."""

    #: the flow spreads each epoch over ``parallelism`` writers (one by default)
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"parallelism"})

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.key: list[str] = list(ctx.primary_key)
        self.conn_settings = ctx.settings.postgres_connection_for(ctx.name)
        self.target = f"{self.conn_settings.host}:{self.conn_settings.port}/{self.conn_settings.db}"
        self.qualified = f'"{self.options.schema_}"."{self.options.table}"'
        self._pool: PostgresPool | None = None
        self._verified: tuple[tuple[str, str], ...] | None = None  # column set checked against table
        self._statements: dict[tuple[str, ...], Statements] = {}
        self._legacy_marks = False  # the one-row-per-sink marks table of earlier versions exists
        self._warned_keyless_delete = False

    # -- lifecycle ---------------------------------------------------------------------------------

    def open(self, spark: SparkSession) -> None:
        """Connect and create the schema and table from the input schema the planner passes."""
        # The planner may learn the key only while resolving schemas (a Kafka source's Avro doc).
        self.key = list(self.ctx.primary_key)
        schema = self.ctx.input_schema
        columns = self._columns(schema) if schema is not None else None
        self._run("opening the sink", lambda conn: self._ensure_table(conn, columns) if columns else None)
        log.info("postgres sink '%s' writes to %s on %s", self.name, self.qualified, self.target)

    def read_back(self, spark: SparkSession) -> TargetReader:
        from streamling.postgres.table_reader import PostgresTableReader

        return PostgresTableReader(self.name, self.conn_settings, self.target, str(self.options.schema_),
                                   str(self.options.table), lambda: list(self.key))

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- writing -----------------------------------------------------------------------------------

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        """Shape the epoch in Spark, write its partitions from the executors in parallel, and raise
        the first failure here, classified as the driver would have; only result rows come back."""
        columns = self._columns(df.schema)
        what = f"writing epoch {epoch.epoch_id}"
        if self._verified != tuple((c.name, c.pg_type) for c in columns):
            self._run(what, lambda conn: self._ensure_table(conn, columns))
        writer = self.partition_writer(columns, epoch)
        if self.options.parallelism is None:
            # No parallelism asked for: the driver is the one writer (one transaction per epoch, as
            # before executor writers existed). A Spark stage of writer tasks costs a small epoch
            # ~0.2 s more (latency bench: Postgres p50 557 -> 894 ms), which a low-latency CDC
            # stream should not pay; set ``parallelism`` to write from the executors instead.
            results = [writer.write(self._encode(df, columns).toArrow(), 0, self._connections())]
        else:
            from streamling.postgres import count_connect_attempts

            results = [r.asDict() for r in
                       self._partitioned(self._encode(df, columns)).mapInArrow(writer, RESULT_DDL).collect()]
            count_connect_attempts(self.target, sum(r["attempts"] for r in results))
        failed = [r for r in results if r["error_kind"]]
        if failed:
            raise self._failure(failed, len(results), what)
        rows = sum(r["received"] for r in results)
        replayed = sorted(r["partition"] for r in results if r["replayed"])
        if replayed:
            log.info("postgres sink '%s': epoch %s partition(s) %s already written, skipped", self.name,
                     epoch.epoch_id, ", ".join(map(str, replayed)))
        if any(r["skipped_deletes"] for r in results) and not self._warned_keyless_delete:
            log.warning("postgres sink '%s' has no primary key: 'd' rows cannot be matched and are skipped",
                        self.name)
            self._warned_keyless_delete = True
        log.debug("postgres sink '%s' epoch %s: %d rows (%d upserts, %d deletes) by %d writers", self.name,
                  epoch.epoch_id, rows, sum(r["upserts"] for r in results), sum(r["deletes"] for r in results),
                  len(results))
        return rows

    def partition_writer(self, columns: list[_Column] | StructType, epoch: Epoch) -> PartitionWriter:
        """The writer the executors run for ``epoch`` (the table must exist and fit ``columns``)."""
        if not isinstance(columns, list):
            columns = self._columns(columns)
        names = tuple(c.name for c in columns)
        return PartitionWriter(
            node=self.name, key=tuple(self.key), names=names, deduplicate=self.options.deduplicate,
            first_wins=self.options.deduplicate and self.options.on_conflict == "nothing",
            statements=self._statements_for(list(names)), conninfo=self.conn_settings.conninfo(),
            target=self.target, pool_settings=self._pool_settings(), secret=self.conn_settings.pass_,
            marks=self._marks(epoch) if not self.key else None)

    def spread(self, df: DataFrame) -> DataFrame:
        """Unchanged: ``write`` partitions the epoch itself (``_partitioned``), numbering the rows
        before the shuffle; a spread by the flow first would shuffle twice and number them after."""
        return df

    def _partitioned(self, df: DataFrame) -> DataFrame:
        """One writer per partition. Keyed rows are hashed by key (the nodes' ``spread``) so one key's
        ops stay in one writer, each row numbered first so the writer restores the epoch's order.
        Keyless rows are hashed by all their columns: a replayed epoch puts every row where it went
        the first time, however the upstream partitions came out, so the per-partition marks stay true."""
        from pyspark.sql import functions as F

        count = self.options.parallelism or 1
        if self.key:
            return super().spread(df.withColumn(SEQ_COL, F.monotonically_increasing_id()))
        if count == 1:
            return df.repartition(1)
        return df.repartition(count, *[F.col("`" + c.replace("`", "``") + "`") for c in df.columns])

    def _columns(self, schema: StructType) -> list[_Column]:
        from streamling.postgres.columns import pg_type_for

        out = []
        for f in schema.fields:
            if f.name == GS_OP:
                continue
            try:
                pg, encode = pg_type_for(f.dataType, f.metadata)
            except ValueError as exc:
                raise self._error(f"column '{f.name}': {exc}", hint="cast it in an SQL transform") from exc
            out.append(_Column(f.name, pg, encode))
        missing = [k for k in self.key if k not in {c.name for c in out}]
        if missing:
            raise self._error(f"primary key column(s) {', '.join(missing)} not in the input",
                              hint="select them in the upstream SQL or fix primary_key")
        return out

    def _encode(self, df: DataFrame, columns: list[_Column]) -> DataFrame:
        """Nested values become JSON text and binary becomes ``\\x`` hex in the JVM, so the writers
        only render flat columns."""
        from pyspark.sql import functions as F

        if all(c.encode == "plain" for c in columns):
            return df
        exprs = []
        for name in df.columns:
            col = F.col("`" + name.replace("`", "``") + "`")
            enc = next((c.encode for c in columns if c.name == name), "plain")
            if enc == "json":
                col = F.to_json(col)
            elif enc == "bytea":
                col = F.concat(F.lit("\\x"), F.hex(col))
            exprs.append(col.alias(name))
        return df.select(*exprs)

    def _failure(self, failed: list[Any], writers: int, what: str) -> StreamlingError:
        """The error of the first writer that failed for good, else of the first that failed."""
        first = sorted(failed, key=lambda r: (r["error_kind"] in ("transient", "internal_transient"),
                                              r["partition"]))[0]
        if writers > 1:
            what += f", partition {first['partition']} of {writers}"
            if len(failed) > 1:
                what += f" ({len(failed)} writers failed)"
        return self._classified_error(first["error_kind"], first["sqlstate"], first["detail"], what)

    # -- table and statements ----------------------------------------------------------------------

    def _ensure_table(self, conn: psycopg.Connection[Any], columns: list[_Column]) -> None:
        """Create schema and table if missing; otherwise check that every column fits. Keyless
        sinks also get the table of their per-partition epoch marks."""
        signature = tuple((c.name, c.pg_type) for c in columns)
        if self._verified == signature:
            return
        from psycopg import sql

        from streamling.postgres.columns import ExistingTable

        existing = ExistingTable.describe(conn, self.options.schema_, self.options.table)
        if existing is None:
            defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.pg_type)) for c in columns]
            if self.key:
                defs.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, self.key))))
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.options.schema_)))
                cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    sql.Identifier(self.options.schema_, self.options.table), sql.SQL(", ").join(defs)))
            conn.commit()
            log.info("postgres sink '%s': created table %s", self.name, self.qualified)
        else:
            problems = existing.problems((c.name, c.pg_type) for c in columns)
            if problems:
                raise self._error(f"existing table {self.qualified} does not fit the input: "
                                  + "; ".join(problems), code="postgres_schema_mismatch",
                                  hint="alter or drop the table, or cast the column in an SQL transform")
            if self.key and not existing.has_unique(self.key):
                raise self._error(f"existing table {self.qualified} has no primary key or unique index on "
                                  f"({', '.join(self.key)})", code="postgres_schema_mismatch",
                                  hint="add one (ALTER TABLE … ADD PRIMARY KEY) or fix primary_key")
            conn.commit()
        self._check_update_where(columns)
        if not self.key:
            self._ensure_marks(conn)
        self._verified = signature

    def _check_update_where(self, columns: list[_Column]) -> None:
        names = {c.name for c in columns}
        unknown = [c for c in (self.options.update_where or {}) if c not in names]
        if unknown:
            raise self._error(f"update_where names column(s) not in the input: {', '.join(unknown)}",
                              hint="use columns the sink writes")

    def _statements_for(self, names: list[str]) -> Statements:
        cached = self._statements.get(tuple(names))
        if cached is not None:
            return cached
        from psycopg import sql

        target = sql.Identifier(self.options.schema_, self.options.table)
        cols = sql.SQL(", ").join(map(sql.Identifier, names))
        # Writers' connections outlive a sink (one pool per executor process): the staging table's
        # name says which target and columns it was made for, so a redeployed sink never reuses one
        # of another shape.
        shape = "\0".join([self.options.schema_, self.options.table, *names]).encode()
        stage_name = f"_stl_stage_{hashlib.sha1(shape, usedforsecurity=False).hexdigest()[:16]}"
        stage = sql.Identifier(stage_name)
        create_stage = sql.SQL(
            "CREATE TEMP TABLE {stage} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {target} WITH NO DATA; "
            "ALTER TABLE {stage} ADD COLUMN {d} boolean NOT NULL, ADD COLUMN {r} integer NOT NULL"
        ).format(stage=stage, cols=cols, target=target, d=sql.Identifier(DELETE_COL), r=sql.Identifier(ROUND_COL))
        copy_stage = sql.SQL("COPY {} ({}, {}, {}) FROM STDIN (FORMAT csv)").format(
            stage, cols, sql.Identifier(DELETE_COL), sql.Identifier(ROUND_COL))
        copy_target = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(target, cols)
        insert: sql.Composable = sql.SQL("")
        delete: sql.Composable = sql.SQL("")
        if self.key:
            key = sql.SQL(", ").join(map(sql.Identifier, self.key))
            update_cols = [n for n in names if n not in self.key]
            action: sql.Composable
            if self.options.on_conflict == "nothing" or not update_cols:
                action = sql.SQL("DO NOTHING")
            else:
                sets = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                                          for n in update_cols)
                action = sql.SQL("DO UPDATE SET {}").format(sets)
                conds = [sql.SQL("EXCLUDED.{0} {1} t.{0}").format(sql.Identifier(col), sql.SQL(op.strip()))
                         for col, op in (self.options.update_where or {}).items()]
                if conds:
                    action = sql.SQL("{} WHERE {}").format(action, sql.SQL(" AND ").join(conds))
            insert = sql.SQL(
                "INSERT INTO {target} AS t ({cols}) SELECT {cols} FROM {stage} WHERE NOT {d} AND {r} = %s "
                "ON CONFLICT ({key}) {action}").format(target=target, cols=cols, stage=stage, key=key,
                                                       action=action, d=sql.Identifier(DELETE_COL),
                                                       r=sql.Identifier(ROUND_COL))
            match = sql.SQL(" AND ").join(sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in self.key)
            delete = sql.SQL("DELETE FROM {target} AS t USING {stage} AS s WHERE s.{d} AND s.{r} = %s AND {match}"
                             ).format(target=target, stage=stage, match=match, d=sql.Identifier(DELETE_COL),
                                      r=sql.Identifier(ROUND_COL))
        st = Statements(stage_name, create_stage.as_string(), copy_stage.as_string(), copy_target.as_string(),
                         insert.as_string(), delete.as_string())
        if self.key:
            plain = sql.Identifier(f"{stage_name}_plain")
            st.plain = f"{stage_name}_plain"
            st.create_plain = sql.SQL(
                "CREATE TEMP TABLE {plain} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {target} WITH NO DATA"
            ).format(plain=plain, cols=cols, target=target).as_string()
            st.copy_plain = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(plain, cols).as_string()
            st.insert_plain = sql.SQL(
                "INSERT INTO {target} AS t ({cols}) SELECT {cols} FROM {plain} ON CONFLICT ({key}) {action}"
            ).format(target=target, cols=cols, plain=plain, key=key, action=action).as_string()
        self._statements[tuple(names)] = st
        return st

    # -- keyless replay protection -------------------------------------------------------------------

    def _ensure_marks(self, conn: psycopg.Connection[Any]) -> None:
        """The marks table of keyless sinks: the last epoch each (sink token, sink, target,
        partition) wrote. Created here on the driver so the writers only read and upsert it."""
        from psycopg import sql

        with conn.cursor() as cur:
            cur.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink_token TEXT NOT NULL, sink TEXT NOT NULL, target TEXT NOT NULL, "
                "partition_id INTEGER NOT NULL, epoch_id BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT "
                "now(), PRIMARY KEY (sink_token, sink, target, partition_id))"
            ).format(sql.Identifier(self.options.schema_, PARTITION_MARKS_TABLE)))
            cur.execute("SELECT to_regclass(%s) IS NOT NULL",
                        (sql.Identifier(self.options.schema_, EPOCHS_TABLE).as_string(),))
            row = cur.fetchone()
        conn.commit()
        self._legacy_marks = bool(row and row[0])

    def _marks(self, epoch: Epoch) -> Marks | None:
        if not epoch.sink_token:
            return None
        from psycopg import sql

        marks = sql.Identifier(self.options.schema_, PARTITION_MARKS_TABLE)
        legacy = ""
        if self._legacy_marks:
            legacy = sql.SQL("SELECT epoch_id FROM {} WHERE sink_token = %s AND sink = %s AND target = %s").format(
                sql.Identifier(self.options.schema_, EPOCHS_TABLE)).as_string()
        return Marks(
            check=sql.SQL("SELECT epoch_id FROM {} WHERE sink_token = %s AND sink = %s AND target = %s AND "
                          "partition_id = %s FOR UPDATE").format(marks).as_string(),
            check_legacy=legacy,
            mark=sql.SQL("INSERT INTO {} (sink_token, sink, target, partition_id, epoch_id) "
                         "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (sink_token, sink, target, partition_id) "
                         "DO UPDATE SET epoch_id = EXCLUDED.epoch_id, updated_at = now()").format(marks).as_string(),
            args=(epoch.sink_token, self.name, self.options.table), epoch_id=epoch.epoch_id)

    # -- connection and errors ----------------------------------------------------------------------

    def _pool_settings(self) -> PoolSettings:
        from streamling.postgres import PoolSettings

        return PoolSettings.from_sink(self.conn_settings)

    def _connections(self) -> PostgresPool:
        if self._pool is None:
            from streamling.postgres import PostgresPool

            self._pool = PostgresPool(
                self.conn_settings.conninfo(), target=self.target, describe=f"{NODE_KIND} '{self.name}'",
                application_name=f"streamling:{self.name}", settings=self._pool_settings())
        return self._pool

    def _run(self, what: str, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``action`` on the driver's pooled connection (table DDL). Failures are classified,
        never retried here: the flow retries transient ones with its policy (one connection attempt
        per flow attempt)."""
        import psycopg

        try:
            with self._connections().connection() as conn:
                return action(conn)
        except psycopg.Error as exc:
            raise self._classified_error(*classify(exc, self.conn_settings.pass_), what) from exc

    def _classified_error(self, kind: str, sqlstate: str | None, detail: str, what: str) -> StreamlingError:
        """The sink's error for a failure classified by ``classify`` (on the driver or in a writer)."""
        from streamling.postgres import SINK_LOGIN_HINT

        prefix = f"SQLSTATE {sqlstate}: " if sqlstate else ""
        if kind == "auth":
            return self._error(
                f"Postgres at {self.target} refused the login of user '{self.conn_settings.user}' ({what}): "
                f"{prefix}{detail}",
                code="postgres_auth", hint=SINK_LOGIN_HINT)
        if kind == "transient":
            return self._error(
                f"cannot write to Postgres at {self.target} ({what}): {prefix}{detail}",
                retriable=True, code="postgres_unavailable",
                hint=f"check that Postgres is running and reachable at {self.target} (postgres_sink host/port/db "
                     f"or STREAMLING__POSTGRES_SINK_CONNECTIONS__… for this sink); the epoch is replayed on restart")
        if kind.startswith("internal"):
            return self._error(f"{what} failed in its writer: {detail}", user=False, code="internal",
                               retriable=kind == "internal_transient",
                               hint="this is a bug in streamling; the epoch is replayed on restart")
        return self._error(
            f"Postgres at {self.target} rejected {what} on {self.qualified}: {prefix}{detail}",
            code="postgres_error", hint="fix the table or the data (this error is not retried)")

    def _error(self, message: str, **kwargs: Any) -> StreamlingError:
        return StreamlingError(message, node=self.name, node_kind=NODE_KIND, **kwargs)
