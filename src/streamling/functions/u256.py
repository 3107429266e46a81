"""U256 / I256 arithmetic as Arrow UDF bodies.

Spark has no 256-bit integer (its DECIMAL stops at 38 digits), so on Spark a U256 or I256 value
is carried as its **exact decimal text** (a STRING column): ``to_u256`` / ``to_i256`` produce it,
the arithmetic functions take and return it, ``u256_to_string`` / ``i256_to_string`` return it
unchanged. Streamling keeps the same values as 32 big-endian bytes; only the physical form
differs, every value and every error is the same:

- NULL operands are errors (Streamling rejects them), as are negative U256 inputs;
- results outside the type's range (U256: 0 … 2²⁵⁶−1, I256: −2²⁵⁵ … 2²⁵⁵−1) are overflow errors;
- division and modulo by zero are errors; I256 division truncates toward zero and the remainder
  takes the dividend's sign (two's-complement machine semantics, not Python's floor division).

``to_u256`` / ``to_i256`` also accept 32 raw bytes, read big-endian as Streamling stores them
(two's complement for I256).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa

from streamling.errors import StreamlingError
from streamling.functions.arrow import rows, values

U256_MAX = (1 << 256) - 1
I256_MIN = -(1 << 255)
I256_MAX = (1 << 255) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_U64_MAX = (1 << 64) - 1


def _fail(message: str) -> StreamlingError:
    return StreamlingError(message, code="sql_function_failed", user=True)


def _parse_decimal(text: str, signed: bool, function: str) -> int:
    """Decimal digits (a leading ``-`` for I256 only), as Streamling's ``from_dec_str``."""
    negative = signed and text.startswith("-")
    digits = text[1:] if negative else text
    if not digits.isascii() or not digits.isdigit():
        raise _fail(f"{function}: cannot parse {'I256' if signed else 'U256'} from '{text}': "
                    "expected decimal digits")
    number = -int(digits) if negative else int(digits)
    return _check(number, signed, function, "overflow")


def _check(number: int, signed: bool, function: str, what: str) -> int:
    low, high = (I256_MIN, I256_MAX) if signed else (0, U256_MAX)
    if not low <= number <= high:
        raise _fail(f"{function}: {'I256' if signed else 'U256'} {what}: {number}")
    return number


def _from_value(value: Any, signed: bool, function: str) -> int:
    if value is None:
        raise _fail(f"{function} does not support null values")
    if isinstance(value, bool):
        raise _fail(f"{function} does not support boolean input")
    if isinstance(value, int):
        if value < 0 and not signed:
            raise _fail(f"{function} does not support negative values: {value}")
        return _check(value, signed, function, "overflow")
    if isinstance(value, Decimal):
        if value != value.to_integral_value():
            raise _fail(f"{function} does not support fractional values: {value}")
        return _from_value(int(value), signed, function)
    if isinstance(value, bytes):
        if len(value) != 32:
            raise _fail(f"{function} expects 32 bytes, got {len(value)}")
        return int.from_bytes(value, "big", signed=signed)
    if isinstance(value, str):
        return _parse_decimal(value, signed, function)
    raise _fail(f"{function} does not support input of type {type(value).__name__}")


def _convert(array: pa.Array, signed: bool, function: str) -> pa.Array:
    return pa.array([str(_from_value(v, signed, function)) for v in values(array)], type=pa.string())


def to_u256(value: pa.Array) -> pa.Array:
    return _convert(value, False, "to_u256")


def to_i256(value: pa.Array) -> pa.Array:
    return _convert(value, True, "to_i256")


def _truncating_div(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _truncating_mod(a: int, b: int) -> int:
    return a - b * _truncating_div(a, b)


def _div(a: int, b: int, name: str) -> int:
    if b == 0:
        raise _fail(f"{name}: division by zero")
    return _truncating_div(a, b)


def _mod(a: int, b: int, name: str) -> int:
    if b == 0:
        raise _fail(f"{name}: modulo by zero")
    return _truncating_mod(a, b)


_BINARY: dict[str, Callable[[int, int, str], int]] = {
    "add": lambda a, b, _: a + b,
    "sub": lambda a, b, _: a - b,
    "mul": lambda a, b, _: a * b,
    "div": _div,
    "mod": _mod,
}


def binary(op: str, signed: bool) -> Callable[[pa.Array, pa.Array], pa.Array]:
    """The body of ``u256_<op>`` / ``i256_<op>``."""
    name = f"{'i' if signed else 'u'}256_{op}"
    apply = _BINARY[op]

    def body(left: pa.Array, right: pa.Array) -> pa.Array:
        out = []
        for a, b in rows([left, right]):
            x, y = _from_value(a, signed, name), _from_value(b, signed, name)
            what = "underflow" if op == "sub" and not signed else "overflow"
            out.append(str(_check(apply(x, y, name), signed, name, what)))
        return pa.array(out, type=pa.string())

    body.__name__ = name
    return body


def i256_neg(value: pa.Array) -> pa.Array:
    return pa.array([str(_check(-_from_value(v, True, "i256_neg"), True, "i256_neg", "overflow"))
                     for v in values(value)], type=pa.string())


def i256_abs(value: pa.Array) -> pa.Array:
    return pa.array([str(_check(abs(_from_value(v, True, "i256_abs")), True, "i256_abs", "overflow"))
                     for v in values(value)], type=pa.string())


def to_int64(value: pa.Array) -> pa.Array:
    """I256 → BIGINT: values up to 2⁶⁴−1 are reinterpreted as signed 64-bit, the rest NULL (and
    NULL stays NULL: it is a conversion out of the 256-bit family, not arithmetic)."""

    def one(v: Any) -> int | None:
        if v is None:
            return None
        number = _from_value(v, True, "to_int64")
        if _I64_MIN <= number <= _I64_MAX:
            return number
        if _I64_MAX < number <= _U64_MAX:
            return number - (1 << 64)
        return None

    return pa.array([one(v) for v in values(value)], type=pa.int64())
