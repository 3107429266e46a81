"""``postgres`` sink: upserts each micro-batch into a Postgres table, honouring ``_gs_op``.

Semantics follow Streamling's sink: the schema and table are created from the input's Spark schema
(nested values as JSONB, ``_gs_op`` not stored); ``d`` rows delete by primary key, every other row
(``i``, ``u`` or a null op) is ``INSERT … ON CONFLICT (pk) DO UPDATE`` (or ``DO NOTHING``), with
``update_where`` conditions ANDed as ``EXCLUDED.col op t.col``; without a key rows are plain inserts.

Why this shape: a batch is collected once as Arrow on the driver, the last row per key is kept (the
first with ``on_conflict: nothing``, as Streamling does), then the rows go through one ``COPY`` (CSV written by
Arrow's C++ writer) into a temporary staging table followed by one ``DELETE … USING`` and one
``INSERT … SELECT … ON CONFLICT``, all in a single transaction. That is far faster than row-wise
statements and makes a replayed epoch converge to the same table. Keyless tables record the last
written epoch in ``<schema>._streamling_sink_epochs`` inside the same transaction, so a replay does
not insert twice.

Failures are classified (``streamling.postgres.is_transient``), never retried here: the flow owns
the retry policy, so an outage costs exactly its attempts.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from streamling.errors import StreamlingError
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink
from streamling.spec.nodes import PostgresSinkOptions
from streamling.spec.types import from_spark

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

    from streamling.postgres import PostgresPool

log = logging.getLogger(__name__)
T = TypeVar("T")

NODE_KIND = "postgres sink"
DELETE_COL = "_stl_del"
ROUND_COL = "_stl_round"
EPOCHS_TABLE = "_streamling_sink_epochs"
STAGES_ATTR = "_stl_stages"  # temp tables created on a connection (they live as long as it does)


# --- Spark → Postgres types ----------------------------------------------------------------------

@dataclass(frozen=True)
class _Column:
    """One stored column: its Postgres type and how the batch is shaped before the COPY."""

    name: str
    pg_type: str
    encode: str  # "plain" | "json" (to_json in Spark) | "bytea" (hex text in Spark)


def pg_type_for(data_type: DataType, metadata: dict[str, Any] | None = None) -> tuple[str, str]:
    """The Postgres column type for a Spark type and the Spark-side encoding it needs.

    Scalars map as their Streamling type does (``streamling.spec.types``): a wide decimal, carried
    as exact text tagged in ``metadata``, becomes ``NUMERIC(p,s)`` and its text is copied as is."""
    from pyspark.sql import types as T

    kind = from_spark(data_type, metadata)
    if kind is not None:
        return kind.postgres(), "plain"
    simple: list[tuple[type, str]] = [(T.DateType, "DATE"), (T.TimestampNTZType, "TIMESTAMP"), (T.NullType, "TEXT")]
    for spark_type, pg in simple:
        if isinstance(data_type, spark_type):
            return pg, "plain"
    if isinstance(data_type, T.BinaryType):
        return "BYTEA", "bytea"
    nested: tuple[type, ...] = (T.StructType, T.ArrayType, T.MapType)
    variant = getattr(T, "VariantType", None)
    if variant is not None:
        nested += (variant,)
    if isinstance(data_type, nested):
        return "JSONB", "json"
    raise ValueError(f"Spark type {data_type.simpleString()} has no Postgres mapping")


_INT_RANK = {"smallint": 1, "integer": 2, "bigint": 3}
_INT_DIGITS = {"smallint": 5, "integer": 10, "bigint": 19}  # digits of the largest value
_NUMERIC = re.compile(r"numeric(?:\((\d+)(?:,(\d+))?\))?$")
_TIMESTAMP = re.compile(r"timestamp(?:\((\d+)\))? with(?:out)? time zone$")
_TEXTUAL = {"text", "uuid", "json", "jsonb", "citext", "name"}


def _numeric_holds(actual: str, int_digits: int, scale: int) -> bool:
    """Can a Postgres ``numeric`` (or, for scale 0, integer) column hold every value with
    ``int_digits`` digits before the point and ``scale`` after it?"""
    if actual in _INT_DIGITS:
        return scale == 0 and int_digits <= _INT_DIGITS[actual] - 1
    m = _NUMERIC.match(actual)
    if not m:
        return False
    if m.group(1) is None:
        return True
    precision, actual_scale = int(m.group(1)), int(m.group(2) or 0)
    return actual_scale >= scale and precision - actual_scale >= int_digits


def compatible(expected: str, actual: str) -> bool:
    """Whether an existing column of type ``actual`` (``format_type`` text) can store the values the
    sink would put in ``expected`` without losing range or precision. The sink never coerces."""
    exp, act = expected.lower(), actual.lower()
    if exp in _INT_RANK:
        if act in _INT_RANK:
            return _INT_RANK[act] >= _INT_RANK[exp]
        return _NUMERIC.match(act) is not None and _numeric_holds(act, _INT_DIGITS[exp], 0)
    m = _NUMERIC.match(exp)
    if m:
        precision, scale = int(m.group(1) or 38), int(m.group(2) or 0)
        return _numeric_holds(act, precision - scale, scale)
    if exp == "real":
        return act in {"real", "double precision", "numeric"}
    if exp == "double precision":
        return act in {"double precision", "numeric"}
    if exp == "text":
        return act in _TEXTUAL or act.startswith("character")
    if exp in {"timestamptz", "timestamp"}:
        ts = _TIMESTAMP.match(act)
        return ts is not None and int(ts.group(1) or 6) >= 6
    if exp == "date":
        return act == "date" or _TIMESTAMP.match(act) is not None
    if exp == "jsonb":
        return act in {"jsonb", "json", "text"}
    return exp == act


# --- the sink ------------------------------------------------------------------------------------

@dataclass
class _Statements:
    """SQL for one column set, built once and reused for every batch with the same columns."""

    stage: str
    create_stage: str
    copy_stage: str
    copy_target: str
    insert: str
    delete: str
    # The common epoch (inserts and updates only, one row per key) skips the op and round columns.
    plain: str = ""
    create_plain: str = ""
    copy_plain: str = ""
    insert_plain: str = ""


class PostgresSink(Sink[PostgresSinkOptions]):
    """Writes each epoch to ``schema.table`` in one transaction; see the module docstring."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.key: list[str] = list(ctx.primary_key)
        self.conn_settings = ctx.settings.postgres_connection_for(ctx.name)
        self.target = f"{self.conn_settings.host}:{self.conn_settings.port}/{self.conn_settings.db}"
        self.qualified = f'"{self.options.schema_}"."{self.options.table}"'
        self._pool: PostgresPool | None = None
        self._verified: tuple[tuple[str, str], ...] | None = None  # column set checked against table
        self._statements: dict[tuple[str, ...], _Statements] = {}
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

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- writing -----------------------------------------------------------------------------------

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        columns = self._columns(df.schema)
        table = self._collect(df, columns)
        rows = table.num_rows
        if rows == 0:
            if self._verified is None:
                self._run("creating the table", lambda conn: self._ensure_table(conn, columns))
            return 0
        deletes, table = self._split_ops(table)
        payload, stats = self._shape(table, deletes, [c.name for c in columns])
        self._run(f"writing epoch {epoch.epoch_id}",
                  lambda conn: self._write_batch(conn, columns, payload, stats, epoch))
        log.debug("postgres sink '%s' epoch %s: %d rows (%d upserts, %d deletes, %d rounds)", self.name,
                  epoch.epoch_id, rows, stats["upserts"], stats["deletes"], stats["rounds"])
        return rows

    def _columns(self, schema: StructType) -> list[_Column]:
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

    def _collect(self, df: DataFrame, columns: list[_Column]) -> pa.Table:
        """The batch as Arrow; nested values become JSON text and binary becomes ``\\x`` hex in the
        JVM, so the driver only serialises flat columns."""
        from pyspark.sql import functions as F

        if any(c.encode != "plain" for c in columns):
            exprs = []
            for name in df.columns:
                col = F.col("`" + name.replace("`", "``") + "`")
                enc = next((c.encode for c in columns if c.name == name), "plain")
                if enc == "json":
                    col = F.to_json(col)
                elif enc == "bytea":
                    col = F.concat(F.lit("\\x"), F.hex(col))
                exprs.append(col.alias(name))
            df = df.select(*exprs)
        return df.toArrow()

    def _split_ops(self, table: pa.Table) -> tuple[pa.Array, pa.Table]:
        """A boolean delete mask from ``_gs_op`` (``d``, any case) and the table without it."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if GS_OP not in table.column_names:
            return pa.array(np.zeros(table.num_rows, dtype=bool)), table
        ops = table.column(GS_OP)
        if not pa.types.is_string(ops.type) and not pa.types.is_large_string(ops.type):
            ops = ops.cast(pa.string())
        mask = pc.fill_null(pc.equal(pc.utf8_lower(pc.utf8_trim_whitespace(ops)), "d"), False)
        return mask.combine_chunks(), table.drop_columns([GS_OP])

    def _shape(self, table: pa.Table, deletes: pa.Array, names: list[str]) -> tuple[bytes, dict[str, int]]:
        """Dedup (last row per key wins, order kept; the first with ``on_conflict: nothing``), assign
        rounds, and render the COPY payload.

        With ``deduplicate: false`` a key can appear several times; its rows are then applied in
        order, one *round* per occurrence, so the result matches row-by-row application.
        """
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.csv as pacsv

        n = table.num_rows
        rounds = np.zeros(n, dtype=np.int32)
        # One key column whose values are already distinct (the common epoch) needs no grouping.
        unique = len(self.key) == 1 and pc.count_distinct(table.column(self.key[0]), mode="all").as_py() == n
        if self.key and not unique:
            idx = pa.array(np.arange(n, dtype=np.int64))
            keyed = pa.table([table.column(k) for k in self.key] + [idx], names=[*self.key, "__i"])
            last = keyed.group_by(self.key, use_threads=False).aggregate([("__i", "max")])
            if last.num_rows != n:
                if self.options.deduplicate and self.options.on_conflict == "nothing":
                    take, rounds = self._first_wins(table, deletes)
                    table, deletes = table.take(pa.array(take)), pc.take(deletes, pa.array(take))
                    n = table.num_rows
                elif self.options.deduplicate:
                    keep = pc.sort_indices(last.column("__i_max"))
                    take = pc.take(last.column("__i_max"), keep)
                    table, deletes = table.take(take), pc.take(deletes, take)
                    n = table.num_rows
                    rounds = np.zeros(n, dtype=np.int32)
                else:
                    seen: dict[tuple[Any, ...], int] = {}
                    keys = zip(*(table.column(k).to_pylist() for k in self.key), strict=True)
                    for i, k in enumerate(keys):
                        rounds[i] = seen.get(k, 0)
                        seen[k] = rounds[i] + 1
        elif not self.key:
            if pc.any(deletes).as_py():
                if not self._warned_keyless_delete:
                    log.warning("postgres sink '%s' has no primary key: 'd' rows cannot be matched and are "
                                "skipped", self.name)
                    self._warned_keyless_delete = True
                keep_mask = pc.invert(deletes)
                table, deletes = table.filter(keep_mask), pc.filter(deletes, keep_mask)
        n_del = int(pc.sum(deletes).as_py() or 0)
        n_rounds = int(rounds.max()) + 1 if n else 0
        plain = bool(self.key) and n_del == 0 and n_rounds == 1
        shaped = table.select(names)
        if self.key and not plain:
            shaped = shaped.append_column(DELETE_COL, deletes).append_column(ROUND_COL, pa.array(rounds))
        buf = io.BytesIO()
        pacsv.write_csv(shaped, buf, pacsv.WriteOptions(include_header=False))
        stats = {"upserts": table.num_rows - n_del, "deletes": n_del, "rounds": n_rounds, "plain": int(plain)}
        return buf.getvalue(), stats

    def _first_wins(self, table: pa.Table, deletes: pa.Array) -> tuple[Any, Any]:
        """Rows to keep and their rounds under ``on_conflict: nothing``: the first row of a key in the
        epoch wins (later versions would hit ``DO NOTHING`` row by row). A delete resets the key, so
        per key at most its last delete (round 0) and the first upsert after it (round 1) remain."""
        import numpy as np

        flags = deletes.to_pylist()
        chosen: dict[tuple[Any, ...], list[int]] = {}
        keys = zip(*(table.column(k).to_pylist() for k in self.key), strict=True)
        for i, key in enumerate(keys):
            kept = chosen.get(key)
            if flags[i] or kept is None:
                chosen[key] = [i]
            elif len(kept) == 1 and flags[kept[0]]:
                kept.append(i)
        pairs = sorted((i, r) for kept in chosen.values() for r, i in enumerate(kept))
        take = np.fromiter((i for i, _ in pairs), dtype=np.int64, count=len(pairs))
        rounds = np.fromiter((r for _, r in pairs), dtype=np.int32, count=len(pairs))
        return take, rounds

    def _write_batch(self, conn: psycopg.Connection[Any], columns: list[_Column], payload: bytes,
                     stats: dict[str, int], epoch: Epoch) -> None:
        self._ensure_table(conn, columns)
        st = self._statements_for(conn, [c.name for c in columns])
        stages: set[str] = getattr(conn, STAGES_ATTR, set())
        with conn.cursor() as cur:
            if not self.key:
                if self._already_written(cur, epoch):
                    conn.rollback()
                    log.info("postgres sink '%s': epoch %s already written, skipped", self.name, epoch.epoch_id)
                    return
                with cur.copy(st.copy_target) as copy:
                    copy.write(payload)
                self._mark_written(cur, epoch)
            elif stats.get("plain"):
                stage = st.plain
                if stage not in stages:
                    cur.execute(st.create_plain)
                with cur.copy(st.copy_plain) as copy:
                    copy.write(payload)
                cur.execute(st.insert_plain)
            else:
                stage = st.stage
                if stage not in stages:
                    cur.execute(st.create_stage)
                with cur.copy(st.copy_stage) as copy:
                    copy.write(payload)
                for r in range(stats["rounds"]):
                    if stats["deletes"]:
                        cur.execute(st.delete, (r,))
                    if stats["upserts"]:
                        cur.execute(st.insert, (r,))
        conn.commit()
        if self.key:
            stages.add(stage)
            setattr(conn, STAGES_ATTR, stages)

    # -- table and statements ----------------------------------------------------------------------

    def _ensure_table(self, conn: psycopg.Connection[Any], columns: list[_Column]) -> None:
        """Create schema and table if missing; otherwise check that every column fits."""
        signature = tuple((c.name, c.pg_type) for c in columns)
        if self._verified == signature:
            return
        from psycopg import sql

        existing = self._describe(conn)
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
            types, unique_sets = existing
            problems = []
            for c in columns:
                actual = types.get(c.name)
                if actual is None:
                    problems.append(f"column \"{c.name}\" ({c.pg_type}) is missing")
                elif not compatible(c.pg_type, actual):
                    problems.append(f"column \"{c.name}\" is {actual} but the input needs {c.pg_type}")
            if problems:
                raise self._error(f"existing table {self.qualified} does not fit the input: "
                                  + "; ".join(problems), code="postgres_schema_mismatch",
                                  hint="alter or drop the table, or cast the column in an SQL transform")
            if self.key and frozenset(self.key) not in unique_sets:
                raise self._error(f"existing table {self.qualified} has no primary key or unique index on "
                                  f"({', '.join(self.key)})", code="postgres_schema_mismatch",
                                  hint="add one (ALTER TABLE … ADD PRIMARY KEY) or fix primary_key")
            conn.commit()
        self._check_update_where(columns)
        self._verified = signature

    def _describe(self, conn: psycopg.Connection[Any]) -> tuple[dict[str, str], set[frozenset[str]]] | None:
        """Column types (``format_type``) and unique column sets of the target, or None if absent."""
        with conn.cursor() as cur:
            cur.execute(
                "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                (self.options.schema_, self.options.table))
            row = cur.fetchone()
            if row is None:
                conn.commit()
                return None
            oid = row[0]
            cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (oid,))
            types = {name: typ for name, typ in cur.fetchall()}
            cur.execute(
                "SELECT array_agg(a.attname::text) FROM pg_index i "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid", (oid,))
            unique_sets = {frozenset(r[0]) for r in cur.fetchall()}
        return types, unique_sets

    def _check_update_where(self, columns: list[_Column]) -> None:
        names = {c.name for c in columns}
        unknown = [c for c in (self.options.update_where or {}) if c not in names]
        if unknown:
            raise self._error(f"update_where names column(s) not in the input: {', '.join(unknown)}",
                              hint="use columns the sink writes")

    def _statements_for(self, conn: psycopg.Connection[Any], names: list[str]) -> _Statements:
        cached = self._statements.get(tuple(names))
        if cached is not None:
            return cached
        from psycopg import sql

        target = sql.Identifier(self.options.schema_, self.options.table)
        cols = sql.SQL(", ").join(map(sql.Identifier, names))
        stage_name = f"_stl_stage_{len(self._statements)}"
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
        st = _Statements(stage_name, create_stage.as_string(conn), copy_stage.as_string(conn),
                         copy_target.as_string(conn), insert.as_string(conn), delete.as_string(conn))
        if self.key:
            plain = sql.Identifier(f"{stage_name}_plain")
            st.plain = f"{stage_name}_plain"
            st.create_plain = sql.SQL(
                "CREATE TEMP TABLE {plain} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {target} WITH NO DATA"
            ).format(plain=plain, cols=cols, target=target).as_string(conn)
            st.copy_plain = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(plain, cols).as_string(conn)
            st.insert_plain = sql.SQL(
                "INSERT INTO {target} AS t ({cols}) SELECT {cols} FROM {plain} ON CONFLICT ({key}) {action}"
            ).format(target=target, cols=cols, plain=plain, key=key, action=action).as_string(conn)
        self._statements[tuple(names)] = st
        return st

    # -- keyless replay protection -------------------------------------------------------------------

    def _already_written(self, cur: psycopg.Cursor[Any], epoch: Epoch) -> bool:
        """Keyless inserts are not idempotent: remember the last epoch per (sink token, sink)."""
        if not epoch.sink_token:
            return False
        from psycopg import sql

        marks = sql.Identifier(self.options.schema_, EPOCHS_TABLE)
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (sink_token TEXT NOT NULL, sink TEXT NOT NULL, "
                            "target TEXT NOT NULL, epoch_id BIGINT NOT NULL, updated_at TIMESTAMPTZ "
                            "NOT NULL DEFAULT now(), PRIMARY KEY (sink_token, sink, target))").format(marks))
        cur.execute(sql.SQL("SELECT epoch_id FROM {} WHERE sink_token = %s AND sink = %s AND target = %s "
                            "FOR UPDATE").format(marks), (epoch.sink_token, self.name, self.options.table))
        row = cur.fetchone()
        return row is not None and row[0] >= epoch.epoch_id

    def _mark_written(self, cur: psycopg.Cursor[Any], epoch: Epoch) -> None:
        if not epoch.sink_token:
            return
        from psycopg import sql

        cur.execute(sql.SQL(
            "INSERT INTO {} (sink_token, sink, target, epoch_id) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (sink_token, sink, target) DO UPDATE SET epoch_id = EXCLUDED.epoch_id, updated_at = now()"
        ).format(sql.Identifier(self.options.schema_, EPOCHS_TABLE)),
            (epoch.sink_token, self.name, self.options.table, epoch.epoch_id))

    # -- connection and errors ----------------------------------------------------------------------

    def _connections(self) -> PostgresPool:
        if self._pool is None:
            from streamling.postgres import PoolSettings, PostgresPool

            self._pool = PostgresPool(
                self.conn_settings.conninfo(), target=self.target, describe=f"{NODE_KIND} '{self.name}'",
                application_name=f"streamling:{self.name}", settings=PoolSettings.from_sink(self.conn_settings))
        return self._pool

    def _run(self, what: str, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``action`` on a pooled connection. Failures are classified, never retried here: the
        flow retries transient ones with its policy (one connection attempt per flow attempt)."""
        import psycopg

        try:
            with self._connections().connection() as conn:
                return action(conn)
        except psycopg.Error as exc:
            raise self._database_error(exc, what) from exc

    def _database_error(self, exc: BaseException, what: str) -> StreamlingError:
        from streamling.postgres import first_line, is_authentication_failure, is_transient, sqlstate_prefix

        detail = self._mask(first_line(exc))
        if is_authentication_failure(exc):
            return self._error(
                f"Postgres at {self.target} refused the login of user '{self.conn_settings.user}' ({what}): "
                f"{sqlstate_prefix(exc)}{detail}",
                code="postgres_auth",
                hint="check postgres_sink.user/pass (STREAMLING__POSTGRES_SINK__PASS, or "
                     "STREAMLING__POSTGRES_SINK_CONNECTIONS__<SINK>__PASS for this sink); this error is not retried")
        if is_transient(exc):
            return self._error(
                f"cannot write to Postgres at {self.target} ({what}): {sqlstate_prefix(exc)}{detail}",
                retriable=True, code="postgres_unavailable",
                hint=f"check that Postgres is running and reachable at {self.target} (postgres_sink host/port/db "
                     f"or STREAMLING__POSTGRES_SINK_CONNECTIONS__… for this sink); the epoch is replayed on restart")
        return self._error(
            f"Postgres at {self.target} rejected {what} on {self.qualified}: {sqlstate_prefix(exc)}{detail}",
            code="postgres_error", hint="fix the table or the data (this error is not retried)")

    def _error(self, message: str, **kwargs: Any) -> StreamlingError:
        return StreamlingError(message, node=self.name, node_kind=NODE_KIND, **kwargs)

    def _mask(self, text: str) -> str:
        from streamling.postgres import mask

        return mask(text, [self.conn_settings.pass_])
