"""Built-in ``clickhouse`` source: a bounded scan of a table in sort-key order, one page per epoch.

Why this shape: ClickHouse reads a table fastest along its sorting key, and a position in that key
is an offset Spark can checkpoint. Each epoch is one *page*: the planner asks ClickHouse for the
key value ``page_size`` rows further on and the epoch reads every row up to and including it, so
rows sharing a key value never straddle two epochs and a replayed epoch reads the same rows. The
highest key is fixed when the run starts (rows appended later are for the live phase of a
``hybrid`` source). Executors read a page in parallel, split in spans of at most
``clickhouse_source.sort_key_range`` values of a numeric key, over ClickHouse's HTTP interface
with Arrow; a span that times out is halved and read again. Offsets live in Spark's checkpoint and
are copied to the state backend (``clickhouse_source:<node>``) once an epoch is committed; a new
checkpoint without ``start_at`` starts after that saved position, as Streamling resumes from it.

A ``ReplacingMergeTree`` table is read as Streamling reads it (its ``SELECT … FINAL`` semantics,
computed by the source so that ties come out the same): per sorting-key tuple the row with the
highest version wins, a delete (``is_deleted = 1``) wins a tie of versions, and a key whose winner
is a delete is dropped. The version and ``is_deleted`` columns are taken from the engine's
arguments and used whether or not ``columns`` selects them (the hybrid source projects to the live
topic's columns); ``filter`` applies to the winning row, never to a superseded one. Without a version
column ClickHouse keeps the row inserted last, which only ``FINAL`` knows, so that is what is read.
Pages end on a whole first-sort-key value, so every version of a key tuple is in the same page and
span (a "hot" key value with more rows than ``page_size`` is read whole, in one page).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamling.errors import NodeFailure, StreamlingError
from streamling.runtime.nodes import GS_OP, NodeContext, Source
from streamling.spec.sources import ClickHouseSourceOptions
from streamling.state import is_durable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamling.config.sections import ClickHouseSourceSettings

log = logging.getLogger(__name__)

FORMAT = "streamling_clickhouse"
NODE_KIND = "clickhouse source"
_TIMEOUT = 159  # TIMEOUT_EXCEEDED: the span is halved and read again


@dataclass(frozen=True)
class ScanPlan:
    """What the executors need to read pages: the SELECT list, the table and the paging key."""

    table: str  # quoted
    select: list[str]  # expressions, aliased to the output names
    key: str  # quoted first column of the sorting key
    numeric_key: bool
    where: str | None  # the node's filter
    ceiling: Any = None  # highest key at the start of the run (None: the table is empty)
    #: a ReplacingMergeTree: {"version": quoted column or None, "is_deleted": quoted column or None}
    replacing: dict[str, str | None] | None = None
    sorting: str | None = None  # the whole sorting key, as system.tables prints it (replacing only)
    columns: list[str] | None = None  # every readable column, quoted (replacing only)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, default=str)

    def positions(self) -> str:
        """What a saved position is a position in: the table, its paging key and the filter."""
        return json.dumps([self.table, self.key, self.where])

    @staticmethod
    def from_json(text: str) -> ScanPlan:
        return ScanPlan(**json.loads(text))


def page_condition(plan: ScanPlan, start: dict[str, Any], end: dict[str, Any] | None) -> str:
    """``key`` after ``start`` (exclusive, or inclusive for a ``start_at`` origin) and up to ``end``."""
    from streamling.clickhouse import quote_literal

    parts = []
    if start.get("key") is not None:
        parts.append(f"{plan.key} {'>=' if start.get('inclusive') else '>'} {quote_literal(start['key'])}")
    if end is not None and end.get("key") is not None:
        parts.append(f"{plan.key} <= {quote_literal(end['key'])}")
    if plan.where:
        parts.append(f"({plan.where})")
    return " AND ".join(parts) or "1"


def scan_query(plan: ScanPlan, start: dict[str, Any], end: dict[str, Any] | None) -> str:
    """The rows of the page or span ``start``..``end``, in key order.

    A ReplacingMergeTree is collapsed first, per sorting-key tuple, and only then filtered: the
    innermost query keeps the winning version of each tuple of the span (a span bounds the first key
    column, which every version of a tuple shares), the middle one drops deleted keys and applies
    ``filter`` to plain columns, the outer one casts to the output columns."""
    if plan.replacing is None:
        return (f"SELECT {', '.join(plan.select)} FROM {plan.table} WHERE {page_condition(plan, start, end)} "
                f"ORDER BY {plan.key}")
    keys = page_condition(ScanPlan(**{**plan.__dict__, "where": None}), start, end)
    columns = ", ".join(plan.columns or ["*"])
    version, deleted = plan.replacing.get("version"), plan.replacing.get("is_deleted")
    if version is None:  # the row inserted last wins: ClickHouse's own FINAL
        inner = f"SELECT {columns} FROM {plan.table} FINAL WHERE {keys}"
    else:
        order = f"{version} DESC" + (f", {deleted} DESC" if deleted else "")
        inner = (f"SELECT {columns} FROM {plan.table} WHERE {keys} ORDER BY {plan.sorting}, {order} "
                 f"LIMIT 1 BY {plan.sorting}")
    live = [f"{deleted} = 0"] if deleted else []
    if plan.where:
        live.append(f"({plan.where})")
    middle = f"SELECT * FROM ({inner})" + (f" WHERE {' AND '.join(live)}" if live else "")
    return f"SELECT {', '.join(plan.select)} FROM ({middle}) ORDER BY {plan.key}"


def _column(name: str) -> str:
    """A column name in back quotes, dots included (``n.x`` of a Nested column is one name)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


_REPLACING = re.compile(r"^(?:Replicated|Shared)?ReplacingMergeTree$")


def _engine_arguments(engine_full: str, engine: str) -> list[str]:
    """The top-level arguments of ``Engine(a, 'b', `c`)`` at the start of ``engine_full``."""
    text = engine_full.strip()
    if not text.startswith(engine + "("):
        return []
    args: list[str] = []
    depth, quote, current, escaped = 0, "", "", False
    for ch in text[len(engine) + 1:]:
        if quote:
            current += ch
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'`\"":
            quote, current = ch, current + ch
        elif ch == "(":
            depth, current = depth + 1, current + ch
        elif ch == ")" and depth:
            depth, current = depth - 1, current + ch
        elif ch == ")":
            break
        elif ch == "," and not depth:
            args, current = [*args, current.strip()], ""
        else:
            current += ch
    return [a for a in [*args, current.strip()] if a]


#: most spans (Spark partitions, ClickHouse queries) one page is read in
MAX_SPANS = 64


def _spans(plan: ScanPlan, start: dict[str, Any], end: dict[str, Any], width: int,
           most: int = MAX_SPANS) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """A page cut into spans of at most ``width`` values of a numeric key (one span otherwise), and
    into at most ``most`` (``MAX_SPANS``, or fewer for a page of fewer rows): a page holds at most
    ``page_size`` rows, but a sparse key (epoch milliseconds, hashes, a resumed position far below
    the next rows) can put trillions of values between its ends, and a span per ``width`` of them
    would be a list no memory holds."""
    lo, hi = start.get("key"), end.get("key")
    if not plan.numeric_key or hi is None or lo is None or not isinstance(lo, int | float) \
            or not isinstance(hi, int | float):
        return [(start, end)]
    step_width: int | float = width
    if hi - lo > width * most:  # exact for integer keys of any width (a float would round them)
        step_width = -(-(hi - lo) // most)
    spans = []
    cursor: dict[str, Any] = start
    while True:
        step = cursor["key"] + step_width - (1 if cursor.get("inclusive") else 0)
        if step >= hi:
            spans.append((cursor, end))
            return spans
        nxt = {"key": step, "inclusive": False}
        spans.append((cursor, nxt))
        cursor = nxt


def _data_source_class() -> type:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class SpanPartition(InputPartition):
        def __init__(self, start: dict[str, Any], end: dict[str, Any]) -> None:
            super().__init__((json.dumps(start), json.dumps(end)))
            self.start, self.end = start, end

    class ClickHouseStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options: dict[str, str], schema: StructType) -> None:
            from streamling.config.sections import ClickHouseSourceSettings

            self.conn = ClickHouseSourceSettings.model_validate_json(options["connection"])
            self.conn.password = options.get("password") or None
            self.plan = ScanPlan.from_json(options["plan"])
            self.node = options["node"]
            self.kind = options.get("node_kind", NODE_KIND)
            self.origin: dict[str, Any] = json.loads(options["origin"])
            self.schema = schema
            self._client: Any = None

        def __getstate__(self) -> dict[str, Any]:
            return {**self.__dict__, "_client": None}  # shipped to executors: each connects itself

        def client(self) -> Any:
            if self._client is None:
                from streamling.clickhouse import connect

                self._client = connect(self.conn)
            return self._client

        def initialOffset(self) -> dict[str, Any]:
            return self.origin

        def prepareForTriggerAvailableNow(self) -> None:
            return None  # the ceiling was fixed when the run started

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            from streamling.clickhouse import error, quote_literal

            plan = self.plan
            if plan.ceiling is None:
                return start
            cond = page_condition(plan, start, {"key": plan.ceiling})
            page = (f"SELECT {plan.key} FROM {plan.table} WHERE {cond} ORDER BY {plan.key} "
                    f"LIMIT 1 OFFSET {self.conn.page_size - 1}")
            try:
                rows = self.client().query(page).result_rows
                if not rows:
                    rows = self.client().query(f"SELECT max({plan.key}), count() FROM {plan.table} WHERE {cond}"
                                               ).result_rows
                    if not rows or not rows[0][1]:
                        return start
            except Exception as exc:
                raise NodeFailure.of(error(self.kind, self.node, "finding the next page of " + plan.table, exc,
                                           self.conn)) from exc
            value = rows[0][0]
            if isinstance(value, int | float | str):
                return {"key": value, "inclusive": False}
            return {"key": quote_literal(value).strip("'"), "inclusive": False}

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
            if end.get("key") is None or end == start:
                return []
            spans = _spans(self.plan, start, end, self.conn.sort_key_range, min(MAX_SPANS, self.conn.page_size))
            return [SpanPartition(s, e) for s, e in spans]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield from self._read_span(partition.start, partition.end)  # type: ignore[attr-defined]

        def _read_span(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[pa.RecordBatch]:
            from streamling.clickhouse import error, error_code
            from streamling.spec.types import arrow_for_spark

            plan = self.plan
            query = scan_query(plan, start, end)
            try:
                table = self.client().query_arrow(query, use_strings=True)
            except Exception as exc:
                halves = _spans(plan, start, end, max(1, _width(start, end) // 2)) \
                    if error_code(exc) == _TIMEOUT else []
                if len(halves) > 1:
                    log.warning("%s '%s': reading %s..%s timed out; reading it in two halves", self.kind, self.node,
                                start.get("key"), end.get("key"))
                    for s, e in halves:
                        yield from self._read_span(s, e)
                    return
                raise NodeFailure.of(error(self.kind, self.node, f"reading {plan.table}", exc, self.conn)) from exc
            table = arrow_for_spark(table, self.schema)
            yield from table.to_batches(max_chunksize=65_536)

        def commit(self, end: dict[str, Any]) -> None:
            return None

    class ClickHouseDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return ClickHouseStreamReader(dict(self.options), schema)

    return ClickHouseDataSource


def _width(start: dict[str, Any], end: dict[str, Any]) -> int:
    lo, hi = start.get("key"), end.get("key")
    return int(hi - lo) if isinstance(lo, int | float) and isinstance(hi, int | float) else 1




#: Streamling's ``start_at`` overrides the saved position on every start; here a checkpoint wins, so a
#: restart never re-reads a history that is already written (say so rather than differ silently).
#: Reported only with a durable state backend: under ``InMemory`` every run starts at ``start_at``.
START_AT_ON_RESTART = ("with a durable state_backend, once a checkpoint exists a restart resumes after the last "
                       "finalized page instead of starting over at start_at as Streamling does; start_at applies to "
                       "a new checkpoint (a new application_id, or the state_dir removed)")


class ClickHouseSource(Source[ClickHouseSourceOptions]):
    """Reads ``table_name`` (``columns``, ``filter``) once, page by page; then the flow ends."""

    bounded = True
    new_application_note = ("a ClickHouse source then starts at start_at or its first row, since its state-backend "
                            "position is kept per application_id")

    def __init__(self, ctx: NodeContext, options: ClickHouseSourceOptions | None = None,
                 state_suffix: str = "") -> None:
        super().__init__(ctx, options)
        self.conn: ClickHouseSourceSettings = ctx.settings.clickhouse_source
        self._state_suffix = state_suffix
        self.kind = f"{ctx.spec.type} source"  # a hybrid source's backfill speaks as the hybrid node
        self._said_saved = False
        self._described: tuple[ScanPlan, StructType, list[str]] | None = None

    def ineffective_keys(self) -> dict[str, str]:
        out = super().ineffective_keys()
        if (self.options.start_at is not None and not self._state_suffix  # a hybrid phase: the hybrid node reports
                and is_durable(self.ctx.settings)):
            out["start_at"] = START_AT_ON_RESTART
        return out

    # --- schema ---------------------------------------------------------------------------------

    def _fail(self, doing: str, exc: BaseException) -> StreamlingError:
        from streamling.clickhouse import error

        return error(self.kind, self.name, doing, exc, self.conn)

    def describe(self) -> tuple[ScanPlan, StructType, list[str]]:
        """The scan (SELECT list, paging key, highest key now), the Spark schema and the sorting key."""
        if self._described is not None:
            return self._described
        from pyspark.sql.types import StringType, StructField, StructType

        from streamling.clickhouse import connect, quote_identifier, sorting_key, split_table
        from streamling.spec.types import from_clickhouse

        database, table = split_table(self.options.table_name, self.conn.database)
        where = f"table {database}.{table}"
        try:
            client = connect(self.conn)
            key = sorting_key(client, database, table)
            described = client.query(f"DESCRIBE TABLE {quote_identifier(database)}.{quote_identifier(table)}")
            engine = client.query("SELECT engine, engine_full, sorting_key FROM system.tables "
                                  "WHERE database = {db:String} AND name = {t:String}",
                                  parameters={"db": database, "t": table}).result_rows
        except LookupError as exc:
            raise self.ctx.error(f"{where} does not exist at {self.conn.url}", code="clickhouse_table_missing",
                                 hint="create it, or fix table_name / clickhouse_source.database") from exc
        except Exception as exc:
            raise self._fail(f"reading the columns of {where}", exc) from exc
        columns = {str(row[0]): str(row[1]) for row in described.result_rows}
        readable = [str(row[0]) for row in described.result_rows if len(row) < 3 or row[2] != "EPHEMERAL"]
        wanted = self.options.columns or list(columns)
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise self.ctx.error(f"{where} has no column(s) {missing}; it has {list(columns)}",
                                 code="clickhouse_column_missing")
        if not key:
            raise self.ctx.error(f"{where} has no sorting key to page by (ORDER BY tuple())",
                                 code="clickhouse_no_sort_key",
                                 hint="read it through a table or view ordered by a column")
        select, fields = [], []
        for name in wanted:
            mapped = from_clickhouse(columns[name])
            select.append(f"{mapped.expression(quote_identifier(name))} AS {quote_identifier(name)}")
            fields.append(StructField(name, mapped.spark, True, mapped.metadata or None))
        if GS_OP not in wanted:
            fields.append(StructField(GS_OP, StringType(), True))
            select.append(f"'i' AS {GS_OP}")
        paging = key[0]
        if paging not in columns:
            raise self.ctx.error(f"{where} is ordered by an expression ({paging}); paging needs a column",
                                 code="clickhouse_no_sort_key")
        numeric = from_clickhouse(columns[paging]).numeric
        quoted = f"{quote_identifier(database)}.{quote_identifier(table)}"
        plan = ScanPlan(table=quoted, select=select, key=quote_identifier(paging), numeric_key=numeric,
                        where=self.options.filter)
        if engine and _REPLACING.match(str(engine[0][0])):
            plan = ScanPlan(**{**plan.__dict__, "replacing": self._replacing(where, str(engine[0][0]),
                                                                             str(engine[0][1]), columns),
                               "sorting": str(engine[0][2]), "columns": [_column(c) for c in readable]})
        try:
            top = client.query(f"SELECT max({plan.key}), count() FROM {quoted}"
                               + (f" WHERE ({plan.where})" if plan.where else "")).result_rows
        except Exception as exc:
            raise self._fail(f"reading {where}" + (" with filter " + repr(plan.where) if plan.where else ""),
                             exc) from exc
        finally:
            client.close()
        ceiling = top[0][0] if top and top[0][1] else None
        if ceiling is not None and not isinstance(ceiling, int | float | str):
            ceiling = str(ceiling)
        plan = ScanPlan(**{**plan.__dict__, "ceiling": ceiling})
        self._described = (plan, StructType(fields), [k for k in key if k in columns])
        return self._described

    def _replacing(self, where: str, engine: str, engine_full: str, columns: dict[str, str]) -> dict[str, str | None]:
        """The version and ``is_deleted`` columns of a ReplacingMergeTree, from its engine arguments
        (a replicated engine's leading path and replica literals skipped)."""
        args = [a for a in _engine_arguments(engine_full, engine) if not a.startswith("'")]
        names = [a[1:-1].replace("\\`", "`").replace("\\\\", "\\") if a.startswith("`") else a for a in args]
        unknown = [a for a in names if a not in columns]
        if len(names) > 2 or unknown:
            raise self.ctx.error(
                f"{where} is a {engine} whose version / is_deleted arguments {args} are not columns of it, so "
                "the source cannot collapse its rows as SELECT … FINAL does (newest version per sorting key, a "
                "delete winning a tie)", code="clickhouse_replacing_unsupported",
                hint="copy the rows wanted into a MergeTree table ordered by a column, and read that")
        quoted = [_column(n) for n in names]
        return {"version": quoted[0] if quoted else None, "is_deleted": quoted[1] if len(quoted) > 1 else None}

    def inferred_primary_key(self) -> list[str]:
        return self.describe()[2] if not self.ctx.dry_run or self._described else []

    # --- reading --------------------------------------------------------------------------------

    def origin(self, resume: bool = True) -> dict[str, Any]:
        """Where a brand-new checkpoint starts, in Streamling's order: ``start_at`` (inclusive) when
        set, else after the page the state backend saved last (a checkpoint folder lost or moved
        while a durable backend kept the position; only when ``resume``), else the first row."""
        if self.options.start_at is None:
            saved = self._saved_position() if resume else None
            if saved is None:
                return {"key": None}
            if not self._said_saved:
                self._said_saved = True
                log.info("%s '%s': the state backend holds its position %s = %s; a new checkpoint starts after it "
                         "(an existing one resumes where it is)", self.kind, self.name, self.describe()[0].key,
                         saved["key"])
            return saved
        start: Any = self.options.start_at
        if self.describe()[0].numeric_key and isinstance(start, str):
            for number in (int, float):
                try:
                    start = number(start)
                    break
                except ValueError:
                    continue  # a date or time: compared as text by ClickHouse
        return {"key": start, "inclusive": True}

    def read_stream(self, spark: SparkSession) -> DataFrame:
        return self._reader(spark, self.conn.page_size, self.origin())

    def read_sample(self, spark: SparkSession, rows: int) -> DataFrame:
        # A preview shows the table from where the pipeline says it starts, not after the position
        # a run of this kernel saved (with everything read, that would be nothing).
        return self._reader(spark, max(1, rows), self.origin(resume=False))

    def _reader(self, spark: SparkSession, page_size: int, origin: dict[str, Any]) -> DataFrame:
        from streamling.runtime.session import register_data_source

        register_data_source(spark, FORMAT, _data_source_class)
        plan, schema, _ = self.describe()
        return (spark.readStream.format(FORMAT).schema(schema)
                .option("connection", self.conn.model_copy(update={"page_size": page_size}).model_dump_json(
                    exclude={"password"}))
                .option("password", self.conn.password or "")
                .option("plan", plan.to_json()).option("node", self.name).option("node_kind", self.kind)
                .option("origin", json.dumps(origin)).load())

    def state_key(self) -> str:
        return f"clickhouse_source:{self.name}{self._state_suffix}"

    def state_entries(self, end_offset: Any) -> dict[str, dict[str, Any]]:
        # The position says which scan it belongs to: the node's name alone does not (a kernel or a
        # state backend outlives a change of table_name, filter or sorting key).
        return {self.state_key(): {"offset": end_offset, "scan": self.describe()[0].positions()}}

    def _saved_position(self) -> dict[str, Any] | None:
        """The end of the last committed page, as ``on_progress`` copied it to the state backend, if it
        is a position in this scan: one saved while the node read another table, filter or sorting
        key would skip rows here, so it is not used (entries from before positions named their scan
        are taken as they are)."""
        state = self.ctx.state
        entry = state.get(self.state_key()) if state is not None else None
        offset = (entry or {}).get("offset")
        if not isinstance(offset, dict) or offset.get("key") is None:
            return None
        scan = (entry or {}).get("scan")
        if scan is not None and scan != self.describe()[0].positions():
            if not self._said_saved:
                self._said_saved = True
                log.warning("%s '%s': the state backend holds a position saved while it read another table, filter "
                            "or sorting key (%s); it is not used: a new checkpoint starts at start_at or the first "
                            "row", self.kind, self.name, scan)
            return None
        return {"key": offset["key"], "inclusive": False}
