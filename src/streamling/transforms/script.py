"""Script transform: user JavaScript/TypeScript over each Arrow batch, inside a WASM sandbox.

The batch goes into the sandbox whole, column by column (one QuickJS instance per batch, see
``quickjs.py``); the user's single top-level function gets each row as an object and returns an
object, an array of objects (one row in, several out) or null (drop). Coercion to the output
``schema`` happens in the sandbox, so what comes back is already typed columns (raw number and
boolean buffers, text with UTF-16 lengths, JSON for the rest) that become Arrow arrays without a
Python loop over rows.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamling.errors import NodeFailure, first_line
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext
from streamling.spec.transforms import ScriptTransformOptions
from streamling.spec.types import decimal_texts, from_metadata, parse_type, with_wide_metadata
from streamling.transforms import quickjs, script_schema
from streamling.transforms.arrow import ArrowTransform, BatchFunction

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

NODE_KIND = "script transform"
PROBE_CPU_LIMIT_MS = 2_000


def coercion_kind(data_type: DataType, metadata: dict[str, Any] | None = None) -> str:
    """How the sandbox coerces a value for a Spark type ("raw" passes it through unchanged).

    A wide decimal column (text tagged in ``metadata``) is "raw": the host checks and canonicalises
    its values, and refuses rather than nulls what is not an exact decimal."""
    from pyspark.sql import types as T

    if from_metadata(metadata) is not None:
        return "raw"
    if isinstance(data_type, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "int"
    if isinstance(data_type, (T.FloatType, T.DoubleType)):
        return "float"
    if isinstance(data_type, T.StringType):
        return "string"
    if isinstance(data_type, T.BooleanType):
        return "bool"
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType, T.DateType)):
        return "ts"
    if isinstance(data_type, T.DecimalType):
        return "decimal"
    return "raw"


@dataclass(frozen=True)
class ScriptJob:
    """Everything an executor needs for one node: plain data, so it pickles small."""

    node: str
    driver: str
    trace_driver: str
    runtime_path: str
    memory_limit_mb: int
    cpu_limit_ms: int
    output_schema: pa.Schema
    primary_key: tuple[str, ...]
    unknown_keys_hint: str = "add them to 'schema' (or stop returning them)"  # what to do about unknown keys


class ScriptTransform(ArrowTransform[ScriptTransformOptions]):
    """``type: script``: JavaScript or TypeScript, one sandbox call per Arrow batch."""

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.script_options: ScriptTransformOptions = self.options
        source = self.script_options.script
        if self.script_options.language == "typescript":
            try:
                source = quickjs.transpile_typescript(source)
            except Exception as exc:  # noqa: BLE001 - SWC raises its own exception types
                raise ctx.error(f"TypeScript does not compile: {first_line(str(exc))}",
                                hint="fix the TypeScript in 'script'", code="script_invalid") from exc
        self.javascript = source
        settings = ctx.settings.wasm_script
        self.runtime_path = settings.runtime_wasm_file_path or quickjs.default_runtime_path()
        self.memory_limit_mb = settings.memory_limit_mb
        self.cpu_limit_ms = settings.cpu_limit_ms
        self._schemas: dict[str, tuple[StructType, str]] = {}  # input schema JSON -> (output, hint)
        self._check_loads(ctx)

    def _check_loads(self, ctx: NodeContext) -> None:
        """Evaluate the script once on no rows, so a syntax error stops the pipeline before it starts."""
        try:
            result = quickjs.run_batch(self.runtime_path, quickjs.driver_source(self.javascript, []), b"",
                                       self.memory_limit_mb, self.cpu_limit_ms)
        except OSError as exc:
            raise ctx.error(f"cannot load the script runtime {self.runtime_path}: {exc}",
                            hint="check wasm_script.runtime_wasm_file_path", code="config_invalid") from exc
        report = _report(result.stderr)
        if report is not None or result.trap is not None or result.rc != 0:
            message = str(report.get("message")) if report else (result.trap or first_line(result.stderr))
            line = _script_line(str(report.get("stack", ""))) if report else None
            at_line = f" (script line {line})" if line else ""
            raise ctx.error(f"the script does not load: {message}{at_line}", hint="fix 'script'",
                            code="script_invalid")

    def output_schema(self, input_schema: StructType) -> StructType:
        """The declared ``schema``, else the keys the function returns on sample rows (see
        ``script_schema``); either way checked against what the function returned there, so a
        returned key is never dropped without a word. Cached per input schema: probing costs a
        sandbox run, and the planner and every epoch ask."""
        key = input_schema.json()
        cached = self._schemas.get(key)
        if cached is None:
            cached = self._schemas[key] = self._resolve_schema(input_schema)
        return cached[0]

    def _resolve_schema(self, input_schema: StructType) -> tuple[StructType, str]:
        from pyspark.sql import types as T

        # A few sample rows need far less than a batch's budget: an endless loop must not hold
        # planning for the whole limit (the run then reports it with the limit to raise).
        found = script_schema.probe(self.javascript, input_schema, self.runtime_path, self.memory_limit_mb,
                                    min(self.cpu_limit_ms, PROBE_CPU_LIMIT_MS))
        declared = self.script_options.schema_
        if not declared:
            if found is None or not found.returned:
                return input_schema, ("the sample rows tried at start-up returned no object, so the output kept "
                                      "the input's columns; declare 'schema' with every column the script returns")
            return script_schema.inferred_schema(found, input_schema), (
                "the output columns were inferred from what the script returned for sample rows at start-up; "
                "declare 'schema' with every column the script returns")
        extra = script_schema.undeclared_keys(found, list(declared)) if found else []
        if extra:
            raise self.ctx.error(
                f"the script returns keys {extra} that are not in its 'schema' {list(declared)}: "
                "they would be dropped", hint=f"add them to 'schema', e.g. {script_schema.type_hint(found, extra)}"
                if found else "add them to 'schema'", code="script_schema_incomplete")
        fields = [parse_type(type_name).spark_field(name) for name, type_name in declared.items()]
        if GS_OP in input_schema.fieldNames() and GS_OP not in declared:
            fields.append(T.StructField(GS_OP, T.StringType(), True))
        return T.StructType(fields), "add them to 'schema' (or stop returning them)"

    def batch_function(self, input_schema: StructType, epoch: Epoch | None) -> BatchFunction:
        from pyspark.sql.pandas.types import to_arrow_schema

        out = self.output_schema(input_schema)
        columns = [(f.name, coercion_kind(f.dataType, f.metadata)) for f in out.fields]
        job = ScriptJob(
            node=self.name,
            driver=quickjs.driver_source(self.javascript, columns),
            trace_driver=quickjs.driver_source(self.javascript, columns, trace=True),
            runtime_path=self.runtime_path,
            memory_limit_mb=self.memory_limit_mb,
            cpu_limit_ms=self.cpu_limit_ms,
            output_schema=with_wide_metadata(to_arrow_schema(out, timezone="UTC"), out),
            primary_key=tuple(c for c in self.ctx.primary_key if c in input_schema.fieldNames()),
            unknown_keys_hint=self._schemas[input_schema.json()][1],
        )
        return functools.partial(run_script_batches, job)


def run_script_batches(job: ScriptJob, batches: Any) -> Any:
    """Executor side: each Arrow batch through the sandbox once, typed rows back."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        stdin, texts = encode_batch(batch)
        result = quickjs.run_batch(job.runtime_path, job.driver, stdin, job.memory_limit_mb, job.cpu_limit_ms, texts)
        failure = _failure(job, batch, result)
        if failure is not None:
            raise failure
        try:
            table = decode_output(result.stdout, job.output_schema)
        except UnknownKeys as exc:
            raise NodeFailure(job.node, NODE_KIND, str(exc), hint=job.unknown_keys_hint) from None
        except ValueError as exc:  # a value that does not fit its declared column is refused, never narrowed
            raise NodeFailure(job.node, NODE_KIND, str(exc),
                              hint="return a value that fits the column's type in 'schema'") from None
        if table.num_rows:
            yield from table.to_batches()


def encode_batch(batch: pa.RecordBatch) -> tuple[bytes, list[bytes]]:
    """A batch in the sandbox's columnar input format (see the driver in ``quickjs.py``): stdin and
    script arguments.

    Numbers, decimals and booleans cross on stdin as raw float64/uint8 buffers with a validity byte
    per row, so the sandbox neither parses nor formats them (float text conversion dominates
    QuickJS's cost); everything else crosses as one JSON array per column, each a script argument
    (JSON escapes NUL). Text with at most half as many distinct values as rows crosses as a JSON
    array of the distinct values plus an int32 index and a validity byte per row on stdin.
    Timestamps become ISO-8601 UTC text, formatted as naive UTC (Arrow's time-zone-aware formatting
    is ten times slower).
    """
    import json

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    cols: list[list[str]] = []
    texts: list[bytes] = []
    blobs: list[bytes] = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        kind = field.type
        if (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
                or pa.types.is_decimal(kind)):
            is_bool = pa.types.is_boolean(kind)
            target = pa.uint8() if is_bool else pa.float64()
            cast = pc.cast(column, target) if pa.types.is_decimal(kind) else pc.cast(column, target, safe=False)
            values = cast.fill_null(0).to_numpy(zero_copy_only=False)
            valid = column.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
            blobs.append(np.ascontiguousarray(values, dtype=np.uint8 if is_bool else np.float64).tobytes())
            blobs.append(valid.tobytes())
            cols.append([field.name, "bool" if is_bool else "num"])
            continue
        if pa.types.is_timestamp(kind):
            column = iso_utc(column)
        elif pa.types.is_date(kind):
            column = pc.cast(column, pa.string())
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            # Repeated text (codes, countries, _gs_op) crosses once per distinct value: each JSON
            # string becomes an allocation in the sandbox, an index does not.
            encoded = pc.dictionary_encode(column)
            if len(encoded.dictionary) * 2 <= n:
                blobs.append(encoded.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32).tobytes())
                blobs.append(column.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
                cols.append([field.name, "dict"])
                texts.append(json.dumps(encoded.dictionary.to_pylist(), ensure_ascii=False).encode())
                continue
        cols.append([field.name, "json"])
        texts.append(json.dumps(column.to_pylist(), default=str, ensure_ascii=False).encode())
    header = json.dumps({"n": n, "cols": cols}).encode() + b"\n"
    return header + b"".join(blobs), texts


def iso_utc(column: pa.Array) -> pa.Array:
    """Timestamps as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` text in UTC, whatever their unit and zone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    naive = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.timestamp("us"))
    text = pc.replace_substring(pc.cast(naive, pa.string()), " ", "T", max_replacements=1)
    return pc.binary_join_element_wise(text, "Z", "")


def decode_output(data: bytes, schema: pa.Schema) -> pa.Table:
    """The sandbox's columnar output as a table in ``schema`` (already coerced by the driver).

    The header names each column's encoding (see the driver in ``quickjs.py``): ``json`` lines
    first, then the raw buffers in column order, then the text of every ``str`` column back to back.
    """
    import json
    from decimal import Decimal

    import numpy as np
    import pyarrow as pa

    if not data.strip():
        return pa.Table.from_batches([], schema=schema)
    pos = data.index(b"\n")
    head = json.loads(data[:pos])
    n, encodings = int(head["n"]), list(head["enc"])
    if head.get("extra"):
        raise UnknownKeys(list(head["extra"]), schema.names)
    if len(encodings) != len(schema):
        raise ValueError(f"the sandbox returned {len(encodings)} columns for a schema of {len(schema)}")
    pos += 1
    arrays: list[pa.Array | None] = [None] * len(schema)
    for index, enc in enumerate(encodings):
        if enc != "json":
            continue
        kind = schema.field(index).type
        end = data.index(b"\n", pos)
        values = json.loads(data[pos:end])
        pos = end + 1
        wide = from_metadata(schema.field(index).metadata)
        if wide is not None:
            arrays[index] = decimal_texts(values, wide, schema.field(index).name)
            continue
        if pa.types.is_decimal(kind):
            values = [None if v is None else Decimal(str(v)) for v in values]
        arrays[index] = pa.array(values, type=kind)
    texts: list[tuple[int, Any, Any]] = []
    for index, enc in enumerate(encodings):
        if enc == "json":
            continue
        kind = schema.field(index).type
        dtype = {"num": np.float64, "bool": np.uint8, "str": np.int32}[enc]
        raw = np.frombuffer(data, dtype=dtype, count=n, offset=pos)
        pos += n * raw.itemsize
        nulls = np.frombuffer(data, dtype=np.uint8, count=n, offset=pos) != 0
        pos += n
        if enc == "str":
            texts.append((index, raw, nulls))
        elif enc == "bool":
            arrays[index] = pa.array(raw.astype(bool), type=kind, mask=nulls)
        else:
            if pa.types.is_floating(kind):
                arrays[index] = pa.array(raw, mask=nulls).cast(kind)
                continue
            # The driver stores any JS number: in an integer column a non-finite one is NULL and
            # the rest truncate toward zero (as Math.trunc does).
            finite = np.isfinite(raw)
            arrays[index] = pa.array(np.where(finite, raw, 0.0), mask=nulls | ~finite).cast(kind, safe=False)
    if texts:
        for (index, _, _), array in zip(texts, _texts(data[pos:], texts), strict=True):
            kind = schema.field(index).type
            if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
                arrays[index] = _timestamps(array, kind)
            else:
                arrays[index] = array if array.type == kind else array.cast(kind)
    return pa.Table.from_arrays([a for a in arrays if a is not None], schema=schema)


class UnknownKeys(ValueError):
    """Returned keys that are not output columns: they would be lost, so the batch fails instead."""

    def __init__(self, keys: list[str], columns: list[str]) -> None:
        self.keys = keys
        super().__init__(f"the script returned keys {keys} that are not in the output schema {columns}")


def _texts(blob: bytes, columns: list[tuple[int, Any, Any]]) -> list[pa.Array]:
    """String arrays from one UTF-8 text and each value's length in UTF-16 code units (JS lengths).

    ASCII text (the common case) needs no conversion: units are bytes. Otherwise each byte counts
    the UTF-16 units of the character it starts (continuation bytes none, 4-byte sequences two),
    and the running sum locates every value's first byte. Text that is not valid UTF-8 (a lone
    surrogate from JS) has its bad sequences replaced by U+FFFD.
    """
    import numpy as np
    import pyarrow as pa

    lengths = np.concatenate([raw for _, raw, _ in columns]).astype(np.int64)
    units = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=units[1:])
    ascii_only = blob.isascii()
    if ascii_only:
        starts = units
    else:
        octets = np.frombuffer(blob, dtype=np.uint8)
        per_byte = ((octets & 0xC0) != 0x80).astype(np.int64) + (octets >= 0xF0)
        before = np.zeros(len(octets) + 1, dtype=np.int64)
        np.cumsum(per_byte, out=before[1:])
        starts = np.searchsorted(before, units, side="right") - 1
    out: list[pa.Array] = []
    first = 0
    for _, raw, nulls in columns:
        n = len(raw)
        bounds = starts[first:first + n + 1]
        first += n
        text = blob[bounds[0]:bounds[-1]]
        offsets = bounds - bounds[0]
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
        large = len(text) >= 2**31
        maker = pa.LargeStringArray if large else pa.StringArray
        array = maker.from_buffers(n, pa.py_buffer(offsets.astype(np.int64 if large else np.int32)),
                                   pa.py_buffer(text), validity)
        if not ascii_only:
            try:
                array.validate(full=True)
            except pa.ArrowInvalid:
                values = [None if nulls[i] else text[offsets[i]:offsets[i + 1]].decode("utf-8", "replace")
                          for i in range(n)]
                array = pa.array(values, type=array.type)
        out.append(array if not large else array.cast(pa.string()))
    return out


def _timestamps(strings: pa.Array, kind: pa.DataType) -> pa.Array:
    """ISO-8601 text to timestamps; text without an offset is UTC, text that is no time is NULL.

    One vectorised cast in the common case; the per-value fallback only runs for odd input.
    """
    import pyarrow as pa

    try:
        return strings.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    naive = pa.timestamp("us")
    out: list[Any] = []
    for value in strings:
        try:
            out.append(value.cast(kind))
            continue
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        try:
            out.append(pa.scalar(value.cast(naive).value, type=pa.timestamp("us", tz="UTC")).cast(kind))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError):
            out.append(pa.scalar(None, type=kind))
    return pa.array([v.as_py() for v in out], type=kind)


def _failure(job: ScriptJob, batch: pa.RecordBatch, result: quickjs.RunResult) -> NodeFailure | None:
    """A ``NodeFailure`` naming the row, the JS message and the script line, or None if it ran."""
    report = _report(result.stderr)
    if result.trap is None and report is None and result.rc == 0:
        return None
    if result.trap is not None:
        row = _traced_row(job, batch)
        where = f" at {_describe_row(job, batch, row)}" if row is not None else ""
        if result.trap == "cpu":
            return NodeFailure(job.node, NODE_KIND,
                               f"the script ran past its CPU limit of {job.cpu_limit_ms} ms for a batch of "
                               f"{batch.num_rows} rows{where}",
                               hint="make the script finish (no endless loops) or raise wasm_script.cpu_limit_ms")
        if result.trap == "memory":
            return NodeFailure(job.node, NODE_KIND,
                               f"the script ran out of its memory limit of {job.memory_limit_mb} MB{where}",
                               hint="allocate less per row or raise wasm_script.memory_limit_mb")
        if "call stack exhausted" in result.trap:
            return NodeFailure(job.node, NODE_KIND, f"the script recursed too deeply (call stack exhausted){where}",
                               hint="turn the recursion into a loop or bound its depth")
        return NodeFailure(job.node, NODE_KIND, f"the sandbox stopped: {result.trap}{where}")
    if report is None:
        return NodeFailure(job.node, NODE_KIND, f"the script failed: {first_line(result.stderr) or 'no message'}")
    message = str(report.get("message", ""))
    if message in ("null", "") and not report.get("stack"):
        # QuickJS throws a bare null when memory is so short it cannot build the error object itself
        message = "out of memory (the engine could not even allocate the error)"
    line = _script_line(str(report.get("stack", "")))
    at_line = f" (script line {line})" if line else ""
    hint = None
    if "out of memory" in message:
        hint = f"the script exceeded its memory limit of {job.memory_limit_mb} MB (wasm_script.memory_limit_mb)"
    if report.get("kind") == "load":
        return NodeFailure(job.node, NODE_KIND, f"the script does not load: {message}{at_line}",
                           hint=hint or "fix 'script'")
    row = int(report.get("row", -1))
    return NodeFailure(job.node, NODE_KIND, f"{_describe_row(job, batch, row)}: {message}{at_line}",
                       hint=hint or "fix the script or the row")


def _traced_row(job: ScriptJob, batch: pa.RecordBatch) -> int | None:
    """After a trap, run the batch again with a marker per row on stderr to find the culprit.

    Only on the failure path: writing to unbuffered stderr per row would slow every batch.
    """
    try:
        stdin, texts = encode_batch(batch)
        result = quickjs.run_batch(job.runtime_path, job.trace_driver, stdin, job.memory_limit_mb, job.cpu_limit_ms,
                                   texts)
    except Exception:  # noqa: BLE001 - locating the row is best effort
        return None
    marks = re.findall(r"\x1f(\d+)\n", result.stderr)
    return int(marks[-1]) if marks and result.trap is not None else None


def _describe_row(job: ScriptJob, batch: pa.RecordBatch, row: int) -> str:
    if row < 0 or row >= batch.num_rows:
        return "the batch"
    key = ", ".join(f"{c}={batch.column(c)[row].as_py()!r}" for c in job.primary_key
                    if c in batch.schema.names)
    return f"row {row} of the batch" + (f" ({key})" if key else "")


def _report(stderr: str) -> dict[str, Any] | None:
    import json

    start = stderr.rfind("\x1e")
    if start < 0:
        return None
    try:
        value = json.loads(stderr[start + 1:].splitlines()[0])
    except (ValueError, IndexError):
        return None
    return value if isinstance(value, dict) else None


def _script_line(stack: str) -> int | None:
    """The user's line from a QuickJS stack: frames in evaluated code are ``<input>:LINE:COL``."""
    match = re.search(r"<input>:(\d+)", stack)
    return int(match.group(1)) if match else None


