"""Streamling's own SQL functions (the ``_gs_*`` family, ``uuid7``, Flink-compatible helpers) on Spark.

Each function is either an **expression**: a rewrite of the call into Spark built-ins (sqlglot
trees, Spark dialect), so it runs in the JVM at Spark speed; or a **udf**: a vectorised Arrow UDF
registered in the session under ``udf_name``, for what Spark cannot express (hashes, base58, …).
The SQL translator (``streamling.spec.sql_translate``) looks calls up here by lower-cased name,
checks their argument count at validate time and rewrites them; where translated SQL runs (an SQL
transform's query, a Kafka source's filter) ``register_udfs`` registers them once per session, so a
pipeline that calls none pays nothing at start-up.

Streamling's literal-argument gotcha (``_gs_split_string_to_array``, ``_gs_generate_series``,
``_gs_conv_base`` read a literal argument as a one-row array, so mixing literal and column arguments
fails on batches of more than one row) is **not** reproduced: literals are accepted and every row
gets its own answer. That answer is the one Streamling gives wherever it gives one (one-row batches,
all-literal or all-column calls), so no pipeline gets different rows; pipelines that failed there
now run. The opposite quirk, where Streamling silently reads a list argument from the first row of
a batch only (``array_filter_in``'s values, ``_gs_json_objects_to_clickhouse_tuples``' keys), would
give different rows per row, so those arguments must be constants: anything else is a user error at
translation, never a silent difference.

U256 / I256 values are carried as exact decimal text (see ``streamling.functions.u256``).

This module must not import pyspark at import time: validation runs without a JVM.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from streamling.functions import expressions as x
from streamling.spec.sql_calls import wanted_args

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class SqlFunction:
    """One function as users call it in a Streamling SQL transform."""

    name: str  #: lower-case, as looked up (DataFusion folds unquoted names)
    min_args: int
    max_args: int | None  #: None: variadic
    summary: str  #: one line for docs and did-you-mean listings
    #: expression kind: the call's (already translated) arguments → a Spark expression
    to_spark: Callable[[list[exp.Expression]], exp.Expression] | None = None
    #: udf kind: the name the Arrow UDF is registered under in the session
    udf_name: str | None = None

    def arity_problem(self, count: int) -> str | None:
        """Why ``count`` arguments do not fit, in user words, or None."""
        want = wanted_args(count, self.min_args, self.max_args)
        return None if want is None else f"{self.name} takes {want} arguments, found {count}"


UDF_PREFIX = "streamling_"


def _udf_name(name: str) -> str:
    """Must agree with ``udfs.udf_name`` (kept here so this module never imports pyspark)."""
    return UDF_PREFIX + name.lstrip("_")


def _expr(name: str, lo: int, hi: int | None, summary: str,
          rewrite: Callable[[list[exp.Expression]], exp.Expression]) -> SqlFunction:
    return SqlFunction(name, lo, hi, summary, to_spark=rewrite)


def _udf(name: str, lo: int, hi: int | None, summary: str) -> SqlFunction:
    return SqlFunction(name, lo, hi, summary, udf_name=_udf_name(name))


def _uuid7(_args: list[exp.Expression]) -> exp.Expression:
    # A constant argument tells the Arrow UDF its batch's length; the UDF is non-deterministic,
    # so Spark evaluates it per row and never folds it.
    return x.call(_udf_name("uuid7"), [exp.Literal.number(0)])


def _returning(position: int) -> Callable[[list[exp.Expression]], str | None]:
    """The RETURNING type a literal argument names (json_value/json_query), if any."""
    def kind(args: list[exp.Expression]) -> str | None:
        if len(args) <= position:
            return None
        text = x.string_literal(args[position])
        return None if text is None or text.strip().upper() in {"", "STRING", "VARCHAR"} else text
    return kind


_U256 = "exact decimal text (Spark has no 256-bit integer)"

FUNCTIONS: dict[str, SqlFunction] = {
    f.name: f for f in [
        # --- _gs_* and array helpers --------------------------------------------------------
        _expr("_gs_split_string_to_array", 1, 2, "text → list split on a literal separator (default ' ')",
              x.split_string_to_array),
        _expr("_gs_split_string_by", 1, 2, "alias of _gs_split_string_to_array", x.split_string_to_array),
        _expr("_gs_generate_series", 2, 3, "inclusive list of BIGINT from start to stop by step (default 1)",
              x.generate_series),
        _expr("_gs_zip_arrays", 2, 4, "2–4 lists → list of struct<f0, f1, …>; NULL list gives []",
              x.zip_arrays),
        _expr("array_enumerate", 1, 1, "list → list of struct<index (0-based BIGINT), value>",
              x.array_enumerate),
        _expr("array_filter", 3, 3, "structs of a list whose field equals a value (NULL matches NULL)",
              x.array_filter),
        _expr("array_filter_first", 3, 3, "first struct of a list whose field equals a value, or NULL",
              x.array_filter_first),
        _expr("array_filter_in", 3, 3, "structs of a list whose field is in a constant list", x.array_filter_in),
        _expr("array_struct_field", 2, 2, "one field of every struct of a list", x.array_struct_field),
        _expr("to_large_list", 1, 1, "the list itself (Spark has one list type)", x.identity),
        _udf("_gs_xxhash", 1, 1, "XXH3-128 hash as 32 hex characters"),
        _udf("_gs_keccak256", 1, 1, "Keccak-256 as 0x-hex; 0x input is hashed as hex bytes"),
        _udf("_gs_conv_base", 3, 3, "integer text from one base (2–36) to another; invalid gives NULL"),
        _expr("coalesce_meta", 1, None, "first non-NULL argument", x.coalesce),
        _expr("json_string", 1, 1, "any value as JSON text; NULL stays NULL", x.json_string),
        _udf("_gs_from_base58", 1, 1, "base58 → binary; invalid or NULL gives empty bytes"),
        _udf("_gs_to_base58", 1, 1, "binary → base58"),
        _expr("_gs_hex_to_byte", 1, 1, "hex (optional 0x or 0X) → binary; invalid or NULL gives empty bytes",
              x.hex_to_byte),
        _expr("_gs_byte_to_hex", 1, 1, "binary → lower-case hex text; NULL stays NULL", x.byte_to_hex),
        _expr("reverse_bytes32", 1, 1, "binary with its bytes reversed; NULL stays NULL", x.reverse_bytes),
        _expr("_gs_map_to_array_struct", 1, 1, "map → list of struct<key, value>", x.map_to_array_struct),
        _expr("_gs_json_objects_to_clickhouse_tuples", 2, 2,
              "JSON array of objects + constant key list → ClickHouse tuple text",
              x.json_objects_to_clickhouse_tuples(_udf_name("_gs_json_objects_to_clickhouse_tuples"))),
        _expr("uuid7", 0, 0, "a fresh UUIDv7 string per row", _uuid7),
        # --- U256 / I256 ------------------------------------------------------------------------
        _udf("to_u256", 1, 1, f"text, integer or 32 big-endian bytes → U256 as {_U256}"),
        _expr("u256_to_string", 1, 1, "U256 → decimal text", x.template("CAST(_a0 AS STRING)")),
        *[_udf(f"u256_{op}", 2, 2, f"U256 {op}; NULL, overflow and zero divisors are errors")
          for op in ("add", "sub", "mul", "div", "mod")],
        _udf("to_i256", 1, 1, f"text, integer or 32 big-endian two's-complement bytes → I256 as {_U256}"),
        _expr("i256_to_string", 1, 1, "I256 → decimal text", x.template("CAST(_a0 AS STRING)")),
        *[_udf(f"i256_{op}", 2, 2, f"I256 {op}; NULL, overflow and zero divisors are errors")
          for op in ("add", "sub", "mul", "div", "mod")],
        _udf("i256_neg", 1, 1, "I256 negation; overflow is an error"),
        _udf("i256_abs", 1, 1, "I256 absolute value; overflow is an error"),
        _udf("to_int64", 1, 1, "I256 → BIGINT; 2^63…2^64−1 reinterpreted as signed, out of range NULL"),
        # --- Flink-compatible string functions --------------------------------------------------
        _udf("regexp_extract", 2, 3, "group (default 0) of the first match; none or bad group gives NULL"),
        _udf("regexpextract", 2, 3, "alias of regexp_extract"),
        _expr("regexp_extract_all", 2, 3, "group (default 1) of every match; none gives []", x.regexp_extract_all),
        _expr("regexp_substr", 2, 2, "first match, or NULL", x.renamed("regexp_substr")),
        _expr("regexp_count", 2, 2, "number of non-overlapping matches", x.renamed("regexp_count")),
        _udf("regexp_instr", 2, 4, "1-based position of a match from start, occurrence; 0 when none"),
        _expr("regexp_replace", 3, 3, "every match replaced by literal text", x.regexp_replace),
        _expr("locate", 2, 3, "1-based position of a substring from start; 0 when not found", x.locate),
        _expr("instr", 2, 4, "1-based position of an occurrence of a substring; negative start searches back",
              x.instr(_udf_name("instr"))),
        _expr("bin", 1, 1, "integer → binary digits", x.renamed("bin")),
        _expr("elt", 2, None, "the i-th (1-based) of the values; out of range gives NULL", x.elt),
        _expr("parse_url", 2, 3, "a part of a URL (HOST, PATH, QUERY, …); invalid URL gives NULL",
              x.renamed("try_parse_url")),
        _expr("split", 2, 2, "text → list on a literal delimiter, empty tokens kept; '' splits characters",
              x.split),
        _expr("split_index", 3, 3, "the 0-based token of split; out of range gives NULL", x.split_index),
        _expr("translate", 3, 3, "characters of from replaced by those of to, dropped when to is shorter",
              x.renamed("translate")),
        _expr("translate3", 3, 3, "alias of translate", x.renamed("translate")),
        _expr("unhex", 1, 1, "hex → binary; odd length left-padded, non-hex gives NULL", x.renamed("unhex")),
        _expr("url_encode", 1, 1, "form URL encoding (space → +)", x.renamed("url_encode")),
        _expr("url_decode", 1, 1, "form URL decoding (+ → space); invalid gives NULL", x.renamed("try_url_decode")),
        # --- Flink JSON functions ---------------------------------------------------------------
        _udf("json_quote", 1, 1, "text as a JSON string literal; / and non-ASCII escaped"),
        _udf("json_unquote", 1, 1, "the value of a JSON string literal; other text unchanged"),
        _udf("json_exists", 2, 3, "does a JSON path exist; on_error FALSE, TRUE, UNKNOWN or ERROR"),
        _expr("json_array", 0, None, "JSON array of the values; JSON object/array text embedded",
              x.udf_or_constant(_udf_name("json_array"), "[]")),
        _expr("json_array_absent_on_null", 0, None, "json_array without NULL values",
              x.udf_or_constant(_udf_name("json_array_absent_on_null"), "[]")),
        _expr("json_object", 0, None, "JSON object of key, value pairs; a NULL key is an error",
              x.udf_or_constant(_udf_name("json_object"), "{}")),
        _expr("json_object_absent_on_null", 0, None, "json_object without NULL values",
              x.udf_or_constant(_udf_name("json_object_absent_on_null"), "{}")),
        _udf("json", 1, 1, "validated, compact JSON; blank text gives NULL"),
        _expr("json_query", 2, 6, "object or array at a JSON path, as JSON text",
              x.cast_udf(_udf_name("json_query"), _returning(2))),
        _expr("json_value", 2, 7, "scalar at a JSON path; RETURNING, ON EMPTY/ON ERROR with DEFAULT",
              x.cast_udf(_udf_name("json_value"), _returning(2))),
        _udf("parse_json", 1, 1, "compact JSON text; invalid input is an error"),
        _udf("try_parse_json", 1, 1, "compact JSON text; invalid input gives NULL"),
        _udf("is_json", 1, 2, "is the text JSON (VALUE, OBJECT, ARRAY or SCALAR); NULL gives false"),
        # --- aliases of DataFusion built-ins ------------------------------------------------------
        _expr("startswith", 2, 2, "does text start with a prefix", x.renamed("startswith")),
        _expr("endswith", 2, 2, "does text end with a suffix", x.renamed("endswith")),
        _expr("lowercase", 1, 1, "alias of lower", x.renamed("lower")),
        _expr("uppercase", 1, 1, "alias of upper", x.renamed("upper")),
        _expr("regexp", 2, 2, "alias of regexp_like", x.renamed("regexp_like")),
        _expr("similar", 2, 2, "alias of regexp_like", x.renamed("regexp_like")),
        _expr("charlength", 1, 1, "alias of character_length", x.renamed("char_length")),
        _expr("dateformat", 2, 2, "alias of date_format (Flink's dateFormat)", x.renamed("date_format")),
        _expr("hex", 1, 1, "alias of to_hex: lower-case hex", x.template("lower(hex(_a0))")),
    ]
}


PLUGIN_UDF_PREFIX = "streamling_plugin_"


def lookup(name: str) -> SqlFunction | None:
    """The Streamling function called ``name`` (any case), or None. A plugin UDF of that name wins:
    Streamling registers plugin UDFs last, and a later registration replaces an earlier one."""
    from streamling.plugins.registry import UDFS

    plugin = UDFS.get(name.lower())
    if plugin is not None:
        return SqlFunction(plugin.name, plugin.min_args, plugin.max_args, f"plugin UDF from {plugin.origin}",
                           udf_name=PLUGIN_UDF_PREFIX + plugin.name)
    return FUNCTIONS.get(name.lower())


def function_names() -> list[str]:
    """Every Streamling function name, plugin UDFs included (for did-you-mean listings)."""
    from streamling.plugins.registry import UDFS

    return sorted({*FUNCTIONS, *UDFS})


def register_udfs(spark: SparkSession, sql: str | None = None) -> None:
    """Register every udf-kind function in ``spark``, and plugin UDFs not registered yet
    (idempotent; cheap after the first call). With ``sql``, only when that query calls one of
    them (a name followed by ``(``, any case): most queries call none, and registering the ~40
    Arrow UDFs costs ~0.25 s of a cold start.

    ``foreachBatch`` hands each epoch a new Python ``SparkSession`` wrapping the query's one JVM
    session, so a mark on the Python object alone would register all of them again every epoch
    (~100 ms); the JVM session's function registry says whether they are there."""
    from streamling.functions import udfs
    from streamling.plugins.registry import UDFS

    if sql is not None:
        called = {name.lower() for name in _CALL.findall(sql)}
        if not any(name.startswith((udfs.PREFIX, PLUGIN_UDF_PREFIX)) for name in called):
            return
    if not getattr(spark, "_streamling_udfs", False):
        if not _registered(spark, next(iter(udfs.UDFS))):
            udfs.register(spark)
        spark._streamling_udfs = True  # type: ignore[attr-defined]
    done: set[str] = getattr(spark, "_streamling_plugin_udfs", set())
    for name, plugin in UDFS.items():
        if name not in done:
            if not _registered(spark, PLUGIN_UDF_PREFIX + name):
                udfs.register_plugin_udf(spark, PLUGIN_UDF_PREFIX + name, plugin.fn, plugin.returns,
                                         plugin.deterministic)
            done.add(name)
    spark._streamling_plugin_udfs = done  # type: ignore[attr-defined]


#: a function call's name in SQL text (quoted or not)
_CALL = re.compile(r"`?([A-Za-z_][A-Za-z0-9_]*)`?\s*\(")


def _registered(spark: SparkSession, name: str) -> bool:
    """Whether ``spark``'s JVM session already has the function ``name`` (one round trip)."""
    try:
        return bool(spark.catalog.functionExists(name))
    except Exception:  # noqa: BLE001 - when in doubt, register (idempotent)
        return False
