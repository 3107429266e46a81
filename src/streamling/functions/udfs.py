"""The Arrow UDFs behind udf-kind functions, and their registration in a SparkSession.

Imported only by ``catalog.register_udfs`` (the driver) and by Spark's Python workers when they
unpickle a body, so pyspark is imported here freely; the bodies' own heavy libraries (xxhash,
pycryptodome, base58) are imported inside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from streamling.functions import flink, gs, u256

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PREFIX = "streamling_"


def udf_name(function: str) -> str:
    """The session name of ``function``'s UDF: prefixed, so it never shadows a Spark built-in."""
    return PREFIX + function.lstrip("_")


@dataclass(frozen=True)
class Udf:
    body: Callable[..., pa.Array]
    returns: str  #: Spark type name: string, binary, boolean, int or bigint
    deterministic: bool = True


def _json_array(*items: pa.Array) -> pa.Array:
    return flink.json_array(*items)


def _json_array_absent(*items: pa.Array) -> pa.Array:
    return flink.json_array(*items, absent_on_null=True)


def _json_object(*pairs: pa.Array) -> pa.Array:
    return flink.json_object(*pairs)


def _json_object_absent(*pairs: pa.Array) -> pa.Array:
    return flink.json_object(*pairs, absent_on_null=True)


def _uuid7(like: pa.Array) -> pa.Array:
    # A 0-argument Arrow UDF would not know its batch's length: the rewrite passes a constant.
    return gs.uuid7(like)


UDFS: dict[str, Udf] = {udf_name(k): v for k, v in {
    "_gs_xxhash": Udf(gs.xxhash128, "string"),
    "_gs_keccak256": Udf(gs.keccak256, "string"),
    "_gs_conv_base": Udf(gs.conv_base, "string"),
    "_gs_from_base58": Udf(gs.from_base58, "binary"),
    "_gs_to_base58": Udf(gs.to_base58, "string"),
    "_gs_json_objects_to_clickhouse_tuples": Udf(gs.json_objects_to_clickhouse_tuples, "string"),
    "uuid7": Udf(_uuid7, "string", deterministic=False),
    "to_u256": Udf(u256.to_u256, "string"),
    "to_i256": Udf(u256.to_i256, "string"),
    **{f"{kind}256_{op}": Udf(u256.binary(op, kind == "i"), "string")
       for kind in ("u", "i") for op in ("add", "sub", "mul", "div", "mod")},
    "i256_neg": Udf(u256.i256_neg, "string"),
    "i256_abs": Udf(u256.i256_abs, "string"),
    "to_int64": Udf(u256.to_int64, "bigint"),
    "regexp_extract": Udf(flink.regexp_extract, "string"),
    "regexpextract": Udf(flink.regexp_extract, "string"),
    "regexp_instr": Udf(flink.regexp_instr, "int"),
    "instr": Udf(flink.instr, "int"),
    "json_quote": Udf(flink.json_quote, "string"),
    "json_unquote": Udf(flink.json_unquote, "string"),
    "json": Udf(flink.json_, "string"),
    "parse_json": Udf(flink.parse_json, "string"),
    "try_parse_json": Udf(flink.try_parse_json, "string"),
    "is_json": Udf(flink.is_json, "boolean"),
    "json_exists": Udf(flink.json_exists, "boolean"),
    "json_array": Udf(_json_array, "string"),
    "json_array_absent_on_null": Udf(_json_array_absent, "string"),
    "json_object": Udf(_json_object, "string"),
    "json_object_absent_on_null": Udf(_json_object_absent, "string"),
    "json_query": Udf(flink.json_query, "string"),
    "json_value": Udf(flink.json_value, "string"),
}.items()}


def _whole_batch(body: Callable[..., pa.Array]) -> Callable[..., pa.Array]:
    """Spark may hand a body chunked arrays; bodies take plain arrays."""

    def run(*columns: pa.Array) -> pa.Array:
        plain = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
        return body(*plain)

    run.__name__ = getattr(body, "__name__", "udf")
    return run


def register(spark: SparkSession) -> None:
    """Register every UDF of ``UDFS`` in ``spark`` under its prefixed name."""
    from pyspark.sql import types as T
    from pyspark.sql.functions import arrow_udf

    # DataType objects, not DDL text: DDL would be parsed by the JVM, one round trip per UDF.
    kinds = {"string": T.StringType(), "binary": T.BinaryType(), "boolean": T.BooleanType(),
             "int": T.IntegerType(), "bigint": T.LongType()}
    for name, udf in UDFS.items():
        function = arrow_udf(_whole_batch(udf.body), kinds[udf.returns])  # type: ignore[call-overload]
        if not udf.deterministic:
            function = function.asNondeterministic()
        spark.udf.register(name, function)


def register_plugin_udf(spark: SparkSession, name: str, fn: Callable[..., pa.Array], returns: str,
                        deterministic: bool) -> None:
    """Register a plugin's vectorised function under ``name``; ``returns`` is a Spark type name."""
    from pyspark.sql.functions import arrow_udf

    from streamling.plugins.discovery import ship_by_value

    ship_by_value(fn)
    function = arrow_udf(_whole_batch(fn), returns)  # type: ignore[call-overload]
    if not deterministic:
        function = function.asNondeterministic()
    spark.udf.register(name, function)
