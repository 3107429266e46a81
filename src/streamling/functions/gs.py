"""Arrow UDF bodies of the ``_gs_*`` functions Spark has no built-in for, and ``uuid7``.

Semantics are Streamling's (see docs/sql-functions.md). Each body takes whole Arrow arrays and
returns one; heavy libraries are imported inside the body so Python workers stay light.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa

from streamling.functions.arrow import as_bytes, elementwise, rows, values

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def xxhash128(text: pa.Array) -> pa.Array:
    """XXH3-128 of the UTF-8 bytes, 32 lower-case hex characters; NULL stays NULL."""
    import xxhash

    digest = xxhash.xxh3_128_hexdigest
    return elementwise(lambda v: digest(as_bytes(v)), [text], pa.string())


def keccak256(text: pa.Array) -> pa.Array:
    """``0x``-hex Keccak-256; ``0x…`` input is hashed as the bytes it spells (invalid hex: NULL)."""
    from Crypto.Hash import keccak

    def one(value: str) -> str | None:
        if value.startswith("0x"):
            if not _is_hex(value[2:]):
                return None
            data = bytes.fromhex(value[2:])
        else:
            data = value.encode()
        return "0x" + keccak.new(digest_bits=256, data=data).hexdigest()

    return elementwise(one, [text], pa.string())


def _is_hex(text: str) -> bool:
    """Even length and hex digits only (``bytes.fromhex`` would also accept spaces)."""
    return len(text) % 2 == 0 and all(c in "0123456789abcdefABCDEF" for c in text)


def _parse_radix(text: str, base: int) -> int | None:
    """Streamling's big-integer parse: optional sign, digits of ``base``, ``_`` between digits."""
    sign = 1
    if text[:1] in "+-" and text:
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if not text or text[0] == "_":
        return None
    number = 0
    seen = False
    for c in text:
        if c == "_":
            continue
        digit = _DIGITS.find(c.lower()) if c.isascii() else -1
        if digit < 0 or digit >= base:
            return None
        number = number * base + digit
        seen = True
    return sign * number if seen else None


def _format_radix(number: int, base: int) -> str:
    if number == 0:
        return "0"
    sign = "-" if number < 0 else ""
    number = abs(number)
    out = []
    while number:
        number, digit = divmod(number, base)
        out.append(_DIGITS[digit])
    return sign + "".join(reversed(out))


def _base(value: Any) -> int | None:
    """A base given as an integer or as text (Rust ``i32`` parse: optional sign, digits only)."""
    if isinstance(value, int):
        return value
    text = str(value)
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isascii() or not digits.isdigit():
        return None
    return int(text)


def conv_base(number: pa.Array, from_base: pa.Array, to_base: pa.Array) -> pa.Array:
    """Any-size integer from one base (2–36) to another, lower-case; anything invalid gives NULL."""

    def one(text: str, source: Any, target: Any) -> str | None:
        src, dst = _base(source), _base(target)
        if src is None or dst is None or not (2 <= src <= 36 and 2 <= dst <= 36):
            return None
        parsed = _parse_radix(str(text), src)
        return None if parsed is None else _format_radix(parsed, dst)

    return elementwise(one, [number, from_base, to_base], pa.string())


def from_base58(text: pa.Array) -> pa.Array:
    """Bitcoin-alphabet base58 → bytes; invalid input and NULL give empty bytes."""
    import base58

    def one(value: str | None) -> bytes:
        if value is None:
            return b""
        try:
            return bytes(base58.b58decode(value.encode()))
        except ValueError:
            return b""

    return pa.array([one(v) for v in values(text)], type=pa.binary())


def to_base58(data: pa.Array) -> pa.Array:
    """Bytes (or text as UTF-8) → base58; leading zero bytes become '1'; NULL stays NULL."""
    import base58

    return elementwise(lambda v: base58.b58encode(as_bytes(v)).decode(), [data], pa.string())


def _clickhouse_value(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if value is None:
        return "null"
    return _json_text(value)


def _json_text(value: Any) -> str:
    """serde_json's compact text: keys of objects sorted, non-ASCII kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def json_objects_to_clickhouse_tuples(text: pa.Array, keys: pa.Array) -> pa.Array:
    """``[{…}, …]`` → ``[(v1, v2), …]`` of the keys; strings single-quoted, missing keys null.

    A NULL document gives ``[]``; a document that is not a JSON array fails the query, as in
    Streamling.
    """
    from streamling.errors import StreamlingError

    out: list[str] = []
    for document, wanted in rows([text, keys]):
        if document is None:
            out.append("[]")
            continue
        try:
            objects = json.loads(document)
        except ValueError as exc:
            raise StreamlingError(f"_gs_json_objects_to_clickhouse_tuples: failed to parse JSON: {exc}",
                                  code="sql_function_failed", user=True) from exc
        names = [k for k in wanted or [] if k is not None]
        if not isinstance(objects, list):
            raise StreamlingError("_gs_json_objects_to_clickhouse_tuples: the JSON must be an array of objects",
                                  code="sql_function_failed", user=True)
        tuples = (
            "(" + ", ".join(_clickhouse_value(o.get(k) if isinstance(o, dict) else None) for k in names) + ")"
            for o in objects)
        out.append("[" + ", ".join(tuples) + "]")
    return pa.array(out, type=pa.string())


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def uuid7(*like: pa.Array, count: int | None = None) -> pa.Array:
    """Fresh UUIDv7 strings, one per row: 48-bit Unix milliseconds, then 74 random bits.

    Built for the whole batch at once with numpy (random bytes, timestamp, version and variant
    bits, hex digits and dashes), never one row at a time.
    """
    n = count if count is not None else (len(like[0]) if like else 0)
    raw = np.frombuffer(os.urandom(16 * n), dtype=np.uint8).reshape(n, 16).copy()
    millis = time.time_ns() // 1_000_000
    raw[:, :6] = np.frombuffer(millis.to_bytes(6, "big"), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x70
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    digits = np.empty((n, 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX[raw >> 4]
    digits[:, 1::2] = _HEX[raw & 0x0F]
    text = np.full((n, 36), ord("-"), dtype=np.uint8)
    for start, stop, at in ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19), (20, 32, 24)):
        text[:, at:at + stop - start] = digits[:, start:stop]
    offsets = np.arange(0, 36 * (n + 1), 36, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(text.tobytes()))
