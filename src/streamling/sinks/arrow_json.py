"""Arrow rows as JSON text, encoded the way arrow-json's writer encodes them.

Streamling's ``print`` sink logs each row through arrow-json (``WriterBuilder`` with explicit nulls),
so the JSON it prints follows arrow-json's encoders, not a general-purpose JSON library. Encoding from
``to_pylist`` with ``json.dumps`` differs in ways a reader notices: float32 values print widened to
float64 (``0.10000000149011612``), NaN and infinities print as the invalid ``NaN``/``Infinity``,
decimals and maps change shape. This module encodes each column from its Arrow type instead:

- integers and booleans as JSON numbers and ``true``/``false``;
- float64 and float32 (float16 through float32) as the shortest decimal that reads back to the same
  value *of that width*, laid out as lexical-core writes it by default: positional between 1e-5 and
  1e10 (``1000000000.0``, ``0.00001``), scientific outside it with a bare exponent (``1.0e21``,
  ``1.5e-7``), always with a fraction (``1.0``); NaN and ±infinity as ``null``;
- decimals unquoted, with exactly ``scale`` fraction digits (``12.34``, ``-0.50``);
- timestamps, dates and times quoted, as arrow-cast displays them: ``2024-01-01T00:00:00.123`` (the
  fraction has 0, 3, 6 or 9 digits, whichever is shortest and exact), with a time zone converted to
  it and suffixed ``Z`` for a zero offset, ``+05:30`` otherwise;
- binary as a quoted lower-case hex string;
- lists as arrays, structs as objects (null fields written as ``null``), maps as objects keyed by the
  map's keys, dictionary-encoded values as their values;
- strings escaped as serde_json does (which is what ``json.dumps(..., ensure_ascii=False)`` writes).

Durations and intervals are written as before (their quoted Python text): arrow-json's layout for them
depends on chrono's version and is not followed here.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

_EPOCH = dt.datetime(1970, 1, 1)
_UNITS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
_OFFSET = re.compile(r"^([+-])(\d{2}):?(\d{2})?$")
# lexical-core's default exponent breaks: scientific notation below 1e-5 and from 1e10 up.
_MIN_POSITIONAL_EXP, _MAX_POSITIONAL_EXP = -5, 9


def encode_rows(data: pa.RecordBatch | pa.Table) -> list[str]:
    """One JSON object per row, keys in column order, null columns written as ``null``."""
    columns = [_column(data.column(i)) for i in range(data.num_columns)]
    keys = [json.dumps(name, ensure_ascii=False) + ":" for name in data.schema.names]
    return ["{" + ",".join(key + column[row] for key, column in zip(keys, columns, strict=True)) + "}"
            for row in range(data.num_rows)]


def encode_float(value: float, *, single: bool = False) -> str:
    """``value`` as arrow-json writes a float64 (``single``: a float32) value."""
    if value != value or value in (float("inf"), float("-inf")):
        return "null"
    if single:
        import numpy as np

        return _lexical(str(np.float32(value)))
    return _lexical(repr(value))


def _lexical(shortest: str) -> str:
    """Lay out a shortest round-trip decimal (Python's or numpy's text of it) as lexical-core does."""
    sign = ""
    if shortest.startswith("-"):
        sign, shortest = "-", shortest[1:]
    mantissa, _, exp = shortest.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return sign + "0.0"
    sci_exp = len(digits) - 1 + (int(exp) if exp else 0) - len(fraction)
    digits = digits.rstrip("0")
    if sci_exp < _MIN_POSITIONAL_EXP or sci_exp > _MAX_POSITIONAL_EXP:
        return f"{sign}{digits[0]}.{digits[1:] or '0'}e{sci_exp}"
    if sci_exp < 0:
        return f"{sign}0.{'0' * (-sci_exp - 1)}{digits}"
    if len(digits) <= sci_exp + 1:
        return f"{sign}{digits}{'0' * (sci_exp + 1 - len(digits))}.0"
    return f"{sign}{digits[:sci_exp + 1]}.{digits[sci_exp + 1:]}"


def format_decimal(unscaled: int, precision: int, scale: int) -> str:
    """arrow's ``format_decimal_str``: the unscaled integer with the point ``scale`` digits from the
    right (zero-padded), or ``-scale`` zeros appended for a negative scale."""
    text = str(unscaled)
    sign, rest = ("-", text[1:]) if text.startswith("-") else ("", text)
    text = text[:min(precision, len(rest)) + len(sign)]
    if scale == 0:
        return text
    if scale < 0:
        return text + "0" * -scale
    if len(rest) > scale:
        return f"{text[:-scale]}.{text[-scale:]}"
    return f"{sign}0.{rest.rjust(scale, '0')}"


def _fraction(nanos: int) -> str:
    """chrono's automatic sub-second digits: none, or 3, 6 or 9, the fewest that are exact."""
    if nanos == 0:
        return ""
    if nanos % 1_000_000 == 0:
        return f".{nanos // 1_000_000:03d}"
    if nanos % 1_000 == 0:
        return f".{nanos // 1_000:06d}"
    return f".{nanos:09d}"


def _naive(value: dt.datetime, nanos: int) -> str:
    return f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value:%H:%M:%S}{_fraction(nanos)}"


def _tzinfo(name: str) -> dt.tzinfo:
    if name.upper() in ("UTC", "Z"):
        return dt.UTC
    fixed = _OFFSET.match(name)
    if fixed:
        sign, hours, minutes = fixed.groups()
        offset = dt.timedelta(hours=int(hours), minutes=int(minutes or 0))
        return dt.timezone(-offset if sign == "-" else offset)
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def _timestamp_encoder(unit: str, tz: str | None) -> Callable[[int], str]:
    per_second = _UNITS_PER_SECOND[unit]
    zone = _tzinfo(tz) if tz else None

    def encode(value: int) -> str:
        seconds, sub = divmod(value, per_second)
        nanos = sub * (1_000_000_000 // per_second)
        naive = _EPOCH + dt.timedelta(seconds=seconds)
        if zone is None:
            return f'"{_naive(naive, nanos)}"'
        local = naive.replace(tzinfo=dt.UTC).astimezone(zone)
        offset = local.utcoffset() or dt.timedelta(0)
        if not offset:
            suffix = "Z"
        else:
            minutes = int(abs(offset).total_seconds()) // 60
            suffix = f"{'-' if offset < dt.timedelta(0) else '+'}{minutes // 60:02d}:{minutes % 60:02d}"
        return f'"{_naive(local, nanos)}{suffix}"'

    return encode


def _time_encoder(unit: str) -> Callable[[int], str]:
    per_second = _UNITS_PER_SECOND[unit]

    def encode(value: int) -> str:
        seconds, sub = divmod(value, per_second)
        minutes, second = divmod(seconds, 60)
        hour, minute = divmod(minutes, 60)
        return f'"{hour:02d}:{minute:02d}:{second:02d}{_fraction(sub * (1_000_000_000 // per_second))}"'

    return encode


def _raw_ints(array: pa.Array) -> list[int | None]:
    import pyarrow as pa

    width = pa.int64() if array.type.bit_width == 64 else pa.int32()
    return array.view(width).to_pylist()  # type: ignore[no-any-return]


def _python_text(value: Any) -> str:
    return json.dumps(str(value), ensure_ascii=False)


def _column(array: pa.Array | pa.ChunkedArray) -> list[str]:
    """Each value of ``array`` as JSON text, ``null`` for a null."""
    import pyarrow as pa
    import pyarrow.types as t

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        return _column(array.storage)
    if t.is_dictionary(kind):
        return _column(array.dictionary_decode())
    if t.is_null(kind):
        return ["null"] * len(array)
    if t.is_struct(kind):
        return _struct(array)
    if t.is_map(kind):
        return _map(array)
    if t.is_list(kind) or t.is_large_list(kind):
        offsets = array.offsets.to_pylist()
        return _nested_lists(array, array.values, offsets)
    if t.is_fixed_size_list(kind):
        size = kind.list_size
        flat = array.values.slice(array.offset * size, len(array) * size)
        return _nested_lists(array, flat, list(range(0, (len(array) + 1) * size, size)))
    encode: Callable[[Any], str]
    values: Sequence[Any] = array.to_pylist()
    if t.is_boolean(kind):
        encode = _boolean
    elif t.is_integer(kind):
        encode = str
    elif t.is_float64(kind):
        encode = encode_float
    elif t.is_floating(kind):
        encode = _single
    elif t.is_decimal(kind):
        encode = _decimal_encoder(kind.precision, kind.scale)
    elif t.is_string(kind) or t.is_large_string(kind) or t.is_string_view(kind):
        encode = _string
    elif t.is_binary(kind) or t.is_large_binary(kind) or t.is_fixed_size_binary(kind) or t.is_binary_view(kind):
        encode = _hex
    elif t.is_timestamp(kind):
        values, encode = _raw_ints(array), _timestamp_encoder(kind.unit, kind.tz)
    elif t.is_date32(kind):
        values, encode = _raw_ints(array), _date32
    elif t.is_date64(kind):
        values, encode = _raw_ints(array), _timestamp_encoder("ms", None)
    elif t.is_time(kind):
        values, encode = _raw_ints(array), _time_encoder(kind.unit)
    else:
        encode = _python_text
    return ["null" if value is None else encode(value) for value in values]


def _boolean(value: bool) -> str:
    return "true" if value else "false"


def _single(value: float) -> str:
    return encode_float(value, single=True)


def _string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _hex(value: bytes) -> str:
    return f'"{value.hex()}"'


def _date32(days: int) -> str:
    day = _EPOCH.date() + dt.timedelta(days=days)
    return f'"{day.year:04d}-{day.month:02d}-{day.day:02d}"'


def _decimal_encoder(precision: int, scale: int) -> Callable[[decimal.Decimal], str]:
    def encode(value: decimal.Decimal) -> str:
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0")
        shift = int(exponent) + scale
        unscaled = unscaled * 10**shift if shift >= 0 else unscaled // 10**-shift
        return format_decimal(-unscaled if sign else unscaled, precision, scale)

    return encode


def _nested_lists(array: pa.Array, values: pa.Array, offsets: list[int]) -> list[str]:
    start = offsets[0]
    items = _column(values.slice(start, offsets[-1] - start))
    valid = array.is_valid().to_pylist()
    return ["[" + ",".join(items[offsets[i] - start:offsets[i + 1] - start]) + "]" if valid[i] else "null"
            for i in range(len(array))]


def _struct(array: pa.StructArray) -> list[str]:
    fields = [array.type.field(i) for i in range(array.type.num_fields)]
    keys = [json.dumps(field.name, ensure_ascii=False) + ":" for field in fields]
    children = [_column(child) for child in array.flatten()]
    valid = array.is_valid().to_pylist()
    return ["{" + ",".join(key + child[i] for key, child in zip(keys, children, strict=True)) + "}"
            if valid[i] else "null" for i in range(len(array))]


def _map(array: pa.MapArray) -> list[str]:
    """A map as an object; arrow-json accepts only string keys, other keys are written as their text."""
    offsets = array.offsets.to_pylist()
    start, end = offsets[0], offsets[-1]
    key_values = array.keys.slice(start, end - start)
    keys = _column(key_values) if key_values.type in _string_types() else [
        _python_text(key) for key in key_values.to_pylist()]
    items = _column(array.items.slice(start, end - start))
    valid = array.is_valid().to_pylist()
    return ["{" + ",".join(f"{keys[j]}:{items[j]}" for j in range(offsets[i] - start, offsets[i + 1] - start)) + "}"
            if valid[i] else "null" for i in range(len(array))]


def _string_types() -> tuple[pa.DataType, ...]:
    import pyarrow as pa

    return pa.string(), pa.large_string(), pa.string_view()
