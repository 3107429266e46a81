"""``postgres_aggregate`` sink: rows land in a table, and Postgres folds them into aggregates.

Streamling's design: each epoch's rows are written to an append-only *landing* table (the input
columns, ``_gs_op`` and ``_gs_checkpoint_epoch``, keyed by (primary key, ``_gs_op``)); a
statement-level ``AFTER INSERT … REFERENCING NEW TABLE`` trigger runs the generated function
``"<schema>"."<landing>_to_<agg>_fn"``, which groups the inserted rows and upserts the *aggregate*
table: ``sum``/``avg`` add values (subtract on ``d``), ``count`` adds 1 for ``i``, 0 for ``u`` and
−1 for ``d``, ``min``/``max`` take inserts only; ``avg`` keeps ``<name>_sum`` and ``<name>_count``
and exposes ``<name>`` as a generated column. Without ``group_by`` one row with ``key = 1`` holds
the totals.

Landing dedup is Streamling's: rows go in with ``INSERT … ON CONFLICT (key, _gs_op) DO UPDATE``,
and the trigger's transition table holds only rows actually inserted, so a (key, op) already in the
landing table is not counted again. The landing table keeps the previous epoch's rows (Streamling
deletes epoch N-1 at the finalizer of N; here the write of epoch N+1 deletes them in its own
transaction, which nothing in between can observe), so an op repeated for a key in two
consecutive epochs counts once, and twice when an epoch lies between. Within an epoch the last row
per (key, op) is kept.

Replays never count twice: the landing rows, the aggregate change and the epoch's mark in
``<schema>._streamling_sink_epochs`` commit in one transaction, and an epoch already marked for
this (sink token, sink) is skipped when Spark re-runs it after a crash. A new sink token (a fresh
checkpoint, a hybrid phase) starts with an empty landing window. The DDL is generated without
connecting (``--dry-run``).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

from psycopg import sql
from pydantic import BaseModel, ConfigDict, Field, field_validator

from streamling.errors import StreamlingError
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink, TargetReader
from streamling.sinks.postgres import EPOCHS_TABLE
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamling.postgres import PostgresPool

log = logging.getLogger(__name__)

NODE_KIND = "postgres_aggregate sink"
EPOCH_COL = "_gs_checkpoint_epoch"
SENTINEL = "key"


class AggregateGroupBy(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: str | None = Field(default=None, alias="from")
    type: str | None = Field(default=None, description="Postgres type of the column in the aggregate table")


class AggregateColumn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: str | None = Field(default=None, alias="from")
    fn: Literal["sum", "count", "avg", "min", "max"]
    type: str | None = Field(default=None, description="Postgres type of the aggregate, e.g. numeric(30,5)")

    @field_validator("fn", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


class PostgresAggregateSinkOptions(FromNodeOptions):
    """Rows land in an append-only table; a statement-level trigger folds them into aggregates."""

    type: Literal["postgres_aggregate"] = "postgres_aggregate"
    schema_: str = Field(default="public", alias="schema")
    landing_table: str
    agg_table: str
    group_by: dict[str, AggregateGroupBy] = Field(default_factory=dict)
    aggregate: dict[str, AggregateColumn] = Field(min_length=1)
    deduplicate: bool = True

    @field_validator("group_by", mode="before")
    @classmethod
    def _group_by_none(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ({} if v is None else v) for k, v in value.items()}
        return value


def _q(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def _list(parts: Iterable[sql.Composable]) -> sql.Composed:
    return sql.SQL(", ").join(parts)


def _names(names: Iterable[str]) -> sql.Composed:
    return _list(sql.Identifier(n) for n in names)


class PostgresAggregateSink(Sink[PostgresAggregateSinkOptions]):
    primary_key_reason = "the landing table's rows are keyed by it"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.conn_settings = ctx.settings.postgres_connection_for(ctx.name)
        self.target = f"{self.conn_settings.host}:{self.conn_settings.port}/{self.conn_settings.db}"
        schema = self.options.schema_
        self.schema = sql.Identifier(schema)
        self.landing = sql.Identifier(schema, self.options.landing_table)
        self.agg = sql.Identifier(schema, self.options.agg_table)
        stem = f"{self.options.landing_table}_to_{self.options.agg_table}"
        self.function = sql.Identifier(schema, stem + "_fn")
        self.trigger = sql.Identifier(stem + "_trigger")

        self._pool: PostgresPool | None = None
        self._columns: list[tuple[str, str]] | None = None  # landing data columns and Postgres types

    def ineffective_keys(self) -> dict[str, str]:
        out = super().ineffective_keys()
        if not self.options.deduplicate:
            out["deduplicate"] = ("the landing table holds one row per (primary key, _gs_op) and epoch, so the last "
                                  "row of each is always the one written")
        return out

    # --- DDL ------------------------------------------------------------------------------------

    def _landing_columns(self, schema: StructType) -> list[tuple[str, str]]:
        from streamling.postgres.columns import pg_type_for

        out = []
        for field in schema.fields:
            if field.name == GS_OP:
                continue
            try:
                out.append((field.name, pg_type_for(field.dataType, field.metadata)[0]))
            except ValueError as exc:
                raise self.ctx.error(f"column '{field.name}': {exc}", code="postgres_type",
                                     hint="cast it in an SQL transform") from exc
        names = [n for n, _ in out]
        wanted = list(self.ctx.primary_key) + [g.from_ or name for name, g in self.options.group_by.items()] + \
            [a.from_ or name for name, a in self.options.aggregate.items() if a.fn != "count" or a.from_]
        missing = sorted({c for c in wanted if c not in names})
        if missing:
            raise self.ctx.error(f"column(s) {missing} are not in the input; it has {names}",
                                 code="aggregate_column_missing",
                                 hint="select them upstream, or fix primary_key / group_by / aggregate 'from'")
        return out

    def ddl(self, schema: StructType) -> list[sql.Composed]:
        """Every statement that prepares the tables, the function and the trigger. Names are
        identifiers (psycopg quotes them); the column types are Postgres type names, the user's own
        for ``type`` (e.g. ``numeric(30,5)``)."""
        columns = self._landing_columns(schema)
        types = dict(columns)
        key = list(self.ctx.primary_key)
        op = _q(GS_OP)
        stmts = [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(self.schema),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, {} TEXT NOT NULL, {} BIGINT NOT NULL, PRIMARY KEY ({}))")
            .format(self.landing, _list(sql.SQL("{} {}").format(_q(n), sql.SQL(t)) for n, t in columns), op,
                    _q(EPOCH_COL), _names([*key, GS_OP])),
        ]
        groups = self.options.group_by or {}
        group_cols: list[tuple[str, str, sql.Composable]] = [
            (name, g.type or types[g.from_ or name], _q(g.from_ or name)) for name, g in groups.items()] \
            or [(SENTINEL, "INTEGER", sql.SQL("1"))]
        agg_cols: list[sql.Composable] = [sql.SQL("{} {} NOT NULL").format(_q(n), sql.SQL(t)) for n, t, _ in group_cols]
        inserts: list[tuple[str, sql.Composable]] = []  # (column, expression over new_table)
        updates: list[sql.Composable] = []

        def add(name: str) -> sql.Composable:  # a running total: the old value plus the epoch's
            return sql.SQL("{0} = COALESCE(a.{0}, 0) + COALESCE(EXCLUDED.{0}, 0)").format(_q(name))

        for name, agg in self.options.aggregate.items():
            source = _q(agg.from_ or name)
            signed = sql.SQL("CASE WHEN {op} = 'd' THEN -{v} ELSE {v} END").format(op=op, v=source)
            if agg.fn == "count":
                agg_cols.append(sql.SQL("{} {} NOT NULL DEFAULT 0").format(_q(name), sql.SQL(agg.type or "BIGINT")))
                inserts.append((name, sql.SQL("SUM(CASE {} WHEN 'i' THEN 1 WHEN 'd' THEN -1 ELSE 0 END)").format(op)))
                updates.append(sql.SQL("{0} = a.{0} + EXCLUDED.{0}").format(_q(name)))
            elif agg.fn == "sum":
                agg_cols.append(sql.SQL("{} {}").format(_q(name), sql.SQL(agg.type or "NUMERIC")))
                inserts.append((name, sql.SQL("SUM({})").format(signed)))
                updates.append(add(name))
            elif agg.fn == "avg":
                total, count = f"{name}_sum", f"{name}_count"
                agg_cols += [sql.SQL("{} NUMERIC").format(_q(total)),
                             sql.SQL("{} BIGINT NOT NULL DEFAULT 0").format(_q(count)),
                             sql.SQL("{} {} GENERATED ALWAYS AS (CASE WHEN {c} = 0 THEN NULL ELSE {t} / {c} END) "
                                     "STORED").format(_q(name), sql.SQL(agg.type or "NUMERIC"), c=_q(count),
                                                      t=_q(total))]
                inserts += [(total, sql.SQL("SUM({})").format(signed)),
                            (count, sql.SQL("SUM(CASE WHEN {v} IS NULL THEN 0 WHEN {op} = 'i' THEN 1 "
                                            "WHEN {op} = 'd' THEN -1 ELSE 0 END)").format(v=source, op=op))]
                updates += [add(total), sql.SQL("{0} = a.{0} + EXCLUDED.{0}").format(_q(count))]
            else:  # min / max: inserts only (Streamling: for insert-only streams)
                agg_cols.append(sql.SQL("{} {}").format(_q(name), sql.SQL(agg.type or types[agg.from_ or name])))
                fn, pick = ("MIN", "LEAST") if agg.fn == "min" else ("MAX", "GREATEST")
                inserts.append((name, sql.SQL(fn + "({}) FILTER (WHERE {} = 'i')").format(source, op)))
                updates.append(sql.SQL("{0} = " + pick + "(a.{0}, EXCLUDED.{0})").format(_q(name)))
        group_names = _names(n for n, _, _ in group_cols)
        stmts.append(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))").format(
            self.agg, _list(agg_cols), group_names))
        select = _list([expr for _, _, expr in group_cols] + [expr for _, expr in inserts])
        group_by = sql.SQL(", ".join(str(i + 1) for i in range(len(group_cols))))
        stmts.append(sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$\n"
            "BEGIN\n"
            "  INSERT INTO {agg} AS a ({groups}, {columns})\n"
            "  SELECT {select} FROM new_table GROUP BY {group_by}\n"
            "  ON CONFLICT ({groups}) DO UPDATE SET {updates};\n"
            "  RETURN NULL;\n"
            "END\n$fn$").format(fn=self.function, agg=self.agg, groups=group_names,
                                 columns=_names(c for c, _ in inserts), select=select, group_by=group_by,
                                 updates=_list(updates)))
        stmts.append(sql.SQL("CREATE OR REPLACE TRIGGER {} AFTER INSERT ON {} REFERENCING NEW TABLE AS new_table "
                             "FOR EACH STATEMENT EXECUTE FUNCTION {}()").format(self.trigger, self.landing,
                                                                                 self.function))
        return stmts

    def ddl_statements(self) -> list[str]:
        schema = self.ctx.input_schema
        return [statement.as_string() for statement in self.ddl(schema)] if schema is not None else []

    # --- lifecycle ------------------------------------------------------------------------------

    def _connections(self) -> PostgresPool:
        if self._pool is None:
            from streamling.postgres import PoolSettings, PostgresPool

            self._pool = PostgresPool(
                self.conn_settings.conninfo(), target=self.target, describe=f"{NODE_KIND} '{self.name}'",
                application_name=f"streamling:{self.name}", settings=PoolSettings.from_sink(self.conn_settings))
        return self._pool

    def _run(self, what: str, action: Any) -> Any:
        import psycopg

        from streamling.postgres import (
            SINK_LOGIN_HINT,
            first_line,
            is_authentication_failure,
            is_transient,
            mask,
            sqlstate_prefix,
        )

        try:
            with self._connections().connection() as conn:
                return action(conn)
        except psycopg.Error as exc:
            detail = mask(first_line(exc), [self.conn_settings.pass_])
            if is_authentication_failure(exc):
                raise StreamlingError(
                    f"Postgres at {self.target} refused the login of user '{self.conn_settings.user}' ({what}): "
                    f"{sqlstate_prefix(exc)}{detail}", node=self.name, node_kind=NODE_KIND, code="postgres_auth",
                    hint=SINK_LOGIN_HINT) from exc
            transient = is_transient(exc)
            raise StreamlingError(
                f"{what} on Postgres at {self.target} failed: {sqlstate_prefix(exc)}{detail}", node=self.name,
                node_kind=NODE_KIND, retriable=transient,
                code="postgres_unavailable" if transient else "postgres_error",
                hint=None if transient else "fix the tables or the data (this error is not retried)") from exc

    def open(self, spark: SparkSession) -> None:
        schema = self.ctx.input_schema
        if schema is None:
            return
        statements = self.ddl(schema)
        self._columns = self._landing_columns(schema)

        def prepare(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction(), conn.cursor() as cur:
                # One preparer at a time: CREATE OR REPLACE of a function/trigger races otherwise.
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.landing.as_string(),))
                for statement in statements:
                    cur.execute(statement)

        self._run(f"preparing {self.landing.as_string()} and {self.agg.as_string()}", prepare)
        log.info("postgres_aggregate sink '%s' lands rows in %s and aggregates them into %s", self.name,
                 self.landing.as_string(), self.agg.as_string())

    def read_back(self, spark: SparkSession) -> TargetReader:
        from streamling.postgres.table_reader import PostgresTableReader

        groups = list(self.options.group_by) or ["key"]  # no group_by: one row with key = 1
        return PostgresTableReader(self.name, self.conn_settings, self.target, str(self.options.schema_),
                                   str(self.options.agg_table), lambda: groups)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # --- writing --------------------------------------------------------------------------------

    def _collect(self, df: DataFrame) -> pa.Table:
        from pyspark.sql import functions as F

        from streamling.sinks.common import arrow_ops, last_rows

        assert self._columns is not None
        cols = []
        for name, pg_type in self._columns:
            col = F.col(f"`{name}`")
            cols.append(F.to_json(col).alias(name) if pg_type == "JSONB" else col)
        if GS_OP in df.columns:
            cols.append(F.col(GS_OP))
        return last_rows(arrow_ops(df.select(*cols).toArrow()), [*self.ctx.primary_key, GS_OP])

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        if self._columns is None:
            self.ctx.input_schema = self.ctx.input_schema or df.schema
            self.open(df.sparkSession)
        table = self._collect(df)
        if table.num_rows == 0:
            return 0
        import pyarrow as pa
        import pyarrow.csv as pacsv

        table = table.append_column(EPOCH_COL, pa.repeat(pa.scalar(epoch.epoch_id, pa.int64()), table.num_rows))
        buf = io.BytesIO()
        pacsv.write_csv(table, buf, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
        payload = buf.getvalue()
        names = _names(table.column_names)
        marks = sql.Identifier(self.options.schema_, EPOCHS_TABLE)
        stage = _q(f"_stl_stage_{self.options.schema_}_{self.options.landing_table}"[:63])
        key = _names([*self.ctx.primary_key, GS_OP])
        refresh = _list(sql.SQL("{0} = EXCLUDED.{0}").format(_q(n)) for n in table.column_names
                        if n not in (*self.ctx.primary_key, GS_OP))

        def land(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (sink_token TEXT NOT NULL, sink TEXT NOT NULL, "
                                    "target TEXT NOT NULL, epoch_id BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL "
                                    "DEFAULT now(), PRIMARY KEY (sink_token, sink, target))").format(marks))
                mark = (epoch.sink_token, self.name, self.options.landing_table)
                cur.execute(sql.SQL("SELECT epoch_id FROM {} WHERE sink_token = %s AND sink = %s AND target = %s "
                                    "FOR UPDATE").format(marks), mark)
                row = cur.fetchone()
                if epoch.sink_token and row is not None and row[0] >= epoch.epoch_id:
                    return False  # this epoch's rows were already counted
                if epoch.sink_token and row is not None:  # keep the previous epoch: Streamling's dedup window
                    cur.execute(sql.SQL("DELETE FROM {} WHERE {} <> %s").format(self.landing, _q(EPOCH_COL)),
                                (row[0],))
                else:
                    cur.execute(sql.SQL("DELETE FROM {}").format(self.landing))
                cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) ON COMMIT DELETE ROWS").format(
                    stage, self.landing))
                with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(stage, names)) as copy:
                    copy.write(payload)
                cur.execute(sql.SQL("INSERT INTO {landing} ({names}) SELECT {names} FROM {stage} ON CONFLICT ({key}) "
                                    "DO UPDATE SET {refresh}").format(landing=self.landing, names=names, stage=stage,
                                                                      key=key, refresh=refresh))
                if epoch.sink_token:
                    cur.execute(sql.SQL("INSERT INTO {} (sink_token, sink, target, epoch_id) VALUES (%s, %s, %s, %s) "
                                        "ON CONFLICT (sink_token, sink, target) DO UPDATE SET "
                                        "epoch_id = EXCLUDED.epoch_id, updated_at = now()").format(marks),
                                (*mark, epoch.epoch_id))
                return True

        written = self._run(f"writing epoch {epoch.epoch_id} into {self.landing.as_string()}", land)
        if not written:
            log.info("postgres_aggregate sink '%s': epoch %d was already counted; skipped", self.name, epoch.epoch_id)
        return table.num_rows
