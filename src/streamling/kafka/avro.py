"""Avro ↔ Spark schema helpers for the Kafka connectors."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def avro_type(dtype: DataType, name: str) -> Any:
    from pyspark.sql import types as T

    if isinstance(dtype, T.BooleanType):
        return "boolean"
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType)):
        return "int"
    if isinstance(dtype, T.LongType):
        return "long"
    if isinstance(dtype, T.FloatType):
        return "float"
    if isinstance(dtype, T.DoubleType):
        return "double"
    if isinstance(dtype, T.StringType):
        return "string"
    if isinstance(dtype, T.BinaryType):
        return "bytes"
    if isinstance(dtype, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dtype.precision, "scale": dtype.scale}
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
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
        avro = avro_type(field.dataType, f"{name}_{field.name}")
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
