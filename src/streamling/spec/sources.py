"""Options of the built-in sources: ``generate``, ``file``, ``kafka``, ``clickhouse`` and ``hybrid``.

A ``hybrid`` source's live phase is checked as a Kafka source's keys (``KafkaReadKeys``), so the
two read a topic the same way.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from streamling.spec.options import NodeOptions, OptionProblem, check_column_types
from streamling.util import csv_list

#: the columns ``include_metadata`` adds to a Kafka source's rows
METADATA_COLUMNS = ["_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key"]


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
