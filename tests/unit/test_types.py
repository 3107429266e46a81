"""Streamling column type names: parsing, messages, and what each name means for Arrow, Spark,
Avro and Postgres. Spark types are built without a JVM (``pyspark.sql.types`` is plain Python)."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest
import sqlglot
from pydantic import ValidationError
from pyspark.sql import types as T

from streamling.spec.sources import KafkaSourceOptions
from streamling.spec.transforms import HandlerTransformOptions, ScriptTransformOptions
from streamling.spec.types import (
    METADATA_KEY,
    VALID_TEXT,
    ColumnType,
    TypeNameError,
    check_type_names,
    decimal_text,
    decimal_type,
    from_metadata,
    parse_type,
    spark_ddl,
    spark_schema,
    text_to_unscaled,
    unscaled_to_text,
    wide_columns,
    wide_fields,
    with_wide_metadata,
)
from streamling.spec.wide_sql import wide_decimal_problems

# name → (Spark type, DDL, Arrow type, Avro, Postgres)
SIMPLE = {
    "int8": (T.ByteType(), "TINYINT", pa.int8(), "int", "SMALLINT"),
    "int16": (T.ShortType(), "SMALLINT", pa.int16(), "int", "SMALLINT"),
    "int32": (T.IntegerType(), "INT", pa.int32(), "int", "INTEGER"),
    "int64": (T.LongType(), "BIGINT", pa.int64(), "long", "BIGINT"),
    "uint8": (T.ShortType(), "SMALLINT", pa.int16(), "int", "SMALLINT"),
    "uint16": (T.IntegerType(), "INT", pa.int32(), "int", "INTEGER"),
    "uint32": (T.LongType(), "BIGINT", pa.int64(), "long", "BIGINT"),
    "uint64": (T.DecimalType(20, 0), "DECIMAL(20,0)", pa.decimal128(20, 0),
               {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}, "NUMERIC(20,0)"),
    "float32": (T.FloatType(), "FLOAT", pa.float32(), "float", "REAL"),
    "float64": (T.DoubleType(), "DOUBLE", pa.float64(), "double", "DOUBLE PRECISION"),
    "string": (T.StringType(), "STRING", pa.string(), "string", "TEXT"),
    "boolean": (T.BooleanType(), "BOOLEAN", pa.bool_(), "boolean", "BOOLEAN"),
    "timestamp": (T.TimestampType(), "TIMESTAMP", pa.timestamp("us", tz="UTC"),
                  {"type": "long", "logicalType": "timestamp-micros"}, "TIMESTAMPTZ"),
}


@pytest.mark.parametrize("name", sorted(SIMPLE))
def test_every_simple_name_maps_the_same_way_everywhere(name: str) -> None:
    spark, ddl, arrow, avro, postgres = SIMPLE[name]
    kind = parse_type(f"  {name.upper()} ")
    assert kind.name == name and not kind.wide and kind.metadata() == {}
    assert kind.spark_type() == spark
    assert kind.spark_ddl() == ddl
    assert kind.arrow_type() == arrow
    assert kind.avro() == avro
    assert kind.postgres() == postgres


def test_bare_decimal_is_38_9_in_every_mapping() -> None:
    kind = parse_type("decimal")
    assert kind == ColumnType("decimal128", 38, 9) and kind.name == "decimal128(38,9)"
    assert kind.spark_type() == T.DecimalType(38, 9)
    assert kind.spark_ddl() == "DECIMAL(38,9)"
    assert kind.arrow_type() == pa.decimal128(38, 9)
    assert kind.avro() == {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 9}
    assert kind.postgres() == "NUMERIC(38,9)"
    assert spark_ddl({"d": "decimal"}) == "`d` DECIMAL(38,9)"


@pytest.mark.parametrize(("name", "precision", "scale"), [
    ("decimal128(1,0)", 1, 0), ("decimal128( 10 , 3 )", 10, 3), ("decimal128(38,38)", 38, 38),
    ("decimal256(1,1)", 1, 1), ("decimal256(38,2)", 38, 2)])
def test_decimals_within_sparks_38_digits_are_spark_decimals(name: str, precision: int, scale: int) -> None:
    kind = parse_type(name)
    assert (kind.precision, kind.scale, kind.wide) == (precision, scale, False)
    assert kind.spark_type() == T.DecimalType(precision, scale)
    assert kind.spark_ddl() == f"DECIMAL({precision},{scale})"
    assert kind.arrow_type() == pa.decimal128(precision, scale)
    assert kind.postgres() == f"NUMERIC({precision},{scale})"


@pytest.mark.parametrize(("name", "precision", "scale"), [
    ("decimal256(39,0)", 39, 0), ("decimal256(60,0)", 60, 0), ("decimal256(76,10)", 76, 10)])
def test_wide_decimals_are_exact_text_tagged_with_their_type(name: str, precision: int, scale: int) -> None:
    kind = parse_type(name)
    assert kind.wide and kind.name == name
    assert kind.metadata() == {METADATA_KEY: name}
    assert kind.spark_type() == T.StringType() and kind.spark_ddl() == "STRING"
    assert kind.spark_field("v") == T.StructField("v", T.StringType(), True, {METADATA_KEY: name})
    assert kind.arrow_type() == pa.string()
    assert kind.arrow_field("v").metadata == {METADATA_KEY.encode(): name.encode()}
    assert kind.avro() == {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    assert kind.postgres() == f"NUMERIC({precision},{scale})"


def test_decimals_beyond_76_digits_come_only_from_avro_and_stay_exact() -> None:
    u256 = decimal_type(78, 0)
    assert u256.wide and u256.name == "decimal(78,0)" and u256.postgres() == "NUMERIC(78,0)"
    assert decimal_type(38, 2) == ColumnType("decimal128", 38, 2)
    assert decimal_type(50, 2) == ColumnType("decimal256", 50, 2)
    assert decimal_type(1200, 0).postgres() == "NUMERIC"
    assert from_metadata({METADATA_KEY: "decimal(78,0)"}) == u256
    assert from_metadata({METADATA_KEY.encode(): b"decimal256(60,0)"}) == ColumnType("decimal256", 60, 0)
    assert from_metadata({}) is None and from_metadata(None) is None


VALID = ("int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, string, boolean, timestamp, "
         "decimal, decimal128(p,s), decimal256(p,s)")


@pytest.mark.parametrize(("name", "message"), [
    ("int", f"unknown type 'int' (did you mean 'int8', 'uint8', 'int64'?); valid types: {VALID}"),
    ("strng", f"unknown type 'strng' (did you mean 'string'?); valid types: {VALID}"),
    ("varchar", f"unknown type 'varchar'; valid types: {VALID}"),
    ("decimal(10,2)", "unknown type 'decimal(10,2)' (did you mean 'decimal256(10,2)', 'decimal128(10,2)'?); "
                      f"valid types: {VALID}"),
    ("decmal128(10,2)", "unknown type 'decmal128(10,2)' (did you mean 'decimal128(10,2)', 'decimal256(10,2)'?); "
                        f"valid types: {VALID}"),
    ("decimal128(10,40)", "type 'decimal128(10,40)': scale 40 is larger than precision 10; "
                          "write decimal128(p,s) with 0 <= s <= p"),
    ("decimal256(5,6)", "type 'decimal256(5,6)': scale 6 is larger than precision 5; "
                        "write decimal256(p,s) with 0 <= s <= p"),
    ("decimal128(39,0)", "type 'decimal128(39,0)': precision 39 is outside 1..38 for decimal128; "
                         "use decimal256(39,0) for up to 76 digits"),
    ("decimal128(0,0)", "type 'decimal128(0,0)': precision 0 is outside 1..38 for decimal128"),
    ("decimal256(77,0)", "type 'decimal256(77,0)': precision 77 is outside 1..76 for decimal256"),
    ("decimal256(0,0)", "type 'decimal256(0,0)': precision 0 is outside 1..76 for decimal256"),
    ("decimal128(10)", "type 'decimal128(10)' needs a precision and a scale: write decimal128(p,s), "
                       "e.g. decimal128(18,2)"),
    ("decimal256(a,b)", "type 'decimal256(a,b)' needs a precision and a scale: write decimal256(p,s), "
                        "e.g. decimal256(18,2)"),
])
def test_invalid_names_say_what_to_write(name: str, message: str) -> None:
    assert VALID_TEXT == VALID
    with pytest.raises(TypeNameError) as caught:
        parse_type(name)
    assert str(caught.value) == message


def test_column_maps_name_the_column_and_handler_overrides_may_drop() -> None:
    with pytest.raises(TypeNameError, match=r"^column 'amount': type 'decimal128\(10,40\)': scale 40"):
        check_type_names({"ok": "int64", "amount": "decimal128(10,40)"})
    check_type_names({"gone": None, "n": "uint64"}, allow_drop=True)
    with pytest.raises(TypeNameError, match=r"\(or null to drop the column\)$"):
        check_type_names({"n": "int"}, allow_drop=True)


@pytest.mark.parametrize("options", [
    lambda schema: ScriptTransformOptions.model_validate({"from": "a", "script": "x", "schema": schema}),
    lambda schema: KafkaSourceOptions.model_validate({"topic": "t", "data_format": "json", "schema": schema}),
    lambda schema: HandlerTransformOptions.model_validate({"from": "a", "url": "http://x",
                                                           "schema_override": schema}),
])
def test_node_validation_uses_the_same_rules(options: object) -> None:
    with pytest.raises(ValidationError, match=r"column 'a': type 'decimal128\(10,40\)': scale 40 is larger"):
        options({"a": "decimal128(10,40)"})  # type: ignore[operator]
    assert options({"a": "decimal", "b": "decimal256(60,0)"}) is not None  # type: ignore[operator]


def test_declared_schemas_as_spark_structs_and_ddl() -> None:
    columns = {"id": "int64", "big": "decimal256(60,0)", "u": "uint64", "weird`name": "string"}
    struct = spark_schema(columns)
    assert [f.dataType for f in struct.fields] == [T.LongType(), T.StringType(), T.DecimalType(20, 0), T.StringType()]
    assert struct["big"].metadata == {METADATA_KEY: "decimal256(60,0)"}
    assert spark_ddl(columns) == "`id` BIGINT, `big` STRING, `u` DECIMAL(20,0), `weird``name` STRING"
    assert wide_columns({**columns, "x": None, "bad": "nope"}) == {"big": ColumnType("decimal256", 60, 0)}
    assert wide_fields(struct) == {"big": ColumnType("decimal256", 60, 0)}
    arrow = with_wide_metadata(pa.schema([("id", pa.int64()), ("big", pa.string()), ("u", pa.decimal128(20, 0)),
                                          ("weird`name", pa.string())]), struct)
    assert from_metadata(arrow.field("big").metadata) == ColumnType("decimal256", 60, 0)
    assert arrow.field("id").metadata is None


SIXTY = "123456789012345678901234567890123456789012345678901234567890"


@pytest.mark.parametrize(("value", "text"), [
    (SIXTY, SIXTY), (int(SIXTY), SIXTY), (f"-{SIXTY}", f"-{SIXTY}"), (" 007 ", "7"), ("-0", "0"),
    (decimal.Decimal("1E+3"), "1000"), (12.0, "12"), (None, None)])
def test_decimal_text_is_canonical_and_exact(value: object, text: str | None) -> None:
    assert decimal_text(value, parse_type("decimal256(60,0)")) == text


def test_decimal_text_keeps_the_scale_and_refuses_what_would_narrow() -> None:
    kind = parse_type("decimal256(60,2)")
    assert decimal_text("1.5", kind) == "1.50"
    assert decimal_text(1.25, kind) == "1.25"
    with pytest.raises(ValueError, match=r"^column 'v': 1.234 has more than 2 digits after the point"):
        decimal_text("1.234", kind, "v")
    with pytest.raises(ValueError, match="more than 58 digits before the point for decimal256"):
        decimal_text("1" * 59, kind, "v")
    with pytest.raises(ValueError, match="send values of decimal256.* as decimal strings"):
        decimal_text(1.2345678901234567e40, kind, "v")
    for bad in ("abc", "NaN", True, "inf"):
        with pytest.raises(ValueError, match="column 'v'"):
            decimal_text(bad, kind, "v")


@pytest.mark.parametrize(("unscaled", "scale", "text"), [
    (0, 0, "0"), (-5, 3, "-0.005"), (12345, 2, "123.45"), (int(SIXTY), 0, SIXTY), (-(2**255), 0, str(-(2**255)))])
def test_unscaled_integers_round_trip_through_text(unscaled: int, scale: int, text: str) -> None:
    assert unscaled_to_text(unscaled, scale) == text
    assert text_to_unscaled(text, scale) == unscaled


WIDE = wide_columns({"id": "int64", "big": "decimal256(60,0)"})


@pytest.mark.parametrize("sql", [
    "SELECT id, big FROM a WHERE big = '5' OR big <> '6' OR big IN ('1', '2')",
    "SELECT big, count(*) FROM a GROUP BY big",
    "SELECT DISTINCT big FROM a WHERE id > 3 ORDER BY id",
    "SELECT CAST(big AS DECIMAL(38, 0)) + 1 AS n FROM a",
    "SELECT coalesce(big, '0') AS big FROM a"])
def test_exact_uses_of_wide_columns_pass(sql: str) -> None:
    assert wide_decimal_problems(sqlglot.parse_one(sql), WIDE) == []


@pytest.mark.parametrize(("sql", "what"), [
    ("SELECT * FROM a WHERE big > '5'", "an ordering comparison on it (`big > '5'`)"),
    ("SELECT * FROM a WHERE big BETWEEN '1' AND '2'", "an ordering comparison on it (`big BETWEEN '1' AND '2'`)"),
    ("SELECT big + 1 AS x FROM a", "arithmetic on it (`big + 1`)"),
    ("SELECT -big AS x FROM a", "arithmetic on it (`-big`)"),
    ("SELECT sum(big) FROM a", "SUM() on it (`SUM(big)`)"),
    ("SELECT * FROM a ORDER BY big", "ORDER BY on it (`big`)"),
    ("SELECT * FROM a WHERE 5 = big", "comparing it with a number, which Spark does in floating point, (`5 = big`)"),
    ("SELECT * FROM a WHERE big IN (1, 2)",
     "comparing it with a number, which Spark does in floating point, (`big IN (1, 2)`)"),
    ("SELECT CAST(big AS DOUBLE) AS d FROM a", "casting it to a floating-point type (`CAST(big AS DOUBLE)`)")])
def test_inexact_uses_of_wide_columns_are_rejected_by_name(sql: str, what: str) -> None:
    problems = wide_decimal_problems(sqlglot.parse_one(sql), WIDE)
    assert problems == [
        "column 'big' is decimal256(60,0), wider than Spark's 38-digit decimals, and is carried as exact decimal "
        f"text: {what} would not be exact; only =, <>, IN (with string literals), GROUP BY and DISTINCT are. "
        "Compute it in the sink's database, or CAST it to DECIMAL(p,s) with p <= 38 where the values fit (a value "
        "that does not fit fails the epoch)"]
