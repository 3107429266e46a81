"""``clickhouse`` sink: upserts each epoch into a ClickHouse table, honouring ``_gs_op``.

Streamling's two modes:

* ``append_only_mode: true`` (default): every row is appended to a
  ``ReplacingMergeTree(insert_time, is_deleted)`` table ordered by the primary key; ``is_deleted``
  is 1 for ``d`` rows, and ``insert_time`` (or the user's ``version_column_name``) is the version,
  so ``SELECT … FINAL`` shows the latest row of each key and hides deleted keys. A replayed epoch
  appends the same rows with a later ``insert_time``: ``FINAL`` is unchanged.
* ``append_only_mode: false``: a plain ``MergeTree`` without those columns. The epoch's keys are
  deleted (``ALTER TABLE … DELETE``, synchronously) and its ``i``/``u`` rows inserted, so ``d``
  rows delete and a replayed epoch converges to the same table.

Why this shape: an epoch is deduplicated (last row per key) in Spark, collected once as Arrow on
the driver and sent with ``insert_arrow`` in inserts of ``clickhouse_sink.batch_size`` rows —
ClickHouse wants few large inserts (Streamling measured 100k-row inserts at ~12× the throughput of
1000-row ones). The table is created from the input schema when missing; columns of the batch the
table lacks are projected away. Failures are classified (``streamling.clickhouse.is_transient``),
never retried here: the flow owns retries.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import AliasChoices, Field

from streamling.errors import StreamlingError
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink, TargetReader
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from clickhouse_connect.driver.client import Client
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

NODE_KIND = "clickhouse sink"
IS_DELETED = "is_deleted"
INSERT_TIME = "insert_time"
_NESTED = ("struct", "array", "map", "variant")


class ClickHouseSinkOptions(FromNodeOptions):
    """Upserts into a ClickHouse table: ReplacingMergeTree rows (append-only) or INSERT + DELETE."""

    type: Literal["clickhouse"] = "clickhouse"
    table: str
    version_column_name: str | None = None
    append_only_mode: bool = True
    schema_override: dict[str, str] | None = Field(default=None, validation_alias=AliasChoices(
        "schema_override", "schema_overrides"), description="column → ClickHouse type for created tables")
    compression: Literal["none", "gzip", "zstd", "lz4"] | None = None
    compression_level: int | None = Field(default=None, ge=0, le=22)
    deduplicate: bool = True


class ClickHouseSink(Sink[ClickHouseSinkOptions]):
    #: written from the driver in large inserts, one epoch after the other
    honoured_keys: ClassVar[frozenset[str]] = frozenset()
    # One collect reads the whole batch once, and ``write`` returns the rows it was given (before the
    # per-epoch dedup, as the Postgres sink counts): the flow needs no observation of this sink's
    # input or of the node it reads, which would split Spark's generated code.
    reads_once = True
    counts_received = True
    primary_key_reason = "it is the table's ORDER BY and the key rows of one epoch are deduplicated by"

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.conn = ctx.settings.clickhouse_sink
        from streamling.clickhouse import quote_identifier, split_table

        self.database, self.table = split_table(self.options.table, self.conn.database)
        self.target = f"{quote_identifier(self.database)}.{quote_identifier(self.table)}"
        self._client: Client | None = None
        self.columns: dict[str, str] = {}  # the table's columns and types, once opened
        self._dropped: set[str] = set()

    def ineffective_keys(self) -> dict[str, str]:
        out = super().ineffective_keys()
        if self.options.compression_level is not None:
            out["compression_level"] = ("clickhouse-connect compresses inserts at its own fixed level; "
                                        "compression picks the codec")
        return out

    def common_key_reason(self, key: str) -> str:
        if key == "batch_flush_interval":
            return ("a ClickHouse sink writes each epoch when it ends, in inserts of clickhouse_sink.batch_size rows; "
                    "set checkpoint_interval_sec to write more or less often")
        if key == "batch_size":
            return "inserts are cut at clickhouse_sink.batch_size rows; set that instead"
        return super().common_key_reason(key)

    # --- connection and table -------------------------------------------------------------------

    def _fail(self, doing: str, exc: BaseException) -> StreamlingError:
        from streamling.clickhouse import error

        return error(NODE_KIND, self.name, doing, exc, self.conn)

    def client(self) -> Client:
        if self._client is None:
            from streamling.clickhouse import connect

            compression = self.options.compression or self.conn.compression
            try:
                self._client = connect(self.conn, compression=compression)
            except Exception as exc:
                raise self._fail("connecting", exc) from exc
        return self._client

    @property
    def key(self) -> list[str]:
        return list(self.ctx.primary_key)

    @property
    def version_column(self) -> str:
        return self.options.version_column_name or INSERT_TIME

    def ddl(self, schema: StructType) -> str:
        """``CREATE TABLE`` for the input schema (types from the one type module, ``schema_override`` first)."""
        from streamling.clickhouse import quote_identifier as q
        from streamling.spec.types import clickhouse_type

        overrides = self.options.schema_override or {}
        cols = []
        for field in schema.fields:
            if field.name == GS_OP:
                continue
            kind = overrides.get(field.name) or clickhouse_type(field.dataType, field.metadata)
            if field.name not in self.key and not kind.startswith("Nullable(") and field.name not in overrides:
                kind = f"Nullable({kind})"
            cols.append(f"{q(field.name)} {kind}")
        order = ", ".join(q(k) for k in self.key)
        if self.options.append_only_mode:
            if not self.options.version_column_name:
                cols.append(f"{q(INSERT_TIME)} DateTime64(6, 'UTC')")
            cols.append(f"{q(IS_DELETED)} UInt8")
            engine = f"ReplacingMergeTree({q(self.version_column)}, {q(IS_DELETED)})"
        else:
            engine = "MergeTree"
        return f"CREATE TABLE IF NOT EXISTS {self.target} ({', '.join(cols)}) ENGINE = {engine} ORDER BY ({order})"

    def open(self, spark: SparkSession) -> None:
        if not self.key:
            raise self.ctx.error("a ClickHouse sink needs a primary_key (the table's ORDER BY and the upsert key)",
                                 code="primary_key_required", retriable=False)
        schema = self.ctx.input_schema
        client = self.client()
        try:
            if schema is not None:
                client.command(self.ddl(schema))
            described = client.query(f"DESCRIBE TABLE {self.target}")
        except Exception as exc:
            raise self._fail(f"preparing table {self.database}.{self.table}", exc) from exc
        self.columns = {str(r[0]): str(r[1]) for r in described.result_rows}
        self._check_table(schema)

    def _check_table(self, schema: StructType | None) -> None:
        where = f"table {self.database}.{self.table}"
        missing_keys = [k for k in self.key if k not in self.columns]
        if missing_keys:
            raise self.ctx.error(f"{where} has no column(s) {missing_keys} of the primary key; it has "
                                 f"{list(self.columns)}", code="clickhouse_schema_mismatch", retriable=False)
        if self.options.append_only_mode:
            needed = [c for c in (self.version_column, IS_DELETED) if c not in self.columns]
            if needed:
                raise self.ctx.error(
                    f"{where} has no column(s) {needed}: append_only_mode needs a ReplacingMergeTree table with a "
                    f"version column ({self.version_column}) and {IS_DELETED} UInt8",
                    code="clickhouse_schema_mismatch", retriable=False,
                    hint="let the sink create the table, or set append_only_mode: false for a plain table")
        if schema is not None:
            extra = {f.name for f in schema.fields} - set(self.columns) - {GS_OP}
            if extra - self._dropped:
                log.warning("%s '%s': %s has no column(s) %s; they are not written", NODE_KIND, self.name, where,
                            sorted(extra))
            self._dropped |= extra

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def read_back(self, spark: SparkSession) -> TargetReader:
        return ClickHouseTableReader(self)

    # --- writing --------------------------------------------------------------------------------

    def _collect(self, df: DataFrame) -> tuple[int, pa.Table]:
        """The epoch as Arrow: only the table's columns (nested values as JSON), the last row per
        key, and the op lower-cased (a missing op is an insert); and how many rows it was given."""
        from pyspark.sql import functions as F

        from streamling.sinks.common import arrow_ops, last_rows

        if not self.columns:
            self.open(df.sparkSession)
        if any(k not in df.columns for k in self.key):
            raise self.ctx.error(f"the input has no column(s) {[k for k in self.key if k not in df.columns]} of the "
                                 f"primary key; it has {df.columns}", code="primary_key_missing", retriable=False)
        keep = []
        for field in df.schema.fields:
            if field.name == GS_OP or field.name in self.columns:
                col = F.col(f"`{field.name}`")
                if field.dataType.typeName() in _NESTED:
                    col = F.to_json(col).alias(field.name)
                keep.append(col)
        table = arrow_ops(df.select(*keep).toArrow())
        return table.num_rows, last_rows(table, self.key) if self.options.deduplicate else table

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        received, data = self._collect(df)
        if data.num_rows == 0:
            return received
        ops = data.column(GS_OP)
        rows = data.drop_columns([GS_OP])
        deleted = pc.equal(ops, "d")
        if self.options.append_only_mode:
            rows = rows.append_column(IS_DELETED, pc.cast(deleted, pa.uint8()))
            if not self.options.version_column_name:
                now = np.full(rows.num_rows, time.time_ns() // 1000, dtype=np.int64)
                rows = rows.append_column(INSERT_TIME, pa.array(now, pa.timestamp("us", tz="UTC")))
            self._insert(rows, epoch)
        else:
            self._delete_keys(rows, epoch)
            self._insert(rows.filter(pc.invert(deleted)), epoch)
        return received

    def _insert(self, rows: pa.Table, epoch: Epoch) -> None:
        size = self.conn.batch_size
        try:
            for start in range(0, rows.num_rows, size):
                self.client().insert_arrow(self.target, rows.slice(start, size))
        except StreamlingError:
            raise
        except Exception as exc:
            raise self._fail(f"inserting epoch {epoch.epoch_id} into {self.database}.{self.table}", exc) from exc

    def _delete_keys(self, rows: pa.Table, epoch: Epoch) -> None:
        """Delete every key of the epoch first, so ``d`` rows delete and a replay converges."""
        from streamling.clickhouse import quote_identifier as q
        from streamling.clickhouse import quote_literal

        if rows.num_rows == 0:
            return
        keys = rows.select(self.key).to_pylist()
        tuples = sorted({"(" + ", ".join(quote_literal(r[k]) for k in self.key) + ")" for r in keys})
        lhs = "(" + ", ".join(q(k) for k in self.key) + ")"
        step = 10_000
        try:
            for start in range(0, len(tuples), step):
                chunk = ", ".join(tuples[start:start + step])
                self.client().command(f"ALTER TABLE {self.target} DELETE WHERE {lhs} IN ({chunk}) "
                                      "SETTINGS mutations_sync = 2")
        except Exception as exc:
            raise self._fail(f"deleting the keys of epoch {epoch.epoch_id} from {self.database}.{self.table}",
                             exc) from exc


class ClickHouseTableReader:
    """The sink's table, highest sort key first (``FINAL``: replaced rows merged), on a client of
    its own (the display's reads run beside the sink's inserts)."""

    def __init__(self, sink: ClickHouseSink) -> None:
        self.sink = sink
        self.final = bool(sink.options.append_only_mode)
        self.caption = (f"rows of ClickHouse table {sink.database}.{sink.table}, the highest primary key "
                        f"({', '.join(sink.key)}) first; queried after each committed epoch")
        self._client: Client | None = None

    def read(self, limit: int) -> tuple[pa.Table, list[str]]:
        from streamling.clickhouse import connect, quote_identifier

        if self._client is None:
            self._client = connect(self.sink.conn, send_receive_timeout=30)
        order = ", ".join(f"{quote_identifier(k)} DESC" for k in self.sink.key)
        query = (f"SELECT * FROM {self.sink.target}{' FINAL' if self.final else ''}"
                 f"{' ORDER BY ' + order if order else ''} LIMIT {int(limit)}")
        table = self._client.query_arrow(query, use_strings=True)
        return table, [str(f.type) for f in table.schema]

    def error_text(self, exc: BaseException) -> str:
        from streamling.clickhouse import server_message

        return f"querying ClickHouse table {self.sink.database}.{self.sink.table} failed: {server_message(exc)}"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
