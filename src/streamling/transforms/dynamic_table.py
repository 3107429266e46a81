"""``dynamic_table`` transform: a set of values that SQL transforms check with ``dynamic_table_check``.

With ``sql`` (one projection, optionally filtered, over one input) each epoch's batch of that
input adds its values to the table *before* the transforms that check it run in the same epoch
(Streamling runs it as a side output of the source; here it is ordered first in the flow's DAG).
Values are only ever added, as in Streamling: the ``sql`` sees every row, ``_gs_op`` included, so
``WHERE _gs_op <> 'd'`` keeps deleted rows out. Removing values is done in the table itself
(Postgres), and a delete there is seen at the next epoch unless the table is cached.

The node's output is the values its ``sql`` selected in the epoch (one column named ``column``),
for sampling and debugging; nothing may read it as rows (validation rejects that).

Backends:

- ``InMemory``: a set held by this process, empty at start, gone when the pipeline stops.
- ``Postgres``: ``<schema>.<backend_entity_name>`` with ``<column> TEXT PRIMARY KEY`` and
  ``<time_column> TIMESTAMPTZ DEFAULT clock_timestamp()`` plus an index on the time column,
  created on first use (schema included). Uncached (default), every epoch that checks the table
  reads its values once; with ``cache`` the set stays in memory and only rows whose time column is
  newer than the last one seen are read, at most every ``cache_refresh_debounce_ms`` (direct
  deletes are then not seen until a restart). Writers serialise on an advisory lock when cached,
  so the time column grows in commit order. ``dynamic_table_backend.postgres.cache_enabled`` leaves
  an existing table without the time column uncached (as Streamling does); a node's own
  ``cache: true`` on such a table is an error.

Postgres failures are classified (``streamling.postgres.is_transient``) and raised, never retried
here: the flow retries the epoch's transforms with its one policy.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from streamling.errors import StreamlingError, first_line
from streamling.runtime.nodes import Epoch, NodeContext, Transform
from streamling.spec.transforms import IDENTIFIER, DynamicTableTransformOptions
from streamling.transforms.sql import UpstreamSql

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame, SparkSession

    from streamling.config.sections import PostgresConnection
    from streamling.postgres import PoolSettings, PostgresPool

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_IDENTIFIER_BYTES = 63  # Postgres truncates longer names silently


def _epoch_key(epoch: Epoch) -> tuple[str, int, float]:
    """One run of one epoch (a replay of the same batch id reads the table again)."""
    return (epoch.flow, epoch.epoch_id, epoch.started_at)


class InMemoryDynamicTable:
    """A set of strings kept by this process for the pipeline's lifetime."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._values: set[str] = set()
        self._snapshot: frozenset[str] | None = frozenset()
        self._lock = threading.Lock()

    def add(self, values: list[str]) -> None:
        with self._lock:
            before = len(self._values)
            self._values.update(values)
            if len(self._values) != before:
                self._snapshot = None

    def members(self, epoch: Epoch) -> frozenset[str]:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = frozenset(self._values)
            return self._snapshot

    def close(self) -> None:
        pass


def index_name(table: str, time_column: str) -> str:
    """``idx_<table>_<time_column>``, kept unique under Postgres's 63-byte limit with a stable hash."""
    raw = f"idx_{table}_{time_column}"
    if len(raw.encode()) <= MAX_IDENTIFIER_BYTES:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return f"{raw[:MAX_IDENTIFIER_BYTES - 17]}_{digest}"


class PostgresDynamicTable:
    """A dynamic table in Postgres on a pooled connection; the table is prepared on first use.

    ``stats`` counts the statements sent (``reads``: lookups of members, ``writes``: batches of
    inserted values), so a test or a benchmark can check that lookups are one per epoch.
    """

    def __init__(self, node: str, connection: PostgresConnection, schema: str, table: str, column: str,
                 time_column: str, *, cache: bool | None, cache_default: bool = False, debounce_ms: int,
                 max_batch_size: int, pool: PoolSettings) -> None:
        from psycopg import sql

        if not IDENTIFIER.match(schema):
            raise StreamlingError(f"schema {schema!r} (dynamic_table_backend.postgres.dt_schema_name or the node's "
                                  "'schema') is not a plain identifier", node=node,
                                  node_kind="dynamic_table transform", code="config_invalid",
                                  hint="use letters, digits and _ (not starting with a digit)")
        self.node = node
        self.connection = connection
        self.schema, self.table, self.column, self.time_column = schema, table, column, time_column
        self.qualified = f"{schema}.{table}"
        self.target = f"{connection.host}:{connection.port}"
        self.cache_explicit = cache is not None  # the node asked; the backend default may yield
        self.cache_enabled = cache if cache is not None else cache_default
        self.debounce_ms = debounce_ms
        self.max_batch_size = max_batch_size
        self.pool_settings = pool
        self.stats = {"reads": 0, "writes": 0}
        self._lock = threading.RLock()
        self._pool: PostgresPool | None = None
        self._has_time_column = True
        self._ready = False
        self._snapshot: tuple[tuple[str, int, float], frozenset[str]] | None = None
        self._cached: set[str] | None = None
        self._watermark: Any = None
        self._refreshed_at = 0.0
        self._ident = sql.Identifier(schema, table)

    # -- the two operations ----------------------------------------------------------------------

    def add(self, values: list[str]) -> None:
        """Insert the values not yet present (``ON CONFLICT DO NOTHING``), ``max_batch_size`` per statement."""
        if not values:
            return
        from psycopg import sql

        chunks = [values[i:i + self.max_batch_size] for i in range(0, len(values), self.max_batch_size)]

        def write(conn: psycopg.Connection[Any]) -> None:
            columns = [sql.Identifier(self.column)]
            selected = [sql.SQL("v")]
            if self._has_time_column:  # known once connected: a user's table may have none
                columns.append(sql.Identifier(self.time_column))
                selected.append(sql.SQL("clock_timestamp()"))
            insert = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM unnest(%s::text[]) AS v ON CONFLICT ({}) DO NOTHING"
                             ).format(self._ident, sql.SQL(", ").join(columns), sql.SQL(", ").join(selected),
                                      sql.Identifier(self.column))
            with conn.transaction():
                if self.cache_enabled:  # commit order = time order, for the incremental refresh
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (self.qualified,))
                for chunk in chunks:
                    conn.execute(insert, (chunk,))
                    self.stats["writes"] += 1

        self._run(f"adding {len(values)} value(s)", write)
        with self._lock:
            if self._cached is not None:
                self._cached.update(values)
            self._snapshot = None

    def members(self, epoch: Epoch) -> frozenset[str]:
        """The values to check against in ``epoch``: read once per epoch, or from the cache."""
        key = _epoch_key(epoch)
        with self._lock:
            if self._snapshot is not None and self._snapshot[0] == key:
                return self._snapshot[1]
            values = self._refresh_cache() if self.cache_enabled else self._read_all()
            self._snapshot = (key, values)
            return values

    def _read_all(self) -> frozenset[str]:
        from psycopg import sql

        query = sql.SQL("SELECT {} FROM {} WHERE {} IS NOT NULL").format(
            sql.Identifier(self.column), self._ident, sql.Identifier(self.column))

        def read(conn: psycopg.Connection[Any]) -> frozenset[str]:
            self.stats["reads"] += 1
            with conn.cursor() as cur:
                cur.execute(query)
                return frozenset(str(row[0]) for row in cur)

        return self._run("reading the values", read)

    def _refresh_cache(self) -> frozenset[str]:
        """Rows newer than the last time-column value seen, at most once per debounce window."""
        from psycopg import sql

        now = time.monotonic()
        if self._cached is not None and (now - self._refreshed_at) * 1000 < self.debounce_ms:
            return frozenset(self._cached)
        base = sql.SQL("SELECT {}, {} FROM {} WHERE {} IS NOT NULL").format(
            sql.Identifier(self.column), sql.Identifier(self.time_column), self._ident, sql.Identifier(self.column))
        query = base if self._watermark is None else base + sql.SQL(" AND {} > %s").format(
            sql.Identifier(self.time_column))
        params = () if self._watermark is None else (self._watermark,)

        def read(conn: psycopg.Connection[Any]) -> list[tuple[Any, Any]]:
            self.stats["reads"] += 1
            return conn.execute(query, params).fetchall()

        rows = self._run("refreshing the cached values", read)
        if self._cached is None:
            self._cached = set()
        self._cached.update(str(v) for v, _ in rows)
        stamps = [t for _, t in rows if t is not None]
        if stamps:
            self._watermark = max([*stamps, *([self._watermark] if self._watermark is not None else [])])
        self._refreshed_at = now
        return frozenset(self._cached)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- set-up, connection and errors -------------------------------------------------------------

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Create schema, table and index when the table is missing; check an existing one."""
        from psycopg import sql

        found = dict(conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s", (self.schema, self.table)).fetchall())
        if not found:
            log.info("dynamic_table '%s': creating %s on %s", self.node, self.qualified, self.target)
            with conn.transaction():
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
                conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({} TEXT PRIMARY KEY, {} TIMESTAMPTZ NOT NULL "
                                     "DEFAULT clock_timestamp())").format(
                    self._ident, sql.Identifier(self.column), sql.Identifier(self.time_column)))
                conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
                    sql.Identifier(index_name(self.table, self.time_column)), self._ident,
                    sql.Identifier(self.time_column)))
            self._has_time_column = True
            return
        if self.column not in found:
            raise self._error(f"table {self.qualified} exists but has no column '{self.column}' "
                              f"(columns: {', '.join(sorted(found))})",
                              hint="set 'column' to the column holding the values, or use another table")
        self._has_time_column = self.time_column in found
        if self.cache_enabled and not self._has_time_column and not self.cache_explicit:
            log.info("dynamic_table '%s': %s has no time column '%s', so it stays uncached (read every epoch) "
                     "although dynamic_table_backend.postgres.cache_enabled is on", self.node, self.qualified,
                     self.time_column)
            self.cache_enabled = False
        if self.cache_enabled:
            if not self._has_time_column:
                raise self._error(f"cache is on but table {self.qualified} has no time column '{self.time_column}'",
                                  hint="set 'time_column' to a timestamp column of the table, or turn 'cache' off")
            try:
                conn.execute(sql.SQL("SELECT max({tc}) FROM {t} WHERE {tc} >= CURRENT_TIMESTAMP AND FALSE").format(
                    tc=sql.Identifier(self.time_column), t=self._ident))
            except Exception as exc:  # noqa: BLE001 - any failure means the column cannot order rows
                raise self._error(f"cache is on but time column '{self.time_column}' of {self.qualified} "
                                  f"({found[self.time_column]}) cannot be compared with timestamps: {first_line(exc)}",
                                  hint="use a timestamptz column as 'time_column', or turn 'cache' off") from exc

    def _connections(self) -> PostgresPool:
        if self._pool is None:
            from streamling.postgres import PostgresPool

            self._pool = PostgresPool(self.connection.conninfo(), target=self.target,
                                      describe=f"dynamic_table '{self.node}'",
                                      application_name=f"streamling:dt:{self.node}", settings=self.pool_settings,
                                      autocommit=True)
        return self._pool

    def _run(self, what: str, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``action`` on a pooled connection, preparing the table first when needed. Failures are
        classified and raised; a table dropped while we ran is created again, once."""
        import psycopg

        from streamling.postgres import is_transient

        recreated = False
        with self._lock:
            while True:
                try:
                    with self._connections().connection() as conn:
                        if not self._ready:
                            self._prepare(conn)
                            self._ready = True
                        return action(conn)
                except psycopg.Error as exc:
                    if exc.sqlstate == "42P01" and self._ready and not recreated:
                        recreated = True
                        self._ready = False
                        continue
                    raise self._database_error(exc, what, is_transient(exc)) from exc

    def _database_error(self, exc: BaseException, what: str, transient: bool) -> StreamlingError:
        import psycopg

        state = getattr(exc, "sqlstate", None)
        if isinstance(exc, psycopg.OperationalError) and not state:
            return self._error(f"cannot reach Postgres at {self.target}: {self._mask(first_line(exc))}",
                               retriable=transient, code="dynamic_table_unavailable",
                               hint="check dynamic_table_backend.postgres.* (host, port, user, password, db, sslmode; "
                                    "keys left unset use postgres_sink.*) and that Postgres is running")
        hint = "fix the table or the data (this error is not retried)"
        if state == "42P10":
            hint = f"the ON CONFLICT insert needs a PRIMARY KEY or UNIQUE constraint on '{self.column}'"
        return self._error(f"Postgres at {self.target} rejected {what} on {self.qualified}: "
                           f"{'SQLSTATE ' + state + ': ' if state else ''}{self._mask(first_line(exc))}",
                           retriable=transient, hint="retried by the flow" if transient else hint,
                           code="dynamic_table_unavailable" if transient else "dynamic_table_error")

    def _mask(self, text: str) -> str:
        from streamling.postgres import mask

        return mask(text, [self.connection.pass_])

    def _error(self, message: str, **kwargs: Any) -> StreamlingError:
        return StreamlingError(message, node=self.node, node_kind="dynamic_table transform", **kwargs)


def open_backend(ctx: NodeContext, opts: DynamicTableTransformOptions) -> InMemoryDynamicTable | PostgresDynamicTable:
    """The node's backend; nothing is contacted until the first epoch uses it."""
    if opts.backend_type == "InMemory":
        return InMemoryDynamicTable(opts.backend_entity_name)
    from streamling.postgres import PoolSettings

    settings = ctx.settings
    pg = settings.dynamic_table_backend.postgres
    return PostgresDynamicTable(
        ctx.name, settings.dynamic_table_connection(), opts.schema_ or pg.dt_schema_name, opts.backend_entity_name,
        opts.column, opts.time_column, cache=opts.cache, cache_default=pg.cache_enabled,
        debounce_ms=pg.cache_refresh_debounce_ms if opts.cache_refresh_debounce_ms is None
        else opts.cache_refresh_debounce_ms,
        max_batch_size=settings.dynamic_table_backend.max_batch_size,
        pool=PoolSettings.from_sink(settings.postgres_sink, statement_timeout_secs=pg.statement_timeout_secs,
                                    max_size=pg.max_connections or 1))


class DynamicTableTransform(Transform[DynamicTableTransformOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        opts = self.options
        self.backend = open_backend(ctx, opts)
        ctx.dynamic_tables[self.name] = self.backend
        self.reads_batch_eagerly = opts.sql is not None
        self.query = UpstreamSql(ctx, opts.sql, carry_gs_op=False) if opts.sql else None

    def apply(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None) -> DataFrame:
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        column = self.options.column
        if self.query is None:
            return spark.createDataFrame([], T.StructType([T.StructField(column, T.StringType())]))
        values = self._values(spark, inputs, epoch)
        if epoch is not None and not self.ctx.dry_run:
            t0 = time.perf_counter()
            self.backend.add(_distinct_text(values.where(F.col(column).isNotNull()).toArrow().column(0).chunks))
            log.debug("dynamic_table '%s': epoch %d filled in %.1f ms", self.name, epoch.epoch_id,
                      (time.perf_counter() - t0) * 1000)
        return values

    def _values(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None) -> DataFrame:
        """The epoch's values as one text column named ``column``."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        assert self.query is not None
        out = self.query.run(spark, inputs, epoch)
        if len(out.columns) != 1:
            raise self.ctx.error(f"sql must select exactly one column (the value to store), found "
                                 f"{len(out.columns)}: {', '.join(out.columns)}", code="sql_invalid",
                                 hint="select the one value column, e.g. SELECT lower(address) FROM …")
        field = out.schema.fields[0]
        if isinstance(field.dataType, (T.ArrayType, T.MapType, T.StructType, T.BinaryType)):
            raise self.ctx.error(f"sql selects '{field.name}' of type {field.dataType.simpleString()}; a dynamic "
                                 "table stores text values", code="sql_invalid",
                                 hint="select a string (numbers are stored as their text)")
        return out.select(F.col(f"`{field.name}`").cast("string").alias(self.options.column))

    def close(self) -> None:
        self.backend.close()


def _distinct_text(chunks: Iterable[Any]) -> list[str]:
    """Distinct non-null values of Arrow string chunks, in first-seen order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = [c for c in chunks if len(c)]
    if not arrays:
        return []
    unique = pc.unique(pa.chunked_array(arrays))
    return [v for v in unique.to_pylist() if v is not None]
