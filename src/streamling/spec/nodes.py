"""Options models for the built-in node types, keyed by their YAML ``type``.

These are plain pydantic models (no Spark): validation and notebook authoring use them without a
JVM. Each built-in rejects unknown keys, as Streamling's ``deny_unknown_fields`` does. The runtime
implementation of each type is named by a dotted path and imported only when a pipeline runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from streamling.spec.types import check_type_names
from streamling.util import csv_list, parse_duration_secs

LABEL_KEY = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_LABELS = {"id", "topology_node_type", "operator_type", "service_instance_id"}
MAX_LABELS = 20
MAX_LABEL_VALUE_BYTES = 256
#: the columns ``include_metadata`` adds to a Kafka source's rows
METADATA_COLUMNS = ["_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key"]


@dataclass(frozen=True)
class OptionProblem:
    """What a node's options find wrong in themselves (``NodeOptions.option_problems``): the key path
    below the node (``batch_flush_interval``, ``unbounded_source.filter``), the message, what to do."""

    path: str
    message: str
    hint: str | None = None


class EventTime(BaseModel):
    model_config = ConfigDict(extra="forbid")
    column: str
    unit: Literal["seconds", "milliseconds", "microseconds"] = "milliseconds"


class Telemetry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: dict[str, str] = Field(default_factory=dict)
    event_time: EventTime | None = None

    @field_validator("labels", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): "" if v is None else str(v) for k, v in value.items()}
        return value


class NodeOptions(BaseModel):
    """Keys every node accepts."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: str
    description: str | None = None
    primary_key: str | None = None
    parallelism: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1)
    batch_flush_interval: str | None = None
    telemetry: Telemetry | None = None

    @field_validator("primary_key", mode="before")
    @classmethod
    def _pk_text(cls, value: Any) -> Any:
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return value

    #: The hint when a node of this type has no primary key, its own or inherited, which it cannot
    #: run without (validation reports it at the node); None: it runs without one.
    primary_key_required: ClassVar[str | None] = None
    #: False for a node whose output is not rows of its input (a dynamic table is a set of values):
    #: it has no primary key to pass on and needs no consumer.
    produces_rows: ClassVar[bool] = True

    def key_columns(self) -> list[str]:
        return parse_key(self.primary_key)

    def key_from_registry(self) -> bool:
        """True when, without a ``primary_key``, the node may still learn one once it runs (an Avro
        Kafka source: from the registered record's ``doc``), so validation cannot say it has none."""
        return False

    def predicates(self) -> dict[str, str]:
        """The boolean expressions in Streamling's SQL that this node evaluates over its rows, by key
        path (a source's ``filter``): validation checks that each one translates to Spark SQL."""
        return {}

    def option_problems(self) -> list[OptionProblem]:
        """What keeps these options from running that needs no other node, broker or registry to
        tell; validation reports each at its key once the pipeline's graph is sound. Each type
        answers for its own keys."""
        return []


class Expectation(BaseModel):
    """A data-quality rule on a transform's output or a sink's input (Lakeflow's expectations): a
    row passes when ``condition`` (a SQL boolean, Streamling's dialect) is true; false or NULL
    violates it. ``warn`` writes the row and counts it, ``drop`` drops it before the write and
    counts it, ``fail`` stops the flow before the epoch commits, naming the rule and one row."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    condition: str = Field(min_length=1)
    on_violation: Literal["warn", "drop", "fail"] = "warn"


class FromNodeOptions(NodeOptions):
    """Transforms and sinks read from one or more upstream nodes."""

    from_: list[str] | None = Field(default=None, alias="from")
    expectations: list[Expectation] = Field(default_factory=list)

    @field_validator("expectations", mode="before")
    @classmethod
    def _expectations(cls, value: Any) -> Any:
        """Also ``{name: condition}`` or ``{name: {condition, on_violation}}`` (Lakeflow's ``expect_all``)."""
        if isinstance(value, dict):
            return [{"name": k, **(v if isinstance(v, dict) else {"condition": v})} for k, v in value.items()]
        return value

    @field_validator("expectations")
    @classmethod
    def _unique(cls, value: list[Expectation]) -> list[Expectation]:
        names = [e.name for e in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"expectation names must be unique on a node; used twice: {', '.join(twice)}")
        return value

    @field_validator("from_", mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        return csv_list(value)


# --- sources -------------------------------------------------------------------------------------

class GenerateSourceOptions(NodeOptions):
    """Deterministic demo/benchmark rows: row ``i`` is always the same, so reruns compare."""

    type: Literal["generate"] = "generate"
    rows: int | None = Field(default=None, ge=0, description="total rows; unset = unbounded")
    rows_per_second: float | None = Field(default=None, gt=0)
    rows_per_batch: int = Field(default=100_000, ge=1)
    # Bounded so a row's arithmetic stays in int64, where the Python and JVM readers agree exactly.
    start_id: int = Field(default=0, ge=-(2**62), le=2**62)
    seed: int = Field(default=0, ge=-(2**31), le=2**31 - 1)
    profile: Literal["orders", "cdc"] = "orders"
    partitions: int = Field(default=2, ge=1)

    @model_validator(mode="after")
    def _bounded_or_rate(self) -> GenerateSourceOptions:
        if self.rows is None and self.rows_per_second is None:
            raise ValueError("set 'rows' (bounded) or 'rows_per_second' (unbounded)")
        return self


class FileMode(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["bounded", "continuous"] = "continuous"
    poll_interval: str = "5s"


class FileSourceOptions(NodeOptions):
    type: Literal["file"] = "file"
    path: str
    format: Literal["parquet", "csv", "json", "ndjson", "jsonl", "avro"]
    mode: FileMode = Field(default_factory=FileMode)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_shorthand(cls, value: Any) -> Any:
        return {"type": value} if isinstance(value, str) else value


def check_column_types(value: dict[str, str] | None) -> dict[str, str] | None:
    """A declared output ``schema`` uses Streamling's type names (shared by kafka, script, wasm)."""
    check_type_names(value)
    return value


class SchemaIdOverride(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: int = Field(alias="from")
    to: int


class KafkaReadKeys(BaseModel):
    """How a topic is read and decoded: the keys a ``kafka`` source and a ``hybrid`` source's live
    phase share."""

    topic: str
    filter: str | None = None
    include_metadata: bool = False
    data_format: Literal["avro", "json"] = "avro"
    schema_: dict[str, str] | None = Field(default=None, alias="schema")
    validate_writer_schema_ordering: bool = True
    schema_id_overrides: list[SchemaIdOverride] | None = None
    skip_schema_resolution: bool = False
    skip_schema_resolution_for_reader_schema_ids: list[int] | None = None

    def declared_columns(self) -> list[str]:
        """The rows a JSON topic yields: its declared schema, ``_gs_op`` and the metadata columns."""
        from streamling.spec.sql import GS_OP

        return [*(self.schema_ or {}), GS_OP, *(METADATA_COLUMNS if self.include_metadata else [])]

    def read_problems(self, prefix: str) -> list[OptionProblem]:
        """``schema_id_overrides`` names each writer id once, and a ``filter`` over a declared JSON
        ``schema`` names only its columns (``prefix``: where these keys are below the node)."""
        from streamling.spec.sql import filter_column_problem

        problems: list[OptionProblem] = []
        seen: set[int] = set()
        for override in self.schema_id_overrides or []:
            if override.from_ in seen:  # Streamling refuses it too: which target would win is undefined
                problems.append(OptionProblem(f"{prefix}schema_id_overrides", "schema_id_overrides lists "
                                              f"'from: {override.from_}' twice",
                                              "keep one override per writer schema id"))
            seen.add(override.from_)
        if self.filter and self.schema_:
            problem = filter_column_problem(self.filter, self.declared_columns())
            if problem:
                problems.append(OptionProblem(f"{prefix}filter", f"filter fails: {problem}",
                                              "fix the column name in 'filter'"))
        return problems


class KafkaSourceOptions(NodeOptions, KafkaReadKeys):
    """Streamling's Kafka source keys. Decoding (Avro via the registry, or JSON) runs in the JVM."""

    type: Literal["kafka"] = "kafka"
    starting_offsets: str = "earliest"

    @field_validator("starting_offsets", mode="before")
    @classmethod
    def _offsets(cls, value: Any) -> Any:
        text = str(value).strip().lower()
        if text not in ("earliest", "latest") and not text.isdigit():
            raise ValueError(f"must be earliest, latest or an epoch-milliseconds timestamp (got {value!r})")
        return text

    _types = field_validator("schema_")(classmethod(lambda cls, value: check_column_types(value)))

    @model_validator(mode="after")
    def _format_needs_schema(self) -> KafkaSourceOptions:
        if self.data_format == "json" and not self.schema_:
            raise ValueError("data_format: json needs 'schema' (column: type)")
        if self.data_format == "avro" and self.schema_:
            raise ValueError("'schema' is only for data_format: json; Avro schemas come from the schema registry")
        return self

    def key_from_registry(self) -> bool:
        return self.data_format == "avro"  # the record's doc may name primaryKeys

    def predicates(self) -> dict[str, str]:
        return {"filter": self.filter} if self.filter else {}

    def option_problems(self) -> list[OptionProblem]:
        return self.read_problems("")


class ClickHouseSourceOptions(NodeOptions):
    """A bounded scan of a ClickHouse table in sort-key order, one page per epoch."""

    type: Literal["clickhouse"] = "clickhouse"
    table_name: str
    columns: list[str] | None = Field(default=None, description="columns to read (csv); default all")
    filter: str | None = Field(default=None, description="ClickHouse SQL predicate, run by ClickHouse")
    start_at: str | int | None = Field(default=None, description="first sort-key value read (inclusive)")

    _columns = field_validator("columns", mode="before")(classmethod(lambda cls, value: csv_list(value)))


class HybridBoundedSource(BaseModel):
    """The history a ``hybrid`` source reads first."""

    model_config = ConfigDict(extra="forbid")
    source_type: Literal["clickhouse"] = "clickhouse"
    table_name: str
    columns: list[str] | None = None
    filter: str | None = None
    start_at: str | int | None = None

    _columns = field_validator("columns", mode="before")(classmethod(lambda cls, value: csv_list(value)))


class HybridUnboundedSource(KafkaReadKeys):
    """The live topic a ``hybrid`` source continues with; Kafka source keys."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    source_type: Literal["kafka"] = "kafka"
    start_at: str = Field(default="earliest", description="where partitions missing from offset_table start: "
                                                          "earliest, latest or epoch milliseconds")

    @model_validator(mode="after")
    def _valid_for_kafka(self) -> HybridUnboundedSource:
        """Checked like a Kafka source's keys now, not when the backfill ends."""
        try:
            self.kafka_options(NodeOptions(type="hybrid"))
        except ValidationError as exc:
            raise ValueError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None
        return self

    def kafka_options(self, base: NodeOptions) -> KafkaSourceOptions:
        """This phase as a Kafka source node's options (the hybrid's key and telemetry carried over)."""
        data = self.model_dump(by_alias=True, exclude={"source_type", "start_at"}, exclude_none=True)
        return KafkaSourceOptions.model_validate({**data, "type": "kafka", "starting_offsets": self.start_at,
                                                  "primary_key": base.primary_key,
                                                  "telemetry": base.telemetry})


class OffsetTable(BaseModel):
    """A ClickHouse table holding, per topic partition, the Kafka offset the history reaches."""

    model_config = ConfigDict(extra="forbid")
    topic_name: str
    table_name: str
    topic_column: str = "topic"
    partition_column: str = "partition"
    offset_column: str = "offset"


class HybridSourceOptions(NodeOptions):
    """Backfill from ClickHouse, then continue from Kafka where the history ends."""

    type: Literal["hybrid"] = "hybrid"
    bounded_sources: list[HybridBoundedSource] = Field(min_length=1)
    unbounded_source: HybridUnboundedSource
    offset_table: OffsetTable | None = None

    def predicates(self) -> dict[str, str]:  # the live phase's filter is Spark SQL; the history's is ClickHouse's
        live = self.unbounded_source.filter
        return {"unbounded_source.filter": live} if live else {}

    def option_problems(self) -> list[OptionProblem]:  # its live phase is a Kafka source
        return self.unbounded_source.read_problems("unbounded_source.")


# --- transforms ----------------------------------------------------------------------------------

class SqlTransformOptions(FromNodeOptions):
    type: Literal["sql"] = "sql"
    sql: str


class ScriptTransformOptions(FromNodeOptions):
    """JavaScript/TypeScript run per batch in a WebAssembly sandbox; ``schema`` coerces the output."""

    type: Literal["script"] = "script"
    language: Literal["javascript", "typescript"] = "javascript"
    script: str
    schema_: dict[str, str] | None = Field(default=None, alias="schema")

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: Any) -> Any:
        aliases = {"js": "javascript", "ts": "typescript"}
        text = str(value).strip().lower()
        return aliases.get(text, text)

    _types = field_validator("schema_")(classmethod(lambda cls, value: check_column_types(value)))


class WasmTransformOptions(FromNodeOptions):
    """A user's Extism plugin, called once per Arrow batch (README: "WASM plugin transform")."""

    type: Literal["wasm"] = "wasm"
    module: str = Field(description="path of the .wasm file, relative to the working directory")
    function: str = "process"
    config: dict[str, str] = Field(default_factory=dict, description="the Extism plugin config")
    input_format: Literal["json", "arrow"] = "json"
    schema_: dict[str, str] | None = Field(default=None, alias="schema")
    timeout_ms: int = Field(default=10_000, ge=1, description="per plugin call")
    memory_max_pages: int | None = Field(default=None, ge=1, description="64 KiB pages")

    @field_validator("config", mode="before")
    @classmethod
    def _config_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): "" if v is None else str(v) for k, v in value.items()}
        return value

    _types = field_validator("schema_")(classmethod(lambda cls, value: check_column_types(value)))


class HttpNodeOptions(FromNodeOptions):
    """Keys shared by the ``handler`` transform and the ``webhook`` sink (one request builder)."""

    url: str
    headers: dict[str, str] | None = None
    secret_name: str | None = None
    one_row_per_request: bool = False
    payload_version: Literal[0, 1] = 0

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+", value.strip(), re.I):
            raise ValueError(f"must be an http:// or https:// URL (got {value!r})")
        return value.strip()

    @field_validator("headers", mode="before")
    @classmethod
    def _header_text(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): "" if v is None else str(v) for k, v in value.items()}
        return value


class HandlerTransformOptions(HttpNodeOptions):
    """Rows go to an HTTP endpoint; its JSON response becomes the output rows."""

    type: Literal["handler"] = "handler"
    schema_override: dict[str, str | None] | None = None

    @field_validator("schema_override")
    @classmethod
    def _override_types(cls, value: dict[str, str | None] | None) -> dict[str, str | None] | None:
        check_type_names(value, allow_drop=True)
        return value


IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DYNAMIC_TABLE_BACKENDS = {"postgres": "Postgres", "inmemory": "InMemory"}


class DynamicTableTransformOptions(FromNodeOptions):
    """A lookup set that SQL transforms query with ``dynamic_table_check('<node>', value)``.

    With ``sql`` (a projection and filter over one input) the set is filled from each epoch's
    batch of that input before the transforms that query it run. Without ``sql`` it is managed
    outside the pipeline (rows inserted or deleted directly in Postgres).
    """

    #: common node keys Streamling's dynamic_table does not take; rejected as unknown keys.
    not_accepted: ClassVar[frozenset[str]] = frozenset({"primary_key", "parallelism", "batch_size",
                                                        "batch_flush_interval", "expectations"})

    produces_rows: ClassVar[bool] = False

    type: Literal["dynamic_table"] = "dynamic_table"
    backend_type: Literal["Postgres", "InMemory"]
    backend_entity_name: str = Field(description="the table (Postgres) or set name holding the values")
    sql: str | None = Field(default=None, description="projection/filter over one input; fills the table")
    schema_: str | None = Field(default=None, alias="schema",
                                description="Postgres schema; default dynamic_table_backend.postgres.dt_schema_name")
    column: str = "value"
    time_column: str = "updated_at"
    cache: bool | None = Field(default=None, description="Postgres: keep the set in memory and refresh it "
                                                         "incrementally; default dynamic_table_backend.postgres."
                                                         "cache_enabled")
    cache_refresh_debounce_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="wrap")
    @classmethod
    def _own_keys_only(cls, data: Any, handler: Any) -> Any:
        """Report ``primary_key`` & co. exactly like any other unknown key, alongside other problems."""
        if not isinstance(data, dict) or not (cls.not_accepted & set(data)):
            return handler(data)
        errors: list[InitErrorDetails] = [InitErrorDetails(type="extra_forbidden", loc=(k,), input=data[k])
                                          for k in data if k in cls.not_accepted]
        try:
            handler({k: v for k, v in data.items() if k not in cls.not_accepted})
        except ValidationError as exc:
            for err in exc.errors():
                detail = InitErrorDetails(type=err["type"], loc=err["loc"], input=err.get("input"))
                if "ctx" in err:
                    detail["ctx"] = err["ctx"]
                errors.append(detail)
        raise ValidationError.from_exception_data(cls.__name__, errors)

    @field_validator("backend_type", mode="before")
    @classmethod
    def _backend(cls, value: Any) -> Any:
        """Streamling ignores case and punctuation: ``postgres``, ``in-memory``, ``InMemory`` …"""
        norm = re.sub(r"[^a-z]", "", str(value).lower())
        if norm not in DYNAMIC_TABLE_BACKENDS:
            raise ValueError(f"must be Postgres or InMemory (got {value!r})")
        return DYNAMIC_TABLE_BACKENDS[norm]

    @field_validator("sql")
    @classmethod
    def _sql_text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty; leave 'sql' out for a table filled outside the pipeline")
        return value

    @model_validator(mode="after")
    def _postgres_identifiers(self) -> DynamicTableTransformOptions:
        if self.from_ and self.sql is None:
            raise ValueError("'from' is only used with 'sql' (the input whose rows fill the table)")
        if self.from_ and len(self.from_) > 1:
            raise ValueError(f"a dynamic table is filled from one input; 'from' lists {len(self.from_)}")
        if self.backend_type == "Postgres":
            for key, value in (("backend_entity_name", self.backend_entity_name), ("schema", self.schema_),
                               ("column", self.column), ("time_column", self.time_column)):
                if value is not None and not IDENTIFIER.match(value):
                    raise ValueError(f"{key} {value!r} is not a plain identifier; use letters, digits and _ "
                                     "(not starting with a digit)")
        return self


# --- sinks ---------------------------------------------------------------------------------------

class PrintSinkOptions(FromNodeOptions):
    type: Literal["print"] = "print"
    sample_every: int | None = Field(default=None, ge=1)
    num_records_before_stop: int | None = Field(default=None, ge=1)


class BlackholeSinkOptions(FromNodeOptions):
    type: Literal["blackhole"] = "blackhole"


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


class DeltaSinkOptions(FromNodeOptions):
    type: Literal["delta"] = "delta"
    path: str
    deduplicate: bool = True
    partition_by: list[str] | None = None


class KafkaSinkOptions(FromNodeOptions):
    primary_key_required: ClassVar[str | None] = ("set primary_key on the sink or on a node upstream; it becomes "
                                                  "the message key")

    type: Literal["kafka"] = "kafka"
    topic: str
    data_format: Literal["avro", "json"] = "avro"
    topic_partitions: int = Field(default=1, ge=1)
    compression: Literal["none", "gzip", "lz4", "zstd", "snappy"] = "lz4"
    message_max_bytes: int | None = Field(default=None, ge=1)
    deduplicate: bool = True

    def option_problems(self) -> list[OptionProblem]:
        """``batch_flush_interval`` must read as a duration: it becomes the producer's ``linger.ms``."""
        if self.batch_flush_interval is not None:
            try:
                parse_duration_secs(self.batch_flush_interval)
            except ValueError as exc:
                return [OptionProblem("batch_flush_interval", f"batch_flush_interval: {exc}")]
        return []


class WebhookSinkOptions(HttpNodeOptions):
    """Rows are sent like a ``handler``'s and the responses ignored."""

    type: Literal["webhook"] = "webhook"
    skip_on_error: bool = False


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


# --- plugins -------------------------------------------------------------------------------------

#: Keys of the node itself: never passed to a plugin as its options.
NODE_KEYS = frozenset({"type", "description", "primary_key", "parallelism", "batch_size", "batch_flush_interval",
                       "telemetry", "from", "expectations"})


class PluginOptionsMixin(BaseModel):
    """A plugin node: ``options:`` and the keys flattened onto the node (flattened keys win).

    The registry subclasses this per plugin id with a validator that checks the merged keys
    against the plugin's own options model; ``plugin_options`` holds the validated result."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    options: dict[str, Any] = Field(default_factory=dict)
    _plugin_options: BaseModel | None = PrivateAttr(default=None)

    def raw_plugin_options(self) -> dict[str, Any]:
        flattened = {k: v for k, v in (self.model_extra or {}).items() if k not in NODE_KEYS}
        return {**self.options, **flattened}

    @property
    def plugin_options(self) -> BaseModel:
        if self._plugin_options is None:
            raise AttributeError(f"plugin node type '{getattr(self, 'type', '?')}' was not validated by its registry")
        return self._plugin_options


class PluginSourceOptions(PluginOptionsMixin, NodeOptions):
    """A source provided by a plugin (``type: namespace.name``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class PluginNodeOptions(PluginOptionsMixin, FromNodeOptions):
    """A transform or sink provided by a plugin (``type: namespace.name``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --- registry ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeType:
    """One registered ``type``: its options model and the class that runs it."""

    kind: Literal["source", "transform", "sink"]
    name: str
    options: type[NodeOptions]
    implementation: str  # "module:Class", imported lazily
    bounded_capable: bool = False
    #: ``telemetry.labels`` keys a node of this type may not set, besides ``RESERVED_LABELS``
    #: (Streamling's list: what the type's own metrics are told apart by, a topic, a table …)
    reserved_labels: frozenset[str] = frozenset()


_BUILTINS: list[NodeType] = [
    NodeType("source", "generate", GenerateSourceOptions, "streamling.sources.generate:GenerateSource", True),
    NodeType("source", "file", FileSourceOptions, "streamling.sources.file:FileSource", True,
             reserved_labels=frozenset({"path"})),
    NodeType("source", "kafka", KafkaSourceOptions, "streamling.sources.kafka:KafkaSource",
             reserved_labels=frozenset({"topic"})),
    NodeType("source", "clickhouse", ClickHouseSourceOptions, "streamling.sources.clickhouse:ClickHouseSource", True,
             reserved_labels=frozenset({"table"})),
    NodeType("source", "hybrid", HybridSourceOptions, "streamling.sources.hybrid:HybridSource", True,
             reserved_labels=frozenset({"table", "topic"})),
    NodeType("transform", "sql", SqlTransformOptions, "streamling.transforms.sql:SqlTransform"),
    NodeType("transform", "script", ScriptTransformOptions, "streamling.transforms.script:ScriptTransform",
             reserved_labels=frozenset({"language"})),
    NodeType("transform", "wasm", WasmTransformOptions, "streamling.transforms.wasm:WasmTransform"),
    NodeType("transform", "handler", HandlerTransformOptions, "streamling.transforms.handler:HandlerTransform"),
    NodeType("transform", "dynamic_table", DynamicTableTransformOptions,
             "streamling.transforms.dynamic_table:DynamicTableTransform"),
    NodeType("sink", "print", PrintSinkOptions, "streamling.sinks.print:PrintSink"),
    NodeType("sink", "blackhole", BlackholeSinkOptions, "streamling.sinks.blackhole:BlackholeSink"),
    NodeType("sink", "postgres", PostgresSinkOptions, "streamling.sinks.postgres:PostgresSink",
             reserved_labels=frozenset({"table"})),
    NodeType("sink", "delta", DeltaSinkOptions, "streamling.sinks.delta:DeltaSink"),
    NodeType("sink", "kafka", KafkaSinkOptions, "streamling.sinks.kafka:KafkaSink",
             reserved_labels=frozenset({"topic"})),
    NodeType("sink", "webhook", WebhookSinkOptions, "streamling.sinks.webhook:WebhookSink",
             reserved_labels=frozenset({"url"})),
    NodeType("sink", "clickhouse", ClickHouseSinkOptions, "streamling.sinks.clickhouse:ClickHouseSink",
             reserved_labels=frozenset({"table"})),
    NodeType("sink", "postgres_aggregate", PostgresAggregateSinkOptions,
             "streamling.sinks.postgres_aggregate:PostgresAggregateSink", reserved_labels=frozenset({"table"})),
]

REGISTRY: dict[str, dict[str, NodeType]] = {"source": {}, "transform": {}, "sink": {}}
for _t in _BUILTINS:
    REGISTRY[_t.kind][_t.name] = _t


def register(node_type: NodeType) -> None:
    """Add a node type (plugins use this); a later registration replaces an earlier one."""
    REGISTRY[node_type.kind][node_type.name] = node_type


def parse_key(text: str | None) -> list[str]:
    return [c.strip() for c in (text or "").split(",") if c.strip()]
