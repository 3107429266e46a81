"""The node type registry: each YAML ``type`` of a source, transform or sink, its options model and
the class that runs it.

The runtime implementation of each type is named by a dotted path and imported only when a pipeline
uses it, so validation and notebook authoring need no JVM. A built-in sink is one module (its options
model, its class and its rules, ``streamling.sinks.*``) named by one line below; the sources' and
transforms' options models live by kind (``spec.sources``, ``spec.transforms``). All build on the
keys every node shares (``spec.options``) and reject unknown keys, as Streamling's
``deny_unknown_fields`` does. Plugin nodes are registered here too (``register``), with the options
models below.
"""

from __future__ import annotations

import functools
import importlib
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

# A node type added with ``register`` (or into ``REGISTRY``) subclasses one of these two, so they stay
# importable from here with the registry.
from streamling.spec.options import FromNodeOptions, NodeOptions
from streamling.spec.sources import (
    ClickHouseSourceOptions,
    FileSourceOptions,
    GenerateSourceOptions,
    HybridSourceOptions,
    KafkaSourceOptions,
)
from streamling.spec.transforms import (
    DynamicTableTransformOptions,
    HandlerTransformOptions,
    ScriptTransformOptions,
    SqlTransformOptions,
    WasmTransformOptions,
)

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
    """One registered ``type``: its options model and the class that runs it.

    A built-in sink is one module and one line below (``NodeType.of``): its module holds the options
    model, the runtime class (which declares that model, ``Sink[WebhookSinkOptions]``) and the class's
    rules. The module is imported only when a pipeline names the type, so validating one pipeline
    imports only the nodes it uses. Plugins (and the other built-ins) pass their options model here."""

    kind: Literal["source", "transform", "sink"]
    name: str
    #: the options model; None when the implementation declares it (``NodeType.of``)
    declared_options: type[NodeOptions] | None
    implementation: str  # "module:Class", imported lazily
    bounded_capable: bool = False
    #: ``telemetry.labels`` keys a node of this type may not set, besides ``RESERVED_LABELS``
    #: (Streamling's list: what the type's own metrics are told apart by, a topic, a table …)
    reserved_labels: frozenset[str] = frozenset()

    @classmethod
    def of(cls, kind: Literal["source", "transform", "sink"], name: str, implementation: str, *,
           bounded_capable: bool = False, reserved_labels: frozenset[str] = frozenset()) -> NodeType:
        """A type whose options model is the one its class declares: the registry line names only the class."""
        return cls(kind, name, None, implementation, bounded_capable, reserved_labels)

    @property
    def options(self) -> type[NodeOptions]:
        """The model this type's keys are parsed with."""
        return self.declared_options or _declared_options(self.implementation)

    def load_class(self) -> type:
        """The class named by ``implementation``, imported on first use (its kind is checked by the planner)."""
        return _load_class(self.implementation)


@functools.cache
def _load_class(implementation: str) -> type:
    module_name, _, class_name = implementation.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not isinstance(cls, type):
        raise TypeError(f"{implementation} is {cls!r}, not a node class")
    return cls


@functools.cache
def _declared_options(implementation: str) -> type[NodeOptions]:
    """The options model a node class declares through its generic base (``Sink[DeltaSinkOptions]``)."""
    cls = _load_class(implementation)
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type) and issubclass(args[0], NodeOptions):
                return args[0]
    raise TypeError(f"{implementation} declares no options model: subclass its kind with one, e.g. "
                    f"Sink[MySinkOptions], or register it with NodeType(kind, name, MyOptions, …)")


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
    NodeType.of("sink", "print", "streamling.sinks.print:PrintSink"),
    NodeType.of("sink", "blackhole", "streamling.sinks.blackhole:BlackholeSink"),
    NodeType.of("sink", "postgres", "streamling.sinks.postgres:PostgresSink", reserved_labels=frozenset({"table"})),
    NodeType.of("sink", "delta", "streamling.sinks.delta:DeltaSink"),
    NodeType.of("sink", "kafka", "streamling.sinks.kafka:KafkaSink", reserved_labels=frozenset({"topic"})),
    NodeType.of("sink", "webhook", "streamling.sinks.webhook:WebhookSink", reserved_labels=frozenset({"url"})),
    NodeType.of("sink", "clickhouse", "streamling.sinks.clickhouse:ClickHouseSink",
                reserved_labels=frozenset({"table"})),
    NodeType.of("sink", "postgres_aggregate", "streamling.sinks.postgres_aggregate:PostgresAggregateSink",
                reserved_labels=frozenset({"table"})),
]

REGISTRY: dict[str, dict[str, NodeType]] = {"source": {}, "transform": {}, "sink": {}}
for _t in _BUILTINS:
    REGISTRY[_t.kind][_t.name] = _t


def register(node_type: NodeType) -> None:
    """Add a node type (plugins use this); a later registration replaces an earlier one."""
    REGISTRY[node_type.kind][node_type.name] = node_type
