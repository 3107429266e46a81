"""The node contract, checked for every node type streamling ships (and the plugin adapters): what
the runtime relies on without switching on ``type`` names. A new connector that breaks one of these
fails here, before any Spark test."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path

import pytest

from streamling.runtime.nodes import Node, Sink, Source, Transform
from streamling.spec.nodes import REGISTRY, NodeType, PluginNodeOptions, PluginSourceOptions

ROOT = Path(__file__).resolve().parents[2]
BUILTINS = [t for kind in REGISTRY.values() for t in kind.values() if "." not in t.name]
BASES: dict[str, type[Node]] = {"source": Source, "transform": Transform, "sink": Sink}
COMMON_KEYS = {"parallelism", "batch_size", "batch_flush_interval"}
PLUGIN_ADAPTERS = [("source", "streamling.sources.plugin:PluginSource", PluginSourceOptions),
                   ("transform", "streamling.transforms.plugin:PluginTransform", PluginNodeOptions),
                   ("sink", "streamling.sinks.plugin:PluginSink", PluginNodeOptions)]


def _implementation(path: str) -> type[Node]:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _options_type(cls: type) -> type | None:
    """The options model a node class declares through its base (``Sink[DeltaSinkOptions]``)."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    return None


#: the keys each built-in sink requires, to parse a minimal node with its own model
SINK_REQUIRED: dict[str, dict[str, object]] = {
    "print": {}, "blackhole": {}, "delta": {"path": "/tmp/t"}, "kafka": {"topic": "t"},
    "postgres": {"table": "t"}, "clickhouse": {"table": "t"}, "webhook": {"url": "http://127.0.0.1:9/"},
    "postgres_aggregate": {"landing_table": "l", "agg_table": "a", "aggregate": {"n": {"fn": "count"}}}}

CASES = [pytest.param(t.kind, t.implementation, t.options, id=f"{t.kind}:{t.name}") for t in BUILTINS] + [
    pytest.param(kind, path, options, id=f"{kind}:plugin") for kind, path, options in PLUGIN_ADAPTERS]


@pytest.mark.parametrize(("kind", "path", "options"), CASES)
def test_each_node_type_runs_as_its_kind_with_its_options_model(kind: str, path: str, options: type) -> None:
    cls = _implementation(path)
    assert issubclass(cls, BASES[kind]), f"{path} is not a {BASES[kind].__name__}"
    assert not getattr(cls, "__abstractmethods__", None), f"{path} leaves {cls.__abstractmethods__} abstract"
    declared = _options_type(cls)
    # a node declares the model the registry parses its keys with
    assert declared is not None and issubclass(options, declared), (path, declared, options)
    assert set(cls.honoured_keys) <= COMMON_KEYS, f"{path}: honoured_keys {set(cls.honoured_keys) - COMMON_KEYS}"


@pytest.mark.parametrize("node_type", [t for t in BUILTINS if t.kind == "sink"], ids=lambda t: t.name)
def test_each_built_in_sink_is_one_module_named_by_one_registry_line(node_type: NodeType) -> None:
    """Options model, runtime class and its rules in the sink's own module; the registry names the class only."""
    cls = node_type.load_class()
    assert node_type.declared_options is None, f"{node_type.name}: registered with an options model of its own"
    model = node_type.options
    assert model == _options_type(cls)
    assert model.__module__ == cls.__module__ == node_type.implementation.partition(":")[0]
    parsed = model.model_validate({"type": node_type.name, "from": "up", **SINK_REQUIRED[node_type.name]})
    assert parsed.model_dump()["type"] == node_type.name


def test_a_class_without_an_options_model_is_named_with_the_fix() -> None:
    node_type = NodeType.of("sink", "bare", f"{__name__}:_BareSink")
    with pytest.raises(TypeError, match=r"declares no options model.*Sink\[MySinkOptions\]"):
        _ = node_type.options


class _BareSink(Sink):
    def write(self, df: object, epoch: object) -> int:
        return 0


@pytest.mark.parametrize(("kind", "path", "options"), [c for c in CASES if c.values[0] == "sink"])
def test_each_sink_counts_its_rows_consistently(kind: str, path: str, options: type) -> None:
    cls = _implementation(path)
    # the flow takes a node's count from a sink's write only when the write counts what it was given
    assert not cls.counts_received or cls.counts_rows, path
    # taking the input count from Spark's scan needs a write that reads the batch in one job
    assert not cls.reads_once or cls.counts_rows, path


@pytest.mark.parametrize("node_type", BUILTINS, ids=[f"{t.kind}:{t.name}" for t in BUILTINS])
def test_each_built_in_type_is_documented(node_type: NodeType) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`{node_type.name}`" in readme, f"README never names the {node_type.kind} type `{node_type.name}`"
