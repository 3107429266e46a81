"""Avro ↔ Spark schema helpers for the Kafka connectors.

Wide decimals (precision > 38) cannot be Spark decimals: ``from_avro`` refuses them
(DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION) and ``to_avro`` cannot write text as an Avro decimal.
So the source reads such a field as its raw bytes (the reader schema loses only the logical type;
the wire format is the same two's-complement unscaled integer) and turns them into exact decimal
text in an Arrow batch function; the sink does the reverse. The JSON source reads wide columns
from the payload text itself, because Spark's JSON reader turns a fractional number into a double.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from streamling.spec.types import (
    ColumnType,
    decimal_text,
    decimal_type,
    from_metadata,
    from_spark,
    text_to_unscaled,
    unscaled_to_text,
    wide_columns,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType


def unwrap_root(schema: Any) -> dict[str, Any]:
    """Debezium-style roots are ``["null", record]``: read the record itself."""
    if isinstance(schema, list):
        records = [s for s in schema if isinstance(s, dict) and s.get("type") == "record"]
        if len(records) == 1 and all(s == "null" or s is records[0] for s in schema):
            return records[0]
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError("the value schema must be an Avro record (or a union of null and one record)")
    return schema


def primary_keys_from_doc(schema: dict[str, Any]) -> list[str]:
    """Streamling reads ``{"primaryKeys": [...]}`` from the record's ``doc``."""
    doc = schema.get("doc")
    if not doc:
        return []
    try:
        parsed = json.loads(doc)
    except (TypeError, ValueError):
        return []
    keys = parsed.get("primaryKeys") if isinstance(parsed, dict) else None
    return [str(k) for k in keys] if isinstance(keys, list) else []


def _avro_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


def avro_type(dtype: DataType, name: str, metadata: Mapping[str, Any] | None = None) -> Any:
    """The Avro type for a Spark column; scalars map as their Streamling type does, so a wide
    decimal (text tagged in ``metadata``) is ``bytes`` with its full decimal precision."""
    from pyspark.sql import types as T

    kind = from_spark(dtype, metadata)
    if kind is not None:
        return kind.avro()
    if isinstance(dtype, T.BinaryType):
        return "bytes"
    if isinstance(dtype, T.TimestampNTZType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(dtype, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(dtype, T.ArrayType):
        item = avro_type(dtype.elementType, name + "_item")
        return {"type": "array", "items": _nullable(item, dtype.containsNull)}
    if isinstance(dtype, T.MapType):
        values = avro_type(dtype.valueType, name + "_value")
        return {"type": "map", "values": _nullable(values, dtype.valueContainsNull)}
    if isinstance(dtype, T.StructType):
        return record_schema(dtype, name)
    raise ValueError(f"column type {dtype.simpleString()} has no Avro equivalent")


def _nullable(avro: Any, nullable: bool) -> Any:
    return ["null", avro] if nullable else avro


def record_schema(struct: StructType, name: str, namespace: str | None = None,
                  doc: str | None = None) -> dict[str, Any]:
    """An Avro record for a Spark struct; nullable columns become ``["null", T]`` with default null."""
    fields = []
    for field in struct.fields:
        avro = avro_type(field.dataType, f"{name}_{field.name}", field.metadata)
        entry: dict[str, Any] = {"name": field.name, "type": _nullable(avro, field.nullable)}
        if field.nullable:
            entry["default"] = None
        fields.append(entry)
    record: dict[str, Any] = {"type": "record", "name": _avro_name(name), "fields": fields}
    if namespace:
        record["namespace"] = namespace
    if doc:
        record["doc"] = doc
    return record


# --- wide decimals ---------------------------------------------------------------------------------

class WideDecimalError(ValueError):
    """A wide Avro decimal where it cannot be read exactly (inside a nested type)."""


def _decimal_of(avro: Any) -> tuple[int, int] | None:
    """(precision, scale) of an Avro decimal type (bytes or fixed), else None."""
    if isinstance(avro, dict) and avro.get("logicalType") == "decimal" and avro.get("type") in ("bytes", "fixed"):
        return int(avro.get("precision", 0)), int(avro.get("scale", 0))
    return None


def _nested_wide(avro: Any, path: str) -> tuple[str, int] | None:
    """The first wide decimal anywhere inside ``avro`` (path, precision), to refuse it by name."""
    found = _decimal_of(avro)
    if found is not None:
        return (path, found[0]) if found[0] > 38 else None
    children: list[tuple[Any, str]] = []
    if isinstance(avro, list):
        children = [(branch, path) for branch in avro]
    elif isinstance(avro, dict):
        kind = avro.get("type")
        if kind == "record":
            children = [(f.get("type"), f"{path}.{f.get('name')}") for f in avro.get("fields", [])]
        elif kind == "array":
            children = [(avro.get("items"), f"{path}[]")]
        elif kind == "map":
            children = [(avro.get("values"), f"{path}{{}}")]
        elif isinstance(kind, dict | list):
            children = [(kind, path)]
    for child, child_path in children:
        hit = _nested_wide(child, child_path)
        if hit is not None:
            return hit
    return None


def readable_wide_decimals(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, ColumnType]]:
    """The reader record with each top-level wide decimal read as plain bytes/fixed, and those
    columns' types. A wide decimal nested deeper raises ``WideDecimalError`` naming it: refused,
    never narrowed."""
    out = copy.deepcopy(record)
    wide: dict[str, ColumnType] = {}
    for field in out.get("fields", []):
        branches = field["type"] if isinstance(field["type"], list) else [field["type"]]
        for index, branch in enumerate(branches):
            found = _decimal_of(branch)
            if found is None or found[0] <= 38:
                hit = _nested_wide(branch, field["name"])
                if hit is not None:
                    raise WideDecimalError(
                        f"field '{hit[0]}' is an Avro decimal of precision {hit[1]}, nested inside another type; "
                        "decimals beyond 38 digits are read exactly only as top-level fields")
                continue
            fixed = {k: v for k, v in branch.items() if k not in ("logicalType", "precision", "scale")}
            plain: Any = fixed if fixed.get("type") == "fixed" else "bytes"
            if isinstance(field["type"], list):
                field["type"][index] = plain
            else:
                field["type"] = plain
            wide[field["name"]] = decimal_type(*found)
    return out, wide


def _scalar_udf(function: Callable[[pa.Array], pa.Array], returns: DataType | str) -> Any:
    """An Arrow batch function as a scalar Spark UDF (whole Arrow arrays in and out, never rows)."""
    import warnings

    from pyspark.sql.functions import ArrowUDFType, arrow_udf

    with warnings.catch_warnings():  # the type is given explicitly: closures carry no usable hints
        warnings.filterwarnings("ignore", message=".*type hints for arrow UDF.*")
        return arrow_udf(function, returns, ArrowUDFType.SCALAR)  # type: ignore[call-overload]


def _bytes_to_text(scale: int) -> Callable[[pa.Array], pa.Array]:
    def decode(values: pa.Array) -> pa.Array:
        import pyarrow as pa

        return pa.array([None if v is None else unscaled_to_text(int.from_bytes(v, "big", signed=True), scale)
                         for v in values.to_pylist()], type=pa.string())

    return decode


def _text_to_bytes(kind: ColumnType, column: str) -> Callable[[pa.Array], pa.Array]:
    def encode(values: pa.Array) -> pa.Array:
        import pyarrow as pa

        out: list[bytes | None] = []
        for value in values.to_pylist():
            text = decimal_text(value, kind, column)  # refuses what the declared scale cannot hold
            if text is None:
                out.append(None)
                continue
            unscaled = text_to_unscaled(text, kind.scale)
            out.append(unscaled.to_bytes(unscaled.bit_length() // 8 + 1, "big", signed=True))
        return pa.array(out, type=pa.binary())

    return encode


def wide_decimal_columns(df: DataFrame, wide: Mapping[str, ColumnType], from_bytes: bool) -> DataFrame:
    """Tag the wide columns with their type; ``from_bytes``: first turn Avro's two's-complement
    unscaled bytes into exact decimal text (one Arrow batch function per column)."""
    from pyspark.sql import functions as F

    for name, kind in wide.items():
        if name not in df.columns:
            continue
        if from_bytes:
            df = df.withColumn(name, _scalar_udf(_bytes_to_text(kind.scale), "string")(F.col(f"`{name}`")))
        df = df.withMetadata(name, kind.metadata())
    return df


def avro_row(schema: StructType, columns: list[str]) -> Column:
    """The struct ``to_avro`` encodes: wide decimal text becomes the Avro decimal's bytes."""
    from pyspark.sql import functions as F

    out = []
    for name in columns:
        column = F.col("`" + name.replace("`", "``") + "`")
        kind = from_metadata(schema[name].metadata)
        if kind is not None:
            column = _scalar_udf(_text_to_bytes(kind, name), "binary")(column).alias(name)
        out.append(column)
    return F.struct(*out)


def exact_json_decimals(body: Column, value: Column, declared: Mapping[str, str]) -> Column:
    """``body`` (``from_json`` of the declared schema) with the wide columns read exactly from the
    payload text instead: Spark's JSON reader would hand a fractional number over as a double."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    wide = wide_columns(declared)
    if not wide:
        return body
    struct = StructType([StructField(name, StringType(), True) for name in wide])
    exact = _scalar_udf(_json_wide_texts(wide), struct)(value)
    return F.struct(*[(exact[c] if c in wide else body[c]).alias(c) for c in declared])


def _json_wide_texts(wide: Mapping[str, ColumnType]) -> Callable[[pa.Array], pa.Array]:
    names = list(wide)

    def read(values: pa.Array) -> pa.Array:
        import decimal

        import pyarrow as pa

        rows: dict[str, list[str | None]] = {n: [] for n in names}
        for raw in values.to_pylist():
            try:
                parsed = json.loads(raw, parse_float=decimal.Decimal) if raw is not None else None
            except ValueError:
                parsed = None  # from_json (FAILFAST) reports the malformed record with its offset
            obj = parsed if isinstance(parsed, dict) else {}
            for n in names:
                rows[n].append(decimal_text(obj.get(n), wide[n], n))
        return pa.StructArray.from_arrays([pa.array(rows[n], type=pa.string()) for n in names], names=names)

    return read
