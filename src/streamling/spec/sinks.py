"""Options of the built-in sinks: ``print``, ``blackhole``, ``postgres``, ``delta``, ``kafka``,
``webhook``, ``clickhouse`` and ``postgres_aggregate``."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from streamling.spec.options import FromNodeOptions, HttpNodeOptions, OptionProblem
from streamling.util import parse_duration_secs


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
