"""``dynamic_table_check(table, value | list)``: is a value, or any element of a list, in a dynamic table?

Semantics are Streamling's: a NULL value gives NULL; a list gives true when any non-null element
is in the table, false when it is empty and NULL when the list itself is NULL. Values that are not
strings are compared as their text. ``table`` is the dynamic_table node's name, as a literal.

Why it is evaluated per epoch and not per row: before an SQL transform's query runs in an epoch,
the members of every table it checks are read once (one Postgres round trip per table and epoch,
shared by every transform of the flow that checks that table in the epoch, and none when a cached
table is still fresh), and each call is rewritten to an Arrow UDF closed over that set. Executors
answer every row from memory, a whole Arrow batch at a time; a set larger than PySpark's broadcast
threshold (1 MB pickled) travels to executors as a broadcast. Because the set is read again at
every epoch, rows inserted or deleted directly in the table take effect at the next epoch.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING, Any, Protocol, cast

from streamling.errors import StreamlingError
from streamling.spec.sql import DYNAMIC_TABLE_CHECK, rewrite_dynamic_table_calls

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from streamling.runtime.nodes import Epoch


class DynamicTableBackend(Protocol):
    """What a check needs from a table: its members as of this epoch."""

    def members(self, epoch: Epoch) -> frozenset[str]:
        """The set to check against in ``epoch`` (read at most once per epoch)."""
        ...


def check_membership(values: pa.Array | pa.ChunkedArray, members: Set[str]) -> pa.Array:
    """``dynamic_table_check`` over one Arrow array of values or of lists of values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    kind = values.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        return _lookup(values, members)
    hits = np.zeros(len(values), dtype=bool)
    elements = values.flatten()  # elements of the non-null lists, in order
    if len(elements) and members:
        element_hits = pc.fill_null(_lookup(elements, members), False).to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(values).to_numpy(zero_copy_only=False)
        hits[parents[element_hits]] = True
    nulls = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    return pa.array(hits, type=pa.bool_(), mask=nulls)


def _lookup(values: pa.Array, members: Set[str]) -> pa.Array:
    """Membership of each value; NULL stays NULL. Each distinct value is looked up once."""
    import pyarrow as pa

    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = values.cast(pa.string())
    if not members:
        return pa.array([False] * len(values), type=pa.bool_(), mask=values.is_null().to_numpy(zero_copy_only=False))
    encoded = values.dictionary_encode()
    found = pa.array([v in members for v in encoded.dictionary.to_pylist()], type=pa.bool_())
    return found.take(encoded.indices)  # a NULL index (NULL value) gives NULL


def lookup_udf(members: frozenset[str]) -> Any:
    """An Arrow UDF answering ``dynamic_table_check`` against ``members`` (a snapshot)."""
    import pyarrow as pa
    from pyspark.sql.functions import arrow_udf

    def dynamic_table_check(values: pa.Array) -> pa.Array:
        return check_membership(values, members)

    # PySpark reads the UDF kind from the hints; make them objects, not this module's string annotations.
    # (pyspark's overload stubs still demand the functionType argument that the hints replace)
    dynamic_table_check.__annotations__ = {"values": pa.Array, "return": pa.Array}
    return cast(Any, arrow_udf)(dynamic_table_check, "boolean")


def lookup_by_name_udf(tables: Mapping[str, frozenset[str]], node: str) -> Any:
    """An Arrow UDF for ``dynamic_table_check(column, value)``: the column names the table, and all
    its rows must name the same one (Streamling's rule); an unknown or mixed name fails the node."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.functions import arrow_udf

    from streamling.errors import NodeFailure

    def dynamic_table_check(names: pa.Array, values: pa.Array) -> pa.Array:
        distinct = [n for n in pc.unique(names.cast(pa.string())).to_pylist() if n is not None]
        if not distinct:
            return pa.nulls(len(values), type=pa.bool_())
        if len(distinct) > 1:
            raise NodeFailure(node, "sql transform", f"{DYNAMIC_TABLE_CHECK}: the table column holds several names "
                              f"in one batch ({', '.join(sorted(distinct)[:5])}); every row must name the same table",
                              "pass the table's name as a string literal, or one name per transform")
        name = distinct[0]
        if name not in tables:
            raise NodeFailure(node, "sql transform", f"{DYNAMIC_TABLE_CHECK}: dynamic table '{name}' is not defined "
                              f"in the pipeline (defined: {', '.join(sorted(tables)) or 'none'})",
                              "name a dynamic_table node of this pipeline")
        return check_membership(values, tables[name])

    dynamic_table_check.__annotations__ = {"names": pa.Array, "values": pa.Array, "return": pa.Array}
    return cast(Any, arrow_udf)(dynamic_table_check, "boolean")


class DynamicTableChecks:
    """The ``dynamic_table_check`` calls of one SQL transform, bound to the plan's tables.

    Each checked table gets a function name unique to this transform instance (Spark's function
    registry is session-wide, and flows run their epochs concurrently); ``register`` points those
    names at the epoch's snapshots right before the transform's query is planned, and the planned
    query keeps the functions it resolved even when a later epoch registers new ones.
    """

    def __init__(self, tables: list[str], node: str, registry: Mapping[str, DynamicTableBackend] | None,
                 error: Callable[..., StreamlingError], by_column: bool = False) -> None:
        token = uuid.uuid4().hex[:8]
        stem = re.sub(r"[^A-Za-z0-9_]", "_", node)[:40]
        self.functions = {t: f"__sl_dtc_{stem}_{token}_{i}" for i, t in enumerate(tables)}
        #: the function for calls naming the table with a column: it reads every table of the plan
        self.by_column = f"__sl_dtc_{stem}_{token}_by_name" if by_column else None
        self.node = node
        self.registry = registry
        self.error = error

    def rewrite(self, sql: str) -> str:
        return rewrite_dynamic_table_calls(sql, self.functions, self.by_column)

    def register(self, spark: SparkSession, epoch: Epoch | None) -> None:
        """Read each table's members for ``epoch`` (nothing when only planning) and register the UDFs."""
        for table, function in self.functions.items():
            backend = (self.registry or {}).get(table)
            if backend is None:
                raise self.error(f"dynamic table '{table}' is used in SQL transform but not defined in pipeline "
                                 "topology", code="dynamic_table_missing")
            members = backend.members(epoch) if epoch is not None else frozenset()
            spark.udf.register(function, lookup_udf(members))
        if self.by_column is not None:
            registry = self.registry or {}
            every = {name: backend.members(epoch) if epoch is not None else frozenset()
                     for name, backend in registry.items()}
            spark.udf.register(self.by_column, lookup_by_name_udf(every, self.node))
