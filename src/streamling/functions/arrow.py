"""Small helpers for UDF bodies: whole Arrow arrays in, one Arrow array out.

Bodies run in Spark's Python workers on each Arrow batch. Where no Arrow kernel exists (hashes,
base58, 256-bit arithmetic, regexes with Streamling's semantics) they loop over the batch's Python
values once; everything else stays in Arrow compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa


def values(array: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The array's Python values (NULL → None), dictionaries decoded."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array.to_pylist()  # type: ignore[no-any-return]


def rows(arrays: Sequence[pa.Array]) -> list[tuple[Any, ...]]:
    return list(zip(*(values(a) for a in arrays), strict=True))


def elementwise(fn: Callable[..., Any], arrays: Sequence[pa.Array], type_: pa.DataType,
                null_in_null_out: bool = True) -> pa.Array:
    """``fn`` over each row's argument values; a NULL argument gives NULL unless told otherwise."""
    if null_in_null_out:
        out = [None if any(v is None for v in row) else fn(*row) for row in rows(arrays)]
    else:
        out = [fn(*row) for row in rows(arrays)]
    return pa.array(out, type=type_)


def as_bytes(value: Any) -> bytes:
    """Text as UTF-8, binary as is."""
    return value.encode() if isinstance(value, str) else bytes(value)
