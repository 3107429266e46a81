"""Postgres column types for Spark data, and whether an existing table can take that data.

The ``postgres`` and ``postgres_aggregate`` sinks create their tables from an input's Spark schema
with ``pg_type_for``; a table that already exists is read back (``ExistingTable.describe``) and
must fit without a cast: every column present and wide enough (``compatible``), and, for a keyed
sink, a primary key or unique index on the key. Sinks never coerce, so a narrower column is refused
up front rather than failing (or losing digits) in the middle of an epoch. The errors are the
sink's: this module only says what does not fit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamling.spec.types import from_spark

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql.types import DataType


def pg_type_for(data_type: DataType, metadata: dict[str, Any] | None = None) -> tuple[str, str]:
    """The Postgres column type for a Spark type and the Spark-side encoding it needs.

    Scalars map as their Streamling type does (``streamling.spec.types``): a wide decimal, carried
    as exact text tagged in ``metadata``, becomes ``NUMERIC(p,s)`` and its text is copied as is."""
    from pyspark.sql import types as T

    kind = from_spark(data_type, metadata)
    if kind is not None:
        return kind.postgres(), "plain"
    simple: list[tuple[type, str]] = [(T.DateType, "DATE"), (T.TimestampNTZType, "TIMESTAMP"), (T.NullType, "TEXT")]
    for spark_type, pg in simple:
        if isinstance(data_type, spark_type):
            return pg, "plain"
    if isinstance(data_type, T.BinaryType):
        return "BYTEA", "bytea"
    nested: tuple[type, ...] = (T.StructType, T.ArrayType, T.MapType)
    variant = getattr(T, "VariantType", None)
    if variant is not None:
        nested += (variant,)
    if isinstance(data_type, nested):
        return "JSONB", "json"
    raise ValueError(f"Spark type {data_type.simpleString()} has no Postgres mapping")


_INT_RANK = {"smallint": 1, "integer": 2, "bigint": 3}
_INT_DIGITS = {"smallint": 5, "integer": 10, "bigint": 19}  # digits of the largest value
_NUMERIC = re.compile(r"numeric(?:\((\d+)(?:,(\d+))?\))?$")
_TIMESTAMP = re.compile(r"timestamp(?:\((\d+)\))? with(?:out)? time zone$")
_TEXTUAL = {"text", "uuid", "json", "jsonb", "citext", "name"}


def _numeric_holds(actual: str, int_digits: int, scale: int) -> bool:
    """Can a Postgres ``numeric`` (or, for scale 0, integer) column hold every value with
    ``int_digits`` digits before the point and ``scale`` after it?"""
    if actual in _INT_DIGITS:
        return scale == 0 and int_digits <= _INT_DIGITS[actual] - 1
    m = _NUMERIC.match(actual)
    if not m:
        return False
    if m.group(1) is None:
        return True
    precision, actual_scale = int(m.group(1)), int(m.group(2) or 0)
    return actual_scale >= scale and precision - actual_scale >= int_digits


def compatible(expected: str, actual: str) -> bool:
    """Whether an existing column of type ``actual`` (``format_type`` text) can store the values the
    sink would put in ``expected`` without losing range or precision. The sink never coerces."""
    exp, act = expected.lower(), actual.lower()
    if exp in _INT_RANK:
        if act in _INT_RANK:
            return _INT_RANK[act] >= _INT_RANK[exp]
        return _NUMERIC.match(act) is not None and _numeric_holds(act, _INT_DIGITS[exp], 0)
    m = _NUMERIC.match(exp)
    if m:
        precision, scale = int(m.group(1) or 38), int(m.group(2) or 0)
        return _numeric_holds(act, precision - scale, scale)
    if exp == "real":
        return act in {"real", "double precision", "numeric"}
    if exp == "double precision":
        return act in {"double precision", "numeric"}
    if exp == "text":
        return act in _TEXTUAL or act.startswith("character")
    if exp in {"timestamptz", "timestamp"}:
        ts = _TIMESTAMP.match(act)
        return ts is not None and int(ts.group(1) or 6) >= 6
    if exp == "date":
        return act == "date" or _TIMESTAMP.match(act) is not None
    if exp == "jsonb":
        return act in {"jsonb", "json", "text"}
    return exp == act


@dataclass(frozen=True)
class ExistingTable:
    """A table as Postgres has it: column types (``format_type`` text) and unique column sets."""

    types: dict[str, str]
    unique_sets: set[frozenset[str]]

    @classmethod
    def describe(cls, conn: psycopg.Connection[Any], schema: str, table: str) -> ExistingTable | None:
        """``schema.table`` (a plain or partitioned table), or None if absent. An absent table ends
        the transaction; a present one leaves it open for the caller to commit after its checks."""
        with conn.cursor() as cur:
            cur.execute(
                "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                (schema, table))
            row = cur.fetchone()
            if row is None:
                conn.commit()
                return None
            oid = row[0]
            cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped", (oid,))
            types = {name: typ for name, typ in cur.fetchall()}
            cur.execute(
                "SELECT array_agg(a.attname::text) FROM pg_index i "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL GROUP BY i.indexrelid", (oid,))
            unique_sets = {frozenset(r[0]) for r in cur.fetchall()}
        return cls(types, unique_sets)

    def problems(self, columns: Iterable[tuple[str, str]]) -> list[str]:
        """Why the table cannot take ``(name, Postgres type)`` columns as they are: one text per
        missing or too narrow column, empty when every column fits."""
        out = []
        for name, pg_type in columns:
            actual = self.types.get(name)
            if actual is None:
                out.append(f"column \"{name}\" ({pg_type}) is missing")
            elif not compatible(pg_type, actual):
                out.append(f"column \"{name}\" is {actual} but the input needs {pg_type}")
        return out

    def has_unique(self, key: Sequence[str]) -> bool:
        """Whether a primary key or unique index (without a predicate) covers exactly ``key``:
        what ``ON CONFLICT (key)`` needs."""
        return frozenset(key) in self.unique_sets
