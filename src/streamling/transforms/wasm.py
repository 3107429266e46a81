"""WASM plugin transform (``type: wasm``): a user's Extism plugin called once per Arrow batch.

The plugin is any ``.wasm`` built with an Extism PDK (or by hand against the Extism kernel). The
host is the ``extism`` SDK, which bundles wasmtime: plugins get no filesystem or network, a
per-call ``timeout_ms`` and an optional memory cap, so a user's code cannot hang or exhaust a
Spark worker. Rows never cross one by one: each call gets a whole batch, either as a JSON array
of row objects (``input_format: json``, easy to write in any PDK) or as Arrow IPC stream bytes
(``input_format: arrow``, no text round trip). The README section "WASM plugin transform"
is the contract a plugin author reads.

Plugins are compiled and instantiated once per Python worker process and cached by module path,
modification time, config and limits, so the per-batch cost is one guest call.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamling.errors import NodeFailure, first_line
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext
from streamling.spec.transforms import WasmTransformOptions
from streamling.spec.types import decimal_texts, from_metadata, parse_type, with_wide_metadata
from streamling.transforms.arrow import ArrowTransform, BatchFunction

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql.types import StructType

NODE_KIND = "wasm transform"
GS_OPS = ("i", "u", "d")

# One live plugin per (path, mtime, config, limits) in each process: instantiating costs tens of
# milliseconds, a call tens of microseconds. A failed call drops its entry (a trapped or timed-out
# instance is not trusted again).
_PLUGINS: dict[tuple[Any, ...], Any] = {}


@dataclass(frozen=True)
class PluginSpec:
    """Everything needed to (re)create the plugin in any process; small and picklable."""

    path: str
    function: str
    config: dict[str, str] = field(default_factory=dict)
    timeout_ms: int = 10_000
    memory_max_pages: int | None = None

    def manifest(self) -> dict[str, Any]:
        manifest: dict[str, Any] = {"wasm": [{"path": self.path}], "timeout_ms": self.timeout_ms}
        if self.memory_max_pages is not None:
            manifest["memory"] = {"max_pages": self.memory_max_pages}
        return manifest

    def cache_key(self) -> tuple[Any, ...]:
        mtime = os.stat(self.path).st_mtime_ns
        return (self.path, mtime, tuple(sorted(self.config.items())), self.timeout_ms, self.memory_max_pages)


def load_plugin(spec: PluginSpec) -> Any:
    """The cached ``extism.Plugin`` for ``spec`` (created on first use in this process)."""
    import extism

    key = spec.cache_key()
    plugin = _PLUGINS.get(key)
    if plugin is None:
        for stale in [k for k in _PLUGINS if k[0] == spec.path]:
            del _PLUGINS[stale]  # the file changed or the config differs: free the old instance
        plugin = extism.Plugin(spec.manifest(), wasi=False, config=spec.config)
        _PLUGINS[key] = plugin
    return plugin


def call_plugin(spec: PluginSpec, node: str, payload: bytes) -> bytes:
    """One guest call; every failure becomes a ``NodeFailure`` naming the node."""
    import extism

    try:
        plugin = load_plugin(spec)
    except (OSError, extism.Error) as exc:
        raise NodeFailure(node, NODE_KIND, f"cannot load module {spec.path}: {exc}") from exc
    try:
        return bytes(plugin.call(spec.function, payload))
    except extism.Error as exc:
        _PLUGINS.pop(spec.cache_key(), None)
        text = str(exc).strip()
        if text.lower() == "timeout":
            raise NodeFailure(node, NODE_KIND, f"plugin function '{spec.function}' timed out after "
                              f"{spec.timeout_ms} ms", hint="raise timeout_ms or make the plugin faster") from exc
        raise NodeFailure(node, NODE_KIND, f"plugin function '{spec.function}' failed: {text}") from exc


# --- batch codecs --------------------------------------------------------------------------------

def _json_default(value: Any) -> Any:
    """JSON has no timestamps or decimals: ISO-8601 text and exact decimal text instead."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _json_ready(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Timestamps become ISO-8601 UTC text and decimals exact text, inside Arrow (vectorised),
    so ``to_pylist`` never builds datetime or Decimal objects (the slow part of the encoding)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for fld, column in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_timestamp(fld.type):
            utc = column.cast(pa.timestamp(fld.type.unit, "UTC")) if fld.type.tz is None else column
            column = pc.strftime(utc, format="%Y-%m-%dT%H:%M:%SZ")
        elif pa.types.is_decimal(fld.type) or pa.types.is_date(fld.type):
            column = column.cast(pa.string())
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def batch_to_json(batch: pa.RecordBatch) -> bytes:
    rows = _json_ready(batch).to_pylist()
    return json.dumps(rows, default=_json_default, separators=(",", ":"), ensure_ascii=False).encode()


def _parse_timestamp(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"expected an ISO-8601 string, got {json.dumps(value)}")
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _json_column(values: list[Any], arrow_type: pa.DataType, fld: pa.Field | None = None) -> pa.Array:
    """One column the slow, exact way: per-value parsing, so a failure names its column."""
    import pyarrow as pa

    wide = from_metadata(fld.metadata) if fld is not None else None
    if wide is not None:
        return decimal_texts(values, wide, fld.name if fld is not None else "")
    if pa.types.is_timestamp(arrow_type):
        return pa.array([_parse_timestamp(v) for v in values], type=arrow_type)
    if pa.types.is_decimal(arrow_type):
        return pa.array([None if v is None else decimal.Decimal(str(v)) for v in values], type=arrow_type)
    return pa.array(values, type=arrow_type)


def _fast_json_columns(rows: list[dict[str, Any]], wanted: list[pa.Field]) -> dict[str, pa.Array]:
    """All columns in one C++ pass (``from_pylist``: missing keys are null, extra keys ignored);
    timestamps are read as text and cast, decimals parsed exactly. Raises on any mismatch."""
    import pyarrow as pa

    exact = {f.name for f in wanted if pa.types.is_decimal(f.type) or from_metadata(f.metadata) is not None}
    as_read = [pa.field(f.name, pa.string()) if pa.types.is_timestamp(f.type) else f
               for f in wanted if f.name not in exact]
    read = pa.RecordBatch.from_pylist(rows, schema=pa.schema(as_read))
    columns: dict[str, pa.Array] = {}
    for fld in wanted:
        if fld.name in exact:
            columns[fld.name] = _json_column([r.get(fld.name) for r in rows], fld.type, fld)
        else:
            column = read.column(fld.name)
            columns[fld.name] = column.cast(fld.type) if column.type != fld.type else column
    return columns


def json_to_columns(node: str, data: bytes, schema: pa.Schema) -> tuple[dict[str, pa.Array], int]:
    """Decode the plugin's JSON array of row objects into the declared columns (by key)."""
    import pyarrow as pa

    try:
        rows = json.loads(data)
    except ValueError as exc:
        raise NodeFailure(node, NODE_KIND, f"plugin output is not valid JSON: {exc}",
                          hint="return a JSON array of row objects") from exc
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise NodeFailure(node, NODE_KIND, "plugin output must be a JSON array of row objects "
                          f"(got {type(rows).__name__})", hint="return a JSON array of row objects")
    wanted = list(schema)
    if any(GS_OP in r for r in rows):
        wanted.append(pa.field(GS_OP, pa.string()))
    try:
        return _fast_json_columns(rows, wanted), len(rows)
    except (ValueError, TypeError, ArithmeticError, pa.ArrowException):
        pass  # find the column at fault, and read timestamps without an offset as UTC
    columns: dict[str, pa.Array] = {}
    for fld in wanted:
        values = [r.get(fld.name) for r in rows]
        try:
            columns[fld.name] = _json_column(values, fld.type, fld)
        except (ValueError, TypeError, ArithmeticError) as exc:  # pyarrow's errors subclass these
            raise NodeFailure(node, NODE_KIND, f"output column '{fld.name}' does not match the declared "
                              f"type {fld.type}: {first_line(exc)}", hint="fix the plugin or the node's 'schema'"
                              ) from exc
    return columns, len(rows)


def batch_to_ipc(batch: pa.RecordBatch) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def ipc_to_columns(node: str, data: bytes, schema: pa.Schema) -> tuple[dict[str, pa.Array], int]:
    """Decode the plugin's Arrow IPC stream; columns are matched by name and cast safely."""
    import pyarrow as pa

    try:
        table = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise NodeFailure(node, NODE_KIND, f"plugin output is not an Arrow IPC stream: {first_line(exc)}",
                          hint="write the output with an Arrow IPC stream writer") from exc
    columns: dict[str, pa.Array] = {}
    wanted = list(schema)
    if GS_OP in table.column_names:
        wanted.append(pa.field(GS_OP, pa.string()))
    for fld in wanted:
        if fld.name not in table.column_names:
            raise NodeFailure(node, NODE_KIND, f"plugin output lacks column '{fld.name}' "
                              f"(it has {', '.join(table.column_names) or 'none'})",
                              hint="fix the plugin or the node's 'schema'")
        column = table.column(fld.name).combine_chunks()
        wide = from_metadata(fld.metadata)
        try:
            if wide is not None:  # decimal256 or text in, canonical exact text out (or refused)
                columns[fld.name] = decimal_texts(column.to_pylist(), wide, fld.name)
            else:
                columns[fld.name] = column if column.type == fld.type else column.cast(fld.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise NodeFailure(node, NODE_KIND, f"output column '{fld.name}' is {column.type}, not the declared "
                              f"{fld.type}: {first_line(exc)}", hint="fix the plugin or the node's 'schema'"
                              ) from exc
    return columns, table.num_rows


@dataclass(frozen=True)
class WasmBatches:
    """The executor-side function: one plugin call per non-empty input batch."""

    node: str
    plugin: PluginSpec
    input_format: str
    output: pa.Schema  # without _gs_op

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc

        for batch in batches:
            if batch.num_rows == 0:
                continue
            if self.input_format == "arrow":
                out = call_plugin(self.plugin, self.node, batch_to_ipc(batch))
                columns, count = ipc_to_columns(self.node, out, self.output)
            else:
                out = call_plugin(self.plugin, self.node, batch_to_json(batch))
                columns, count = json_to_columns(self.node, out, self.output)
            ops = columns.pop(GS_OP, None)
            if ops is None:
                if count != batch.num_rows:
                    raise NodeFailure(self.node, NODE_KIND, f"plugin returned {count} rows for {batch.num_rows} "
                                      f"without '{GS_OP}'",
                                      hint=f"return '{GS_OP}' (i/u/d) in every row when the row count changes")
                ops = batch.column(GS_OP) if GS_OP in batch.schema.names else pa.nulls(count, pa.string())
            ops = pc.fill_null(ops, "i")
            if not pc.all(pc.is_in(ops, value_set=pa.array(GS_OPS))).as_py():
                bad = pc.filter(ops, pc.invert(pc.is_in(ops, value_set=pa.array(GS_OPS))))[0].as_py()
                raise NodeFailure(self.node, NODE_KIND, f"plugin returned {GS_OP} {bad!r}",
                                  hint=f"{GS_OP} must be 'i', 'u' or 'd'")
            names = [f.name for f in self.output]
            yield pa.RecordBatch.from_arrays([columns[n] for n in names] + [ops], names=[*names, GS_OP])


class WasmTransform(ArrowTransform[WasmTransformOptions]):
    """Runs a user's Extism plugin over whole batches; checks the module at plan time."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        path = os.path.abspath(self.options.module)
        self.plugin = PluginSpec(path, self.options.function, dict(self.options.config), self.options.timeout_ms,
                                 self.options.memory_max_pages)
        self._check_module()

    def _check_module(self) -> None:
        """Fail at plan time, naming the node and path, instead of in a worker mid-epoch."""
        import extism

        path = self.plugin.path
        if not os.path.isfile(path):
            raise self.ctx.error(f"module file not found: {path}", code="wasm_module_missing",
                                 hint="set 'module' to a .wasm file (relative paths start at the working directory)")
        try:
            plugin = load_plugin(self.plugin)
        except extism.Error as exc:
            raise self.ctx.error(f"cannot load module {path}: {first_line(exc)}", code="wasm_module_invalid",
                                 hint="build it with an Extism PDK") from exc
        if not plugin.function_exists(self.plugin.function):
            exports = _function_exports(path)
            listed = f" (it exports {', '.join(exports)})" if exports else ""
            raise self.ctx.error(f"module {path} does not export function '{self.plugin.function}'{listed}",
                                 code="wasm_function_missing", hint="set 'function' to one of its exports")

    def output_schema(self, input_schema: StructType) -> StructType:
        from pyspark.sql.types import StringType, StructField, StructType

        if not self.options.schema_:
            return input_schema
        fields = [parse_type(type_name).spark_field(name) for name, type_name in self.options.schema_.items()
                  if name != GS_OP]
        return StructType([*fields, StructField(GS_OP, StringType(), True)])

    def batch_function(self, input_schema: StructType, epoch: Epoch | None) -> BatchFunction:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        out = self.output_schema(input_schema)
        arrow = with_wide_metadata(to_arrow_schema(out, timezone="UTC"), out)
        output = pa.schema([f for f in arrow if f.name != GS_OP])
        return WasmBatches(self.name, self.plugin, self.options.input_format, output)


def _function_exports(path: str) -> list[str]:
    """Names of the module's exported functions, for the error message (best effort)."""
    try:
        import wasmtime

        module = wasmtime.Module.from_file(wasmtime.Engine(), path)
        return sorted(e.name for e in module.exports if isinstance(e.type, wasmtime.FuncType))
    except Exception:  # noqa: BLE001 - only decorates an error that is raised anyway
        return []
