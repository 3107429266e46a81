"""Avro decimals beyond Spark's 38 digits: read exactly (the Kafka source's decode path) and
written back as Avro decimals (the Kafka sink's encode path), with ``from_avro``/``to_avro``."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from typing import Any

import fastavro
import pytest

from streamling.kafka.avro import (
    WideDecimalError,
    avro_row,
    readable_wide_decimals,
    record_schema,
    wide_decimal_columns,
)
from streamling.spec.types import METADATA_KEY, ColumnType

pytestmark = pytest.mark.spark

BIG = Decimal("-123456789012345678901234567890123456789012345678901234567890")
FRAC = Decimal("1234567890123456789012345678901234567890123456789012345678.0123456789")
U256 = Decimal(2**256 - 1)
FIXED = Decimal("9" * 76)


def _decimal(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


WRITER = {"type": "record", "name": "wide", "fields": [
    {"name": "id", "type": "long"},
    {"name": "big", "type": _decimal(60, 0)},
    {"name": "frac", "type": ["null", _decimal(68, 10)], "default": None},
    {"name": "u256", "type": _decimal(78, 0)},
    {"name": "fixed76", "type": {"type": "fixed", "name": "f32", "size": 32, "logicalType": "decimal",
                                 "precision": 76, "scale": 0}},
    {"name": "small", "type": _decimal(10, 2)},
]}
ROWS = [
    {"id": 1, "big": BIG, "frac": FRAC, "u256": U256, "fixed76": FIXED, "small": Decimal("12.34")},
    {"id": 2, "big": Decimal(0), "frac": None, "u256": Decimal(0), "fixed76": Decimal("-" + "9" * 76),
     "small": Decimal("-0.01")},
]


def _encode(schema: dict[str, Any], row: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), row)
    return out.getvalue()


def test_wide_avro_decimals_are_read_and_written_exactly(spark: Any) -> None:
    from pyspark.sql.avro.functions import from_avro, to_avro

    raw = spark.createDataFrame([(_encode(WRITER, r),) for r in ROWS], "value binary")
    # Spark alone refuses them rather than narrowing: the reason the reader schema changes.
    with pytest.raises(Exception, match="DECIMAL_PRECISION_EXCEEDS_MAX_PRECISION"):
        raw.select(from_avro("value", json.dumps(WRITER))).collect()

    reader, wide = readable_wide_decimals(WRITER)
    assert wide == {"big": ColumnType("decimal256", 60, 0), "frac": ColumnType("decimal256", 68, 10),
                    "u256": ColumnType("decimal", 78, 0), "fixed76": ColumnType("decimal256", 76, 0)}
    decoded = raw.select(from_avro("value", json.dumps(WRITER), {"avroSchema": json.dumps(reader),
                                                                 "mode": "FAILFAST"}).alias("v")).select("v.*")
    df = wide_decimal_columns(decoded, wide, from_bytes=True)
    assert [f"{f.name} {f.dataType.simpleString()}" for f in df.schema.fields] == [
        "id bigint", "big string", "frac string", "u256 string", "fixed76 string", "small decimal(10,2)"]
    assert df.schema["u256"].metadata == {METADATA_KEY: "decimal(78,0)"}
    got = sorted((r.asDict() for r in df.collect()), key=lambda r: r["id"])
    assert got == [
        {"id": 1, "big": str(BIG), "frac": str(FRAC), "u256": str(U256), "fixed76": str(FIXED),
         "small": Decimal("12.34")},
        {"id": 2, "big": "0", "frac": None, "u256": "0", "fixed76": "-" + "9" * 76, "small": Decimal("-0.01")}]

    # Through SQL (metadata survives a projection) and back out as Avro decimals of full precision.
    df.createOrReplaceTempView("wide_in")
    out = spark.sql("SELECT id, big, frac, u256, small FROM wide_in")
    schema = record_schema(out.schema, "wide_out")
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types["big"] == ["null", _decimal(60, 0)]
    assert types["frac"] == ["null", _decimal(68, 10)]
    assert types["u256"] == ["null", _decimal(78, 0)]
    assert types["small"] == ["null", _decimal(10, 2)]
    columns = out.columns
    encoded = out.select(to_avro(avro_row(out.schema, columns), json.dumps(schema)).alias("b")).collect()
    parsed = fastavro.parse_schema(schema)
    back = sorted((fastavro.schemaless_reader(io.BytesIO(r.b), parsed, parsed) for r in encoded),
                  key=lambda r: r["id"])
    assert back == [{"id": 1, "big": BIG, "frac": FRAC, "u256": U256, "small": Decimal("12.34")},
                    {"id": 2, "big": Decimal(0), "frac": None, "u256": Decimal(0), "small": Decimal("-0.01")}]


def test_text_that_would_lose_digits_is_refused_when_written(spark: Any) -> None:
    from pyspark.sql.avro.functions import to_avro
    from pyspark.sql.types import StringType, StructField, StructType

    struct = StructType([StructField("v", StringType(), True, {METADATA_KEY: "decimal256(40,2)"})])
    df = spark.createDataFrame([("1.234",)], struct)
    schema = record_schema(df.schema, "r")
    with pytest.raises(Exception, match=r"column 'v': 1.234 has more than 2 digits after the point"):
        df.select(to_avro(avro_row(df.schema, ["v"]), json.dumps(schema))).collect()


def test_a_nested_wide_decimal_is_refused_by_name() -> None:
    nested = {"type": "record", "name": "outer", "fields": [
        {"name": "inner", "type": {"type": "record", "name": "inner", "fields": [
            {"name": "amount", "type": ["null", _decimal(50, 0)]}]}}]}
    with pytest.raises(WideDecimalError) as caught:
        readable_wide_decimals(nested)
    assert str(caught.value) == ("field 'inner.amount' is an Avro decimal of precision 50, nested inside another "
                                 "type; decimals beyond 38 digits are read exactly only as top-level fields")
