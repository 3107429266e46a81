"""Registration of plugins by decorator, and their place in the node type registry.

``@source("acme.orders")`` (and ``transform``, ``sink``, ``preprocessor``, ``side_output``) records a
plugin class under its id; source, transform and sink plugins also become node types, so a pipeline
names them in ``type`` and validation checks their options like a built-in's. ``@udf`` registers a
vectorised SQL function. Registering an id twice keeps the later class (Streamling's rule).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, model_validator
from pydantic import ValidationError as PydanticValidationError

from streamling.plugins.api import (
    Plugin,
    PreprocessorPlugin,
    SideOutputPlugin,
    SinkPlugin,
    SourcePlugin,
    TransformPlugin,
)
from streamling.spec.nodes import NodeType, PluginNodeOptions, PluginOptionsMixin, PluginSourceOptions, register

if TYPE_CHECKING:
    from streamling.spec.pipeline import Kind as NodeKind

Kind = Literal["source", "transform", "sink", "preprocessor", "side_output"]
PLUGIN_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
ENV_PREFIX = "STREAMLING__PLUGIN__"
P = TypeVar("P", bound=type[Plugin[Any]])

#: the runtime adapter of each kind of plugin that is also a node type
_IMPLEMENTATION: dict[Kind, tuple[NodeKind, str]] = {
    "source": ("source", "streamling.sources.plugin:PluginSource"),
    "transform": ("transform", "streamling.transforms.plugin:PluginTransform"),
    "sink": ("sink", "streamling.sinks.plugin:PluginSink"),
}
#: what a plugin of each kind must define itself: checked when it registers, so a plugin missing one
#: fails to load (reported with its distribution) instead of failing an epoch later
REQUIRED: dict[Kind, tuple[str, ...]] = {
    "source": ("output_schema", "read"), "transform": ("process_batch",), "sink": ("write_batch",),
    "preprocessor": ("preprocess",), "side_output": ("process_batch",),
}
_BASES: dict[Kind, type[Plugin[Any]]] = {
    "source": SourcePlugin, "transform": TransformPlugin, "sink": SinkPlugin,
    "preprocessor": PreprocessorPlugin, "side_output": SideOutputPlugin,
}


@dataclass(frozen=True)
class PluginInfo:
    plugin_id: str
    kind: Kind
    cls: type[Plugin[Any]]
    #: the distribution (``pip`` name) or file the plugin came from, for messages and ``streamling plugins``
    origin: str = ""


@dataclass(frozen=True)
class PluginUdf:
    """A vectorised SQL function: ``fn`` takes one ``pyarrow.Array`` per argument and returns one."""

    name: str
    fn: Callable[..., Any]
    #: the Spark type name of the result (``double``, ``string``, ``bigint``, …)
    returns: str
    min_args: int
    max_args: int | None
    deterministic: bool
    origin: str = ""


PLUGINS: dict[tuple[Kind, str], PluginInfo] = {}
UDFS: dict[str, PluginUdf] = {}
#: set by discovery while a distribution or file is being imported (``loading_from``)
_origin: list[str] = []


@contextmanager
def loading_from(origin: str) -> Iterator[None]:
    """Plugins registered inside this block say they came from ``origin`` (a distribution or file)."""
    _origin.append(origin)
    try:
        yield
    finally:
        _origin.pop()


def env_key(plugin_id: str) -> str:
    """``basic_plugin.random_source`` → ``BASIC_PLUGIN_RANDOM_SOURCE`` (``STREAMLING__PLUGIN__<this>__<KEY>``)."""
    return re.sub(r"[^A-Za-z0-9]", "_", plugin_id).upper()


def env_options(plugin_id: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Option overrides from the environment; they win over the pipeline's keys."""
    prefix = f"{ENV_PREFIX}{env_key(plugin_id)}__"
    env = os.environ if environ is None else environ
    return {k[len(prefix):].lower(): v for k, v in env.items() if k.startswith(prefix) and len(k) > len(prefix)}


def resolve_options(info: PluginInfo, raw: dict[str, Any]) -> BaseModel:
    """The plugin's options model filled from ``raw`` and the environment (env wins); an empty
    string counts as unset, as Streamling's community plugins treat it."""
    merged = {**raw, **env_options(info.plugin_id)}
    merged = {k: v for k, v in merged.items() if not (isinstance(v, str) and v == "")}
    return info.cls.Options.model_validate(merged)


def _options_model(info: PluginInfo) -> type[PluginSourceOptions] | type[PluginNodeOptions]:
    """A node options model for ``info``: the node's keys, then the plugin's own, checked at validation."""
    base: type[PluginSourceOptions] | type[PluginNodeOptions] = (
        PluginSourceOptions if info.kind == "source" else PluginNodeOptions)

    def check(self: PluginOptionsMixin) -> PluginOptionsMixin:
        try:
            self._plugin_options = resolve_options(info, self.raw_plugin_options())
        except PydanticValidationError as exc:
            problems = []
            for err in exc.errors():
                where = ".".join(str(p) for p in err["loc"]) or "options"
                problems.append(f"option '{where}': {err['msg']}")
            raise ValueError(f"plugin '{info.plugin_id}': {'; '.join(problems)}") from None
        return self

    name = "PluginOptions_" + env_key(info.plugin_id)
    model: type[PluginSourceOptions] | type[PluginNodeOptions] = type(name, (base,), {
        "__module__": __name__,
        "_check_plugin_options": model_validator(mode="after")(check),
    })
    return model


def _register(kind: Kind, plugin_id: str) -> Callable[[P], P]:
    if not PLUGIN_ID.match(plugin_id):
        raise ValueError(f"plugin id {plugin_id!r} must be 'namespace.name' or 'name' (letters, digits, '_')")

    def decorate(cls: P) -> P:
        base = _BASES[kind]
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"@{kind}({plugin_id!r}) decorates a subclass of {base.__name__}, got {cls!r}")
        missing = [name for name in REQUIRED[kind] if getattr(cls, name) is getattr(base, name)]
        planned = ("latest_offset", "read_between")  # a source planned per partition needs no read()
        if missing == ["read"] and all(getattr(cls, n) is not getattr(base, n) for n in planned):
            missing = []
        if missing:
            raise TypeError(f"{kind.replace('_', ' ')} plugin {plugin_id!r} ({cls.__name__}) must define "
                            + ", ".join(f"{name}()" for name in missing))
        cls.plugin_id = plugin_id
        info = PluginInfo(plugin_id, kind, cls, _origin[-1] if _origin else cls.__module__)
        PLUGINS[(kind, plugin_id)] = info
        if kind in _IMPLEMENTATION:
            node_kind, implementation = _IMPLEMENTATION[kind]
            bounded = bool(getattr(cls, "bounded", False)) if kind == "source" else False
            register(NodeType(node_kind, plugin_id, _options_model(info), implementation, bounded))
        return cls

    return decorate


def source(plugin_id: str) -> Callable[[P], P]:
    """Register a ``SourcePlugin`` subclass as source type ``plugin_id``."""
    return _register("source", plugin_id)


def transform(plugin_id: str) -> Callable[[P], P]:
    """Register a ``TransformPlugin`` subclass as transform type ``plugin_id``."""
    return _register("transform", plugin_id)


def sink(plugin_id: str) -> Callable[[P], P]:
    """Register a ``SinkPlugin`` subclass as sink type ``plugin_id``."""
    return _register("sink", plugin_id)


def preprocessor(plugin_id: str) -> Callable[[P], P]:
    """Register a ``PreprocessorPlugin``, enabled by ``plugin.preprocessor_ids``."""
    return _register("preprocessor", plugin_id)


def side_output(plugin_id: str) -> Callable[[P], P]:
    """Register a ``SideOutputPlugin``, enabled by ``plugin.side_output_ids``."""
    return _register("side_output", plugin_id)


F = TypeVar("F", bound=Callable[..., Any])


def udf(name: str, returns: str, *, args: int | tuple[int, int | None] | None = None,
        deterministic: bool = True) -> Callable[[F], F]:
    """Register a vectorised SQL function ``name`` returning Spark type ``returns``.

    The function receives one ``pyarrow.Array`` per argument and returns a ``pyarrow.Array`` of
    the same length. ``args`` is the argument count (or ``(min, max)``, ``max`` None for any); by
    default the function's positional parameters decide it."""
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise ValueError(f"UDF name {name!r} must be an SQL identifier")

    def decorate(fn: F) -> F:
        lo: int
        hi: int | None
        if args is None:
            import inspect

            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
            variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
            lo = sum(1 for p in params if p.kind != p.VAR_POSITIONAL and p.default is p.empty)
            hi = None if variadic else sum(1 for p in params if p.kind != p.VAR_POSITIONAL)
        elif isinstance(args, int):
            lo, hi = args, args
        else:
            lo, hi = args
        UDFS[name.lower()] = PluginUdf(name.lower(), fn, returns, lo, hi, deterministic,
                                       _origin[-1] if _origin else getattr(fn, "__module__", ""))
        return fn

    return decorate


def find(kind: Kind, plugin_id: str) -> PluginInfo | None:
    return PLUGINS.get((kind, plugin_id))


def ids(kind: Kind | None = None) -> list[str]:
    """Registered plugin ids (of one kind), sorted."""
    return sorted(pid for (k, pid) in PLUGINS if kind is None or k == kind)
