"""Streamling column type names: the one place they are parsed, validated and mapped.

A declared ``schema`` (script, wasm, Kafka JSON source) or ``schema_override`` (handler) names
column types the Streamling way (``int8``, ``uint64``, ``decimal128(p,s)``, ``decimal256(p,s)``,
bare ``decimal`` = (38,9), …). Every node asks this module what such a name means for Arrow,
Spark, Avro and Postgres, so the nodes cannot disagree.

Wide decimals: Spark's ``DecimalType`` stops at 38 digits. A decimal with more digits (a
``decimal256(p,s)`` with p > 38, an Avro decimal with precision > 38, Streamling's U256/I256) is
carried *exactly* as canonical decimal text in a string column whose field metadata records the
type (``{"streamling.type": "decimal256(60,0)"}``). Sinks read that metadata back: Postgres gets
``NUMERIC(p,s)``, Avro gets ``bytes`` with the ``decimal`` logical type. Nothing narrows it.

SQL on wide columns: the values are text, so only equality (``=``, ``<>``, ``IN``, ``GROUP BY``,
``DISTINCT``) is exact, because the text is canonical (exactly ``scale`` digits after the point,
no leading zeros, no ``+``, no ``-0``). Ordering and arithmetic on text would be lexicographic or
go through ``double``: ``spec/wide_sql.py`` finds such uses for the SQL validator, which learns
which columns are wide from ``wide_columns`` (a declared schema) or ``wide_fields`` (a Spark schema).

Importable without pyspark or a JVM: Spark and pyarrow are imported inside the methods using them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Context, Decimal, Inexact, InvalidOperation
from typing import TYPE_CHECKING, Any

from streamling.util import did_you_mean

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructField, StructType

#: field metadata key recording the Streamling type of a wide decimal column.
METADATA_KEY = "streamling.type"
DECIMAL128_MAX_PRECISION = 38
DECIMAL256_MAX_PRECISION = 76
#: digits of the largest 256-bit unsigned integer (2**256 - 1): Streamling's ``u256``
U256_PRECISION = 78
SPARK_MAX_PRECISION = 38
POSTGRES_MAX_PRECISION = 1000
#: what bare ``decimal`` means (Streamling's default).
BARE_DECIMAL = (38, 9)

_INTEGERS = ("int8", "int16", "int32", "int64")
_UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
_OTHERS = ("float32", "float64", "string", "boolean", "timestamp")
SIMPLE_NAMES: tuple[str, ...] = (*_INTEGERS, *_UNSIGNED, *_OTHERS)
#: every accepted name, as written in error messages.
VALID_NAMES = (*SIMPLE_NAMES, "decimal", "decimal128(p,s)", "decimal256(p,s)")
VALID_TEXT = ", ".join(VALID_NAMES)
_MAX_PRECISION = {"decimal128": DECIMAL128_MAX_PRECISION, "decimal256": DECIMAL256_MAX_PRECISION}
_WITH_ARGS = re.compile(r"^([a-z0-9_]+)\s*\((.*)\)$")
_ARGS = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*$")
_META_NAME = re.compile(r"^(decimal128|decimal256|decimal)\((\d+),(\d+)\)$")
# Significant digits every binary64 float keeps exactly through its shortest repr.
_FLOAT_EXACT_DIGITS = 15
# The signed type an unsigned one widens to, so every value fits.
_WIDENED = {"uint8": "int16", "uint16": "int32", "uint32": "int64"}


class TypeNameError(ValueError):
    """A column type name that is not a valid Streamling type; the message says what to write."""


@dataclass(frozen=True)
class ColumnType:
    """One Streamling column type. ``kind`` is a simple name, ``decimal128``, ``decimal256`` or
    ``decimal`` (arbitrary precision: only from Avro decimals beyond 76 digits, e.g. U256)."""

    kind: str
    precision: int = 0
    scale: int = 0

    @property
    def name(self) -> str:
        """The canonical Streamling name (bare ``decimal`` is spelled out as decimal128(38,9))."""
        if self.is_decimal:
            return f"{self.kind}({self.precision},{self.scale})"
        return self.kind

    @property
    def is_decimal(self) -> bool:
        return self.kind in ("decimal128", "decimal256", "decimal")

    @property
    def wide(self) -> bool:
        """More digits than Spark's DecimalType holds: carried as exact decimal text."""
        return self.is_decimal and self.precision > SPARK_MAX_PRECISION

    def _storage(self) -> ColumnType:
        """The signed type an unsigned one is stored as (uint64 → decimal128(20,0))."""
        if self.kind == "uint64":
            return ColumnType("decimal128", 20, 0)
        widened = _WIDENED.get(self.kind)
        return ColumnType(widened) if widened else self

    def metadata(self) -> dict[str, str]:
        """Field metadata that marks a wide column (empty for every other type)."""
        return {METADATA_KEY: self.name} if self.wide else {}

    def spark_type(self) -> DataType:
        from pyspark.sql import types as T

        base = self._storage()
        if base.wide:
            return T.StringType()
        if base.is_decimal:
            return T.DecimalType(base.precision, base.scale)
        simple: dict[str, DataType] = {
            "int8": T.ByteType(), "int16": T.ShortType(), "int32": T.IntegerType(), "int64": T.LongType(),
            "float32": T.FloatType(), "float64": T.DoubleType(), "string": T.StringType(),
            "boolean": T.BooleanType(), "timestamp": T.TimestampType()}
        return simple[base.kind]

    def spark_field(self, column: str) -> StructField:
        """A nullable Spark field of this type, wide columns tagged with their metadata."""
        from pyspark.sql.types import StructField

        return StructField(column, self.spark_type(), True, self.metadata() or None)

    def spark_ddl(self) -> str:
        """The Spark SQL DDL type (``from_json`` schemas, casts)."""
        base = self._storage()
        if base.wide:
            return "STRING"
        if base.is_decimal:
            return f"DECIMAL({base.precision},{base.scale})"
        return {"int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float32": "FLOAT",
                "float64": "DOUBLE", "string": "STRING", "boolean": "BOOLEAN", "timestamp": "TIMESTAMP"}[base.kind]

    def arrow_type(self) -> pa.DataType:
        """The Arrow type batches carry (what Spark's Arrow conversion uses for ``spark_type``)."""
        import pyarrow as pa

        base = self._storage()
        if base.wide:
            return pa.string()
        if base.is_decimal:
            return pa.decimal128(base.precision, base.scale)
        simple: dict[str, pa.DataType] = {
            "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
            "float32": pa.float32(), "float64": pa.float64(), "string": pa.string(), "boolean": pa.bool_(),
            "timestamp": pa.timestamp("us", tz="UTC")}
        return simple[base.kind]

    def arrow_field(self, column: str) -> pa.Field:
        import pyarrow as pa

        return pa.field(column, self.arrow_type(), True, self.metadata() or None)

    def avro(self) -> Any:
        """The Avro schema fragment (without the ``["null", …]`` union a nullable column adds)."""
        base = self._storage()
        if base.is_decimal:
            return {"type": "bytes", "logicalType": "decimal", "precision": base.precision, "scale": base.scale}
        return {"int8": "int", "int16": "int", "int32": "int", "int64": "long", "float32": "float",
                "float64": "double", "string": "string", "boolean": "boolean",
                "timestamp": {"type": "long", "logicalType": "timestamp-micros"}}[base.kind]

    def clickhouse(self) -> str:
        """The ClickHouse column type (without ``Nullable``); unsigned types keep their width.

        Decimals up to 76 digits are ``Decimal(p, s)``; 77–78 digits with scale 0 are Streamling's
        256-bit integers (``u256``) and become ``UInt256``, as Streamling creates them, so sorting and
        sums work in ClickHouse; wider ones, or with a scale, have no exact ClickHouse type: text."""
        if self.is_decimal:
            if self.precision <= DECIMAL256_MAX_PRECISION:
                return f"Decimal({self.precision}, {self.scale})"
            return "UInt256" if self.scale == 0 and self.precision <= U256_PRECISION else "String"
        return {"int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64", "uint8": "UInt8",
                "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64", "float32": "Float32",
                "float64": "Float64", "string": "String", "boolean": "Bool",
                "timestamp": "DateTime64(6, 'UTC')"}[self.kind]

    def postgres(self) -> str:
        """The Postgres column type; wide decimals keep their precision as NUMERIC(p,s)."""
        base = self._storage()
        if base.is_decimal:
            if base.precision > POSTGRES_MAX_PRECISION:
                return "NUMERIC"
            return f"NUMERIC({base.precision},{base.scale})"
        return {"int8": "SMALLINT", "int16": "SMALLINT", "int32": "INTEGER", "int64": "BIGINT", "float32": "REAL",
                "float64": "DOUBLE PRECISION", "string": "TEXT", "boolean": "BOOLEAN",
                "timestamp": "TIMESTAMPTZ"}[base.kind]


def parse_type(text: str) -> ColumnType:
    """A Streamling type name as a ``ColumnType``; ``TypeNameError`` says what to write instead."""
    name = str(text).strip().lower()
    if name in SIMPLE_NAMES:
        return ColumnType(name)
    if name == "decimal":
        return ColumnType("decimal128", *BARE_DECIMAL)
    match = _WITH_ARGS.match(name)
    if match is None:
        raise TypeNameError(f"unknown type {text!r}{did_you_mean(name, list(VALID_NAMES))}; "
                            f"valid types: {VALID_TEXT}")
    base, args = match.group(1), match.group(2)
    if base not in _MAX_PRECISION:
        suggestion = did_you_mean(base, ["decimal128", "decimal256"], fmt="'{}(" + args.strip() + ")'")
        raise TypeNameError(f"unknown type {text!r}{suggestion}; valid types: {VALID_TEXT}")
    numbers = _ARGS.match(args)
    if numbers is None:
        raise TypeNameError(f"type {text!r} needs a precision and a scale: write {base}(p,s), e.g. {base}(18,2)")
    precision, scale = int(numbers.group(1)), int(numbers.group(2))
    limit = _MAX_PRECISION[base]
    if not 1 <= precision <= limit:
        wider = (f"; use decimal256({precision},{scale}) for up to {DECIMAL256_MAX_PRECISION} digits"
                 if base == "decimal128" and DECIMAL128_MAX_PRECISION < precision <= DECIMAL256_MAX_PRECISION else "")
        raise TypeNameError(f"type {text!r}: precision {precision} is outside 1..{limit} for {base}{wider}")
    if scale > precision:
        raise TypeNameError(f"type {text!r}: scale {scale} is larger than precision {precision}; "
                            f"write {base}(p,s) with 0 <= s <= p")
    return ColumnType(base, precision, scale)


def check_type_names(columns: Mapping[str, str | None] | None, *, allow_drop: bool = False) -> None:
    """Validate a column → type-name map; the error names the column (``None`` drops it when allowed)."""
    for column, text in (columns or {}).items():
        if text is None:
            if allow_drop:
                continue
            raise TypeNameError(f"column '{column}': a type is required; valid types: {VALID_TEXT}")
        try:
            parse_type(text)
        except TypeNameError as exc:
            drop = " (or null to drop the column)" if allow_drop else ""
            raise TypeNameError(f"column '{column}': {exc}{drop}") from None


def decimal_type(precision: int, scale: int) -> ColumnType:
    """The type for a decimal of any precision (an Avro decimal, a U256): the narrowest kind."""
    if precision < 1 or not 0 <= scale <= precision:
        raise TypeNameError(f"decimal precision {precision} and scale {scale} are invalid; need 0 <= scale <= "
                            "precision and precision >= 1")
    if precision <= DECIMAL128_MAX_PRECISION:
        return ColumnType("decimal128", precision, scale)
    if precision <= DECIMAL256_MAX_PRECISION:
        return ColumnType("decimal256", precision, scale)
    return ColumnType("decimal", precision, scale)


def from_metadata(metadata: Mapping[str, Any] | None) -> ColumnType | None:
    """The wide type recorded in a field's metadata (Spark dict or Arrow bytes), or None."""
    if not metadata:
        return None
    raw = metadata.get(METADATA_KEY, metadata.get(METADATA_KEY.encode()))  # type: ignore[call-overload]
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    match = _META_NAME.match(text.replace(" ", ""))
    if match is None:
        return None
    return ColumnType(match.group(1), int(match.group(2)), int(match.group(3)))


def from_spark(data_type: DataType, metadata: Mapping[str, Any] | None = None) -> ColumnType | None:
    """The Streamling type a Spark column holds (a wide decimal when ``metadata`` says so), or None
    for types Streamling names do not cover (dates, binary, nested): sinks map those themselves."""
    from pyspark.sql import types as T

    wide = from_metadata(metadata)
    if wide is not None and isinstance(data_type, T.StringType):
        return wide
    if isinstance(data_type, T.DecimalType):
        return ColumnType("decimal128", data_type.precision, data_type.scale)
    for spark_class, name in ((T.ByteType, "int8"), (T.ShortType, "int16"), (T.IntegerType, "int32"),
                              (T.LongType, "int64"), (T.FloatType, "float32"), (T.DoubleType, "float64"),
                              (T.StringType, "string"), (T.BooleanType, "boolean"), (T.TimestampType, "timestamp")):
        if isinstance(data_type, spark_class):
            return ColumnType(name)
    return None


def field_type(field: StructField) -> ColumnType | None:
    """The Streamling type of a Spark field (see ``from_spark``)."""
    return from_spark(field.dataType, field.metadata)


def spark_schema(columns: Mapping[str, str]) -> StructType:
    """A declared ``schema`` (column → type name) as a Spark struct, every column nullable."""
    from pyspark.sql.types import StructType

    return StructType([parse_type(text).spark_field(column) for column, text in columns.items()])


def spark_ddl(columns: Mapping[str, str]) -> str:
    """A declared ``schema`` as Spark DDL (``from_json``), names back-quoted."""
    return ", ".join(f"`{c.replace('`', '``')}` {parse_type(t).spark_ddl()}" for c, t in columns.items())


def with_wide_metadata(arrow: pa.Schema, spark: StructType) -> pa.Schema:
    """``arrow`` (Spark's Arrow conversion of ``spark``, which drops field metadata) with the wide
    columns' metadata put back, so Arrow batch functions know which text columns are decimals."""
    import pyarrow as pa

    wide = wide_fields(spark)
    if not wide:
        return arrow
    return pa.schema([f.with_metadata(wide[f.name].metadata()) if f.name in wide else f for f in arrow],
                     metadata=arrow.metadata)


def wide_columns(columns: Mapping[str, str | None] | None) -> dict[str, ColumnType]:
    """The wide decimal columns of a declared schema: for the SQL validator (no Spark needed)."""
    out: dict[str, ColumnType] = {}
    for column, text in (columns or {}).items():
        if text is None:
            continue
        try:
            kind = parse_type(text)
        except TypeNameError:
            continue
        if kind.wide:
            out[column] = kind
    return out


def wide_fields(schema: StructType) -> dict[str, ColumnType]:
    """The wide decimal columns of a Spark schema, read from field metadata."""
    return {f.name: t for f in schema.fields if (t := from_metadata(f.metadata)) is not None}


# --- exact decimal text ---------------------------------------------------------------------------

def decimal_text(value: Any, kind: ColumnType, column: str = "") -> str | None:
    """``value`` as canonical text for a decimal column: exactly ``scale`` digits after the point.

    Rejects (``ValueError``) what would need rounding or more digits than ``precision``, so a value
    is either stored exactly or refused. Floats go through their shortest repr (JSON's text).
    """
    if value is None:
        return None
    where = f"column '{column}': " if column else ""
    if isinstance(value, bool):
        raise ValueError(f"{where}{value!r} is not a number for {kind.name}")
    try:
        number = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{where}{value!r} is not a decimal number for {kind.name}") from None
    if isinstance(value, float) and len(number.as_tuple().digits) > _FLOAT_EXACT_DIGITS:
        raise ValueError(f"{where}{value!r} arrived as a binary floating-point number, which may already have "
                         f"lost digits; send values of {kind.name} as decimal strings")
    if not number.is_finite():
        raise ValueError(f"{where}{value!r} is not a finite number for {kind.name}")
    context = Context(prec=max(kind.precision, number.adjusted() + 1, 1) + kind.scale + 2, traps=[Inexact])
    try:
        exact = number.quantize(Decimal(1).scaleb(-kind.scale), context=context)
    except Inexact:
        raise ValueError(f"{where}{value} has more than {kind.scale} digits after the point for {kind.name}"
                         ) from None
    if exact.is_zero():
        exact = abs(exact)
    elif exact.adjusted() + 1 > kind.precision - kind.scale:
        raise ValueError(f"{where}{value} has more than {kind.precision - kind.scale} digits before the point "
                         f"for {kind.name}")
    return format(exact, "f")


def decimal_texts(values: Iterable[Any], kind: ColumnType, column: str = "") -> pa.Array:
    """A string array of canonical decimal text (see ``decimal_text``)."""
    import pyarrow as pa

    return pa.array([decimal_text(v, kind, column) for v in values], type=pa.string())


def unscaled_to_text(unscaled: int, scale: int) -> str:
    """Canonical text of ``unscaled × 10^-scale`` (Avro decimals carry the unscaled integer)."""
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    if scale == 0:
        return sign + digits
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def text_to_unscaled(text: str, scale: int) -> int:
    """The unscaled integer of canonical decimal text with ``scale`` digits after the point."""
    whole, _, fraction = text.partition(".")
    return int(whole + fraction.ljust(scale, "0")[:scale]) if scale else int(whole)


# --- ClickHouse columns read into Spark ----------------------------------------------------------

_CH_WRAPPERS = re.compile(r"^(Nullable|LowCardinality)\((.*)\)$")
_CH_DECIMAL = re.compile(r"^Decimal(32|64|128|256)?\((\d+)(?:,\s*(\d+))?\)$")
_CH_DECIMAL_PRECISION = {"32": 9, "64": 18, "128": 38, "256": 76}
_CH_SIMPLE = {"Int8": "int8", "Int16": "int16", "Int32": "int32", "Int64": "int64", "UInt8": "uint8",
              "UInt16": "uint16", "UInt32": "uint32", "UInt64": "uint64", "Float32": "float32",
              "Float64": "float64", "String": "string", "Bool": "boolean"}
_CH_WIDE_INTS = {"Int128": 39, "UInt128": 39, "Int256": 77, "UInt256": 78}


@dataclass(frozen=True)
class ClickHouseColumn:
    """How a ClickHouse column is read: the SQL that makes ClickHouse's Arrow output match the Spark
    field (``{}`` is the quoted column), the Spark type and the field metadata of wide decimals."""

    template: str
    spark: DataType
    metadata: dict[str, str]
    numeric: bool

    def expression(self, column: str) -> str:
        return self.template.format(column)


def from_clickhouse(type_name: str) -> ClickHouseColumn:
    """The Spark reading of a ClickHouse type name as ``DESCRIBE TABLE`` prints it.

    Integers, floats, decimals up to 38 digits, Bool and String keep their type (unsigned integers
    widen like Streamling's ``uint*``); wider integers and decimals become exact decimal text tagged
    as wide; Date/Date32 read as dates, DateTime/DateTime64 as UTC timestamps (microseconds);
    FixedString, Enum, UUID and IP addresses as their text; arrays, maps, tuples and JSON as JSON
    text."""
    from pyspark.sql import types as T

    name = type_name.strip()
    while (match := _CH_WRAPPERS.match(name)) is not None:
        name = match.group(2).strip()
    simple = _CH_SIMPLE.get(name)
    if simple is not None:
        kind = ColumnType(simple)
        storage = kind._storage()
        template = "{}"
        if simple.startswith("uint"):
            template = ("toDecimal128({}, 0)" if simple == "uint64"
                        else f"to{storage.kind.replace('int', 'Int')}({{}})")
        return ClickHouseColumn(template, kind.spark_type(), {}, simple not in ("string", "boolean"))
    if name in _CH_WIDE_INTS:
        kind = ColumnType("decimal256" if _CH_WIDE_INTS[name] <= DECIMAL256_MAX_PRECISION else "decimal",
                          _CH_WIDE_INTS[name], 0)
        return ClickHouseColumn("toString({})", T.StringType(), kind.metadata(), True)
    decimal = _CH_DECIMAL.match(name)
    if decimal is not None:
        bits, first, second = decimal.groups()
        precision, scale = (int(first), int(second or 0)) if bits is None else \
            (_CH_DECIMAL_PRECISION[bits], int(first))
        kind = ColumnType("decimal128" if precision <= DECIMAL128_MAX_PRECISION else "decimal256", precision, scale)
        if kind.wide:
            return ClickHouseColumn(f"toDecimalString({{}}, {scale})", T.StringType(), kind.metadata(), True)
        return ClickHouseColumn("{}", kind.spark_type(), {}, True)
    if name in ("Date", "Date32"):
        return ClickHouseColumn("toDate32({})", T.DateType(), {}, True)
    if name.startswith("DateTime"):
        return ClickHouseColumn("toDateTime64({}, 6, 'UTC')", T.TimestampType(), {}, True)
    if name.startswith(("FixedString", "Enum", "UUID", "IPv4", "IPv6")):
        return ClickHouseColumn("toString({})", T.StringType(), {}, False)
    return ClickHouseColumn("toJSONString({})", T.StringType(), {}, False)


def spark_schema_from_arrow(schema: pa.Schema) -> StructType:
    """The Spark schema of Arrow batches a plugin declares: timestamps with a zone are Spark
    timestamps, without one ``timestamp_ntz``; unsigned integers widen to the next signed type."""
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        return from_arrow_schema(schema, prefer_timestamp_ntz=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the Arrow schema {schema} has a type Spark cannot hold: {exc}") from exc


def arrow_for_spark(table: pa.Table, schema: StructType) -> pa.Table:
    """``table`` cast to the Arrow types Spark expects for ``schema`` (same column order)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    columns = [table.column(i).cast(field.type) if table.column(i).type != field.type else table.column(i)
               for i, field in enumerate(target)]
    return pa.Table.from_arrays(columns, schema=target)


def clickhouse_type(data_type: DataType, metadata: Mapping[str, Any] | None = None) -> str:
    """The ClickHouse type a Spark column is stored as (without ``Nullable``): its Streamling type's,
    dates as ``Date32``, binary as ``String``, nested values as JSON text in ``String``."""
    from pyspark.sql import types as T

    kind = from_spark(data_type, metadata)
    if kind is not None:
        return kind.clickhouse()
    if isinstance(data_type, T.DateType):
        return "Date32"
    if isinstance(data_type, T.TimestampNTZType):
        return "DateTime64(6)"
    return "String"
