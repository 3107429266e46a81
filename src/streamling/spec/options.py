"""The keys every node accepts, and the option models more than one kind of node shares.

Sources, transforms and sinks (``spec.sources``, ``spec.transforms``, each ``streamling.sinks`` module) build on
``NodeOptions`` and ``FromNodeOptions``; the ``handler`` transform and the ``webhook`` sink share
``HttpNodeOptions``. Plain pydantic models (no Spark), so validation runs without a JVM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from streamling.spec.types import check_type_names
from streamling.util import csv_list

LABEL_KEY = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_LABELS = {"id", "topology_node_type", "operator_type", "service_instance_id"}
MAX_LABELS = 20
MAX_LABEL_VALUE_BYTES = 256


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


def text_map(value: Any) -> Any:
    """A YAML mapping whose values are text (labels, headers, plugin config): numbers and booleans as
    they read, a null as empty text; anything else is left for the model to refuse."""
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    return value


class Telemetry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: dict[str, str] = Field(default_factory=dict)
    event_time: EventTime | None = None

    _labels = field_validator("labels", mode="before")(classmethod(lambda cls, value: text_map(value)))


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


def check_column_types(value: dict[str, str] | None) -> dict[str, str] | None:
    """A declared output ``schema`` uses Streamling's type names (shared by kafka, script, wasm)."""
    check_type_names(value)
    return value


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

    _headers = field_validator("headers", mode="before")(classmethod(lambda cls, value: text_map(value)))


def parse_key(text: str | None) -> list[str]:
    return [c.strip() for c in (text or "").split(",") if c.strip()]
