"""A script transform's output columns: what its function returns, not only what it was given.

Without ``schema``, the output is the returned object (Streamling's semantics), so the columns are
inferred when the pipeline is planned by calling the function on a few sample rows built from the
input schema (typical, zero/empty, large and NULL values). Returned keys that are input columns
keep the input's type; new keys get the type of the JS values seen (number → float64, boolean,
string; objects and anything mixed or always null → string, objects as JSON text). When no sample
row yields an object (the function throws on them or drops them all), the input's columns are
kept. Either way the runtime fails a batch that returns a key outside these columns (see the
driver in ``quickjs.py``) rather than drop it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamling.spec.types import from_metadata
from streamling.transforms import quickjs

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField, StructType


@dataclass(frozen=True)
class Probe:
    """What the function returned on the sample rows: keys in first-seen order with JS types."""

    returned: int
    failed: int
    keys: dict[str, list[str]]


def sample_rows(schema: StructType) -> list[dict[str, Any]]:
    """Four rows as the script would see them (numbers, text, ISO timestamps): typical, zero or
    empty, large, and NULL. ``_gs_op`` is ``"i"`` in all of them, as a source would send."""
    variants = range(4)
    rows: list[dict[str, Any]] = [{} for _ in variants]
    for field in schema.fields:
        for index in variants:
            rows[index][field.name] = "i" if field.name == "_gs_op" else _sample_value(field, index)
    return rows


def _sample_value(field: StructField, variant: int) -> Any:
    from pyspark.sql import types as T

    if variant == 3:
        return None
    kind: DataType = field.dataType
    if from_metadata(field.metadata) is not None:  # a wide decimal crosses as its text
        return ["1", "0", "1000"][variant]
    if isinstance(kind, (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)):
        return [1, 0, 1000][variant]
    if isinstance(kind, (T.FloatType, T.DoubleType)):
        return [1.5, 0.0, 1000.5][variant]
    if isinstance(kind, T.BooleanType):
        return [True, False, True][variant]
    if isinstance(kind, T.StringType):
        return ["a", "", "1000"][variant]
    if isinstance(kind, (T.TimestampType, T.TimestampNTZType)):
        return ["2026-01-01T00:00:00.000000Z", "1970-01-01T00:00:00.000000Z", "2026-12-31T23:59:59.000000Z"][variant]
    if isinstance(kind, T.DateType):
        return ["2026-01-01", "1970-01-01", "2026-12-31"][variant]
    if isinstance(kind, T.ArrayType):
        return []
    if isinstance(kind, (T.StructType, T.MapType)):
        return {}
    return None


def probe(javascript: str, input_schema: StructType, runtime_path: str, memory_limit_mb: int,
          cpu_limit_ms: int) -> Probe | None:
    """Call the function on the sample rows in the sandbox; None if the script does not even load
    (construction already reported that) or the sandbox stopped."""
    rows = json.dumps(sample_rows(input_schema), ensure_ascii=False).encode()
    result = quickjs.run_batch(runtime_path, quickjs.probe_source(javascript), b"", memory_limit_mb, cpu_limit_ms,
                               [rows])
    if result.trap is not None or result.rc != 0 or not result.stdout.strip():
        return None
    try:
        report = json.loads(result.stdout.splitlines()[0])
        return Probe(int(report["returned"]), int(report["failed"]),
                     {str(k): [str(t) for t in types] for k, types in report["keys"]})
    except (ValueError, KeyError, TypeError):
        return None


def inferred_schema(found: Probe, input_schema: StructType) -> StructType:
    """The returned keys as columns: input columns keep their field, new ones get a JS-derived type."""
    from pyspark.sql import types as T

    by_name = {f.name: f for f in input_schema.fields}
    fields = [by_name.get(name) or T.StructField(name, js_type(types), True) for name, types in found.keys.items()]
    if "_gs_op" in by_name and "_gs_op" not in found.keys:
        fields.append(by_name["_gs_op"])  # carried by the driver from the input row
    return T.StructType(fields)


def js_type(types: list[str]) -> DataType:
    """The Spark type for the JS types a key had: numbers are float64 (JS has no integers)."""
    from pyspark.sql import types as T

    seen = set(types) - {"null", "undefined"}
    if seen == {"number"}:
        return T.DoubleType()
    if seen == {"boolean"}:
        return T.BooleanType()
    if seen == {"bigint"}:
        return T.LongType()
    return T.StringType()


def undeclared_keys(found: Probe, declared: list[str]) -> list[str]:
    """Returned keys a declared ``schema`` lacks (``_gs_op`` is always carried)."""
    return [k for k in found.keys if k not in declared and k != "_gs_op"]


def type_hint(found: Probe, keys: list[str]) -> str:
    """``{tier: string, score: float64}`` for the keys, typed as inference would type them."""
    names = {"double": "float64", "boolean": "boolean", "bigint": "int64", "string": "string"}
    parts = [f"{k}: {names.get(js_type(found.keys[k]).simpleString(), 'string')}" for k in keys]
    return "{" + ", ".join(parts) + "}"
