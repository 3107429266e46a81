"""DataFusion's built-in SQL functions, each mapped to a Spark expression that gives the same value.

Spark shares many names with DataFusion but not always the meaning (``log(x)`` is base 10 in
DataFusion and natural in Spark; ``trunc`` truncates numbers in one and dates in the other;
``from_unixtime`` returns a timestamp in one and text in the other). So nothing passes through by
name alone: every accepted function is listed here, either in ``SAME_IN_SPARK`` (checked to have the
same semantics) or with a builder. ``NOT_FAITHFUL`` names the DataFusion functions that have no
faithful Spark translation, with what to write instead. What a builder is made of is
``sql_calls``; the chrono and regular-expression syntax it rewrites is ``sql_patterns``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlglot import exp

from streamling.spec.sql_calls import INTEGRAL, Build, Builtin, TypeOf, Unfaithful, call, cast, lit, num, string_literal
from streamling.spec.sql_patterns import java_datetime_pattern, java_replacement


def _renamed(name: str) -> Build:
    return lambda args, _t: call(name, *args)


# --- names Spark shares with DataFusion, same semantics ----------------------------------------------

#: name → (min args, max args); each passes through as written
SAME_IN_SPARK: dict[str, tuple[int, int | None]] = {
    "abs": (1, 1), "acos": (1, 1), "asin": (1, 1), "atan": (1, 1), "atan2": (2, 2), "cbrt": (1, 1),
    "ceil": (1, 1), "cos": (1, 1), "cosh": (1, 1), "cot": (1, 1), "degrees": (1, 1), "exp": (1, 1),
    "floor": (1, 1), "radians": (1, 1), "signum": (1, 1), "sin": (1, 1), "sinh": (1, 1), "sqrt": (1, 1),
    "tan": (1, 1), "tanh": (1, 1), "pi": (0, 0), "isnan": (1, 1), "nanvl": (2, 2),
    "round": (1, 2),
    "coalesce": (1, None), "nullif": (2, 2), "nvl": (2, 2), "nvl2": (3, 3),
    "greatest": (1, None), "least": (1, None),
    "ascii": (1, 1), "bit_length": (1, 1), "octet_length": (1, 1), "length": (1, 1),
    "char_length": (1, 1), "character_length": (1, 1), "lower": (1, 1), "upper": (1, 1),
    "concat_ws": (2, None), "lpad": (2, 3), "rpad": (2, 3), "repeat": (2, 2),
    "replace": (3, 3), "reverse": (1, 1), "split_part": (3, 3), "btrim": (1, 2), "trim": (1, 1),
    "md5": (1, 1), "levenshtein": (2, 2), "find_in_set": (2, 2),
    "substring_index": (3, 3), "uuid": (0, 0), "date_trunc": (2, 2), "make_date": (3, 3),
    "current_date": (0, 0), "named_struct": (2, None), "flatten": (1, 1),
    "array_max": (1, 1), "array_min": (1, 1), "array_append": (2, 2),
}


# --- builders ---------------------------------------------------------------------------------------

def _concat(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion's concat skips NULLs (Spark's returns NULL): concat_ws('') does the same.
    return call("concat_ws", lit(""), *args)


def _trim_side(position: str) -> Build:
    def build(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
        if len(args) == 1:
            return call("ltrim" if position == "LEADING" else "rtrim", args[0])
        return exp.Trim(this=args[0], expression=args[1], position=position)
    return build


def _substr(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion counts positions like PostgreSQL: start 0 or below eats into the length, while
    # Spark treats 0 as 1 and negatives as "from the end".
    text, start = args[0], args[1]
    first = call("greatest", start.copy(), num(1))
    if len(args) == 2:
        return call("substring", text, first)
    length = exp.Sub(this=exp.Add(this=exp.paren(start, copy=False), expression=args[2]), expression=first.copy())
    return call("substring", text, first, call("greatest", length, num(0)))


def _non_negative_int(arg: exp.Expression) -> bool:
    return isinstance(arg, exp.Literal) and arg.is_int


def _left(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion: a negative n keeps all but the last |n| characters; Spark answers ''.
    text, n = args
    if _non_negative_int(n):
        return call("left", text, n)
    keep = call("greatest", exp.Add(this=call("char_length", text.copy()), expression=n.copy()), num(0))
    return exp.If(this=exp.LT(this=n.copy(), expression=num(0)), true=call("substring", text.copy(), num(1), keep),
                  false=call("left", text, n))


def _right(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion: a negative n drops the first |n| characters; Spark answers ''.
    text, n = args
    if _non_negative_int(n):
        return call("right", text, n)
    return exp.If(this=exp.LT(this=n.copy(), expression=num(0)),
                  true=call("substring", text.copy(), exp.Sub(this=num(1), expression=n.copy())),
                  false=call("right", text, n))


def _hex(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return exp.Lower(this=call("hex", args[0]))


def _sha(bits: int) -> Build:
    # DataFusion's sha2 family returns bytes; Spark's sha2 returns hex text.
    return lambda args, _t: call("unhex", call("sha2", args[0], num(bits)))


_DIGESTS: dict[str, Callable[[exp.Expression], exp.Expression]] = {
    "md5": lambda a: call("unhex", call("md5", a)),
    "sha224": lambda a: call("unhex", call("sha2", a, num(224))),
    "sha256": lambda a: call("unhex", call("sha2", a, num(256))),
    "sha384": lambda a: call("unhex", call("sha2", a, num(384))),
    "sha512": lambda a: call("unhex", call("sha2", a, num(512))),
}


def _digest(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    algorithm = string_literal(args[1], "digest's algorithm").lower()
    if algorithm not in _DIGESTS:
        raise Unfaithful(f"digest algorithm '{algorithm}' has no Spark equivalent; "
                         f"use one of {', '.join(sorted(_DIGESTS))}")
    return _DIGESTS[algorithm](args[0])


def _float_log(spark_name: str, value: exp.Expression) -> exp.Expression:
    """A logarithm with IEEE answers outside its domain, as DataFusion's (Rust's f64) are: −∞ at 0,
    NaN below; Spark answers NULL for both."""
    return exp.Case(ifs=[
        exp.If(this=exp.GT(this=value.copy(), expression=num(0)), true=call(spark_name, value.copy())),
        exp.If(this=exp.EQ(this=value.copy(), expression=num(0)), true=cast(lit("-Infinity"), "double")),
        exp.If(this=exp.LT(this=value, expression=num(0)), true=cast(lit("NaN"), "double")),
    ])


def _log(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion's one-argument log is base 10; Spark's is natural.
    return _float_log("log10", args[0]) if len(args) == 1 else call("log", args[0], args[1])


def _trunc(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion truncates numbers toward zero; Spark's trunc truncates dates.
    value = args[0]
    digits = args[1] if len(args) == 2 else num(0)
    toward_zero = exp.If(this=exp.LT(this=value.copy(), expression=num(0)),
                         true=call("ceil", value.copy(), digits.copy()), false=call("floor", value, digits))
    return cast(toward_zero, "double")


def _timestamp_kind(unit: str, int_call: Callable[[exp.Expression], exp.Expression]) -> Build:
    """to_timestamp_<unit>: integers count ``unit``s since the epoch; text is parsed and truncated."""
    def build(args: list[exp.Expression], type_of: TypeOf) -> exp.Expression:
        value = args[0]
        if type_of(value) in INTEGRAL:
            return int_call(value)
        parsed = _parse_timestamp(args)
        return parsed if unit == "NANOSECOND" else call("date_trunc", lit(unit), parsed)
    return build


def _parse_timestamp(args: list[exp.Expression]) -> exp.Expression:
    if len(args) == 1:
        return cast(args[0], "timestamp")
    formats = [java_datetime_pattern(string_literal(f, "a timestamp format")) for f in args[1:]]
    if len(formats) == 1:
        return call("to_timestamp", args[0], lit(formats[0]))
    return call("coalesce", *(call("try_to_timestamp", args[0].copy(), lit(f)) for f in formats))


def _to_timestamp(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # Spark's cast reads numbers as seconds since the epoch and parses RFC 3339 text, as
    # DataFusion's to_timestamp does.
    return _parse_timestamp(args)


def _to_date(args: list[exp.Expression], type_of: TypeOf) -> exp.Expression:
    if len(args) == 1:
        if type_of(args[0]) in INTEGRAL:
            return call("date_from_unix_date", args[0])
        return cast(args[0], "date")
    return cast(_parse_timestamp(args), "date")


def _to_unixtime(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return call("unix_seconds", _parse_timestamp(args) if len(args) > 1 else cast(args[0], "timestamp"))


def _to_char(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    pattern = java_datetime_pattern(string_literal(args[1], "the format of to_char"))
    return call("date_format", args[0], lit(pattern))


_PARTS: dict[str, Callable[[exp.Expression], exp.Expression]] = {
    "year": lambda v: call("year", v), "quarter": lambda v: call("quarter", v),
    "month": lambda v: call("month", v), "week": lambda v: call("weekofyear", v),
    "day": lambda v: call("dayofmonth", v), "hour": lambda v: call("hour", v),
    "minute": lambda v: call("minute", v), "second": lambda v: call("second", v),
    "millisecond": lambda v: cast(exp.Mul(this=call("date_part", lit("SECOND"), v), expression=num(1000)), "int"),
    "microsecond": lambda v: cast(exp.Mul(this=call("date_part", lit("SECOND"), v), expression=num(1000000)),
                                  "int"),
    # DataFusion counts days of the week from 0 = Sunday, Spark's dayofweek from 1 = Sunday.
    "dow": lambda v: exp.Sub(this=call("dayofweek", v), expression=num(1)),
    "doy": lambda v: call("dayofyear", v),
    "epoch": lambda v: exp.Div(this=call("unix_micros", cast(v, "timestamp")),
                               expression=cast(num(1000000), "double")),
}
_PART_ALIASES = {"years": "year", "months": "month", "weeks": "week", "days": "day", "hours": "hour",
                 "minutes": "minute", "seconds": "second", "milliseconds": "millisecond",
                 "microseconds": "microsecond", "qtr": "quarter", "dayofweek": "dow", "dayofyear": "doy"}


def date_part(unit: str, value: exp.Expression) -> exp.Expression:
    key = unit.lower()
    key = _PART_ALIASES.get(key, key)
    if key not in _PARTS:
        raise Unfaithful(f"date part '{unit}' is not supported; use one of {', '.join(_PARTS)}")
    return _PARTS[key](value)


def _date_part(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return date_part(string_literal(args[0], "the part of date_part"), args[1])


def _regex_flags(args: list[exp.Expression], index: int, allowed: str = "imsx") -> tuple[str, str]:
    """DataFusion's flags argument → (Java inline flags prefix, the flags as written)."""
    if len(args) <= index:
        return "", ""
    flags = string_literal(args[index], "the regular expression flags")
    inline = "".join(sorted(set(flags) - {"g"}))
    bad = set(inline) - set(allowed)
    if bad:
        raise Unfaithful(f"regular expression flag(s) '{''.join(sorted(bad))}' have no Spark equivalent")
    return (f"(?{inline})" if inline else ""), flags


def _with_prefix(prefix: str, pattern: exp.Expression) -> exp.Expression:
    if not prefix:
        return pattern
    if isinstance(pattern, exp.Literal) and pattern.is_string:
        return lit(prefix + str(pattern.this))
    return call("concat", lit(prefix), pattern)


def _regexp_like(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    prefix, _ = _regex_flags(args, 2)
    return call("regexp_like", args[0], _with_prefix(prefix, args[1]))


def _regexp_replace(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion replaces the first match unless flags hold 'g'; Spark replaces every match. The
    # first match alone is reached by anchoring a lazy prefix group in front of the pattern.
    prefix, flags = _regex_flags(args, 3)
    text, pattern, replacement = args[0], args[1], args[2]
    repl = string_literal(replacement, "regexp_replace's replacement")
    if "g" in flags:
        return call("regexp_replace", text, _with_prefix(prefix, pattern), lit(java_replacement(repl, 0)))
    first = _with_prefix(prefix + "^(?s:(.*?))(?:", pattern)
    first = lit(str(first.this) + ")") if isinstance(first, exp.Literal) else call("concat", first, lit(")"))
    return call("regexp_replace", text, first, lit("$1" + java_replacement(repl, 1)))


def _regexp_match(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion: the first match's capture groups as a list (the whole match when the pattern has
    # none), NULL without a match.
    prefix, _ = _regex_flags(args, 2)
    pattern_text = string_literal(args[1], "regexp_match's pattern")
    pattern = lit(prefix + pattern_text)
    groups = len(re.findall(r"(?<!\\)\((?!\?)", pattern_text))
    parts = [call("regexp_extract", args[0].copy(), pattern.copy(), num(g))
             for g in (range(1, groups + 1) if groups else [0])]
    return exp.If(this=call("regexp_like", args[0], pattern), true=call("array", *parts), false=exp.Null())


def _array_position(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    if len(args) == 3:
        raise Unfaithful("array_position with a start index has no Spark equivalent")
    # Spark answers 0 when absent, DataFusion NULL.
    return exp.Nullif(this=call("array_position", args[0], args[1]), expression=num(0))


def _array_slice(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    if len(args) == 4:
        raise Unfaithful("array_slice with a stride has no Spark equivalent")
    start, end = args[1], args[2]
    length = exp.Add(this=exp.Sub(this=end, expression=start.copy()), expression=num(1))
    return call("slice", args[0], start, call("greatest", length, num(0)))


def _array_sort(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    order = string_literal(args[1], "array_sort's order").upper() if len(args) > 1 else "ASC"
    if len(args) > 2 or order not in {"ASC", "DESC"}:
        raise Unfaithful("array_sort takes ASC or DESC (null ordering cannot be chosen on Spark)")
    # DataFusion sorts NULLs first ascending and last descending, as sort_array does.
    return call("sort_array", args[0], exp.Boolean(this=order == "ASC"))


def _string_to_array(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    if len(args) == 3:
        raise Unfaithful("string_to_array with a null string has no Spark equivalent")
    delimiter = string_literal(args[1], "string_to_array's delimiter")
    pattern = re.escape(delimiter) if delimiter else "(?!^)(?!$)"
    return call("split", args[0], lit(pattern), num(-1))


def _struct(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion names the fields c0, c1, …; Spark would name them after the arguments.
    pairs: list[exp.Expression] = []
    for i, arg in enumerate(args):
        pairs += [lit(f"c{i}"), arg]
    return call("named_struct", *pairs)


# Arrow type names (as arrow_cast takes them) ↔ Spark types
ARROW_TYPES: dict[str, str] = {
    "Int8": "tinyint", "Int16": "smallint", "Int32": "int", "Int64": "bigint",
    "UInt8": "smallint", "UInt16": "int", "UInt32": "bigint", "UInt64": "decimal(20,0)",
    "Float32": "float", "Float64": "double", "Boolean": "boolean",
    "Utf8": "string", "LargeUtf8": "string", "Utf8View": "string",
    "Binary": "binary", "LargeBinary": "binary", "BinaryView": "binary", "Date32": "date",
    "Timestamp(Microsecond, None)": "timestamp", "Timestamp(µs)": "timestamp",
}
_SPARK_TO_ARROW = {"tinyint": "Int8", "smallint": "Int16", "int": "Int32", "bigint": "Int64",
                   "float": "Float32", "double": "Float64", "boolean": "Boolean", "string": "Utf8",
                   "binary": "Binary", "date": "Date32", "void": "Null"}


def _arrow_cast(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    name = string_literal(args[1], "arrow_cast's type")
    decimal = re.fullmatch(r"Decimal(?:128|256)\((\d+),\s*(\d+)\)", name)
    if decimal:
        return cast(args[0], f"decimal({decimal.group(1)},{decimal.group(2)})")
    if name not in ARROW_TYPES:
        raise Unfaithful(f"arrow_cast to '{name}' has no Spark equivalent; "
                         f"use one of {', '.join(sorted(ARROW_TYPES))} or Decimal128(p, s)")
    return cast(args[0], ARROW_TYPES[name])


def _arrow_typeof(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    spark_type = call("typeof", args[0])
    ifs = [exp.If(this=exp.EQ(this=spark_type.copy(), expression=lit(s)), true=lit(a))
           for s, a in _SPARK_TO_ARROW.items()]
    return exp.Case(ifs=ifs, default=call("concat", lit("Spark "), spark_type))


def _unnest(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return call("explode", args[0])


def _empty(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return exp.EQ(this=call("array_size", args[0]), expression=num(0))


def _array_has_all(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return exp.EQ(this=call("array_size", call("array_except", args[1], args[0])), expression=num(0))


def _now(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    return exp.CurrentTimestamp()


def _power(args: list[exp.Expression], type_of: TypeOf) -> exp.Expression:
    # DataFusion keeps integers integral (power(2, 10) = 1024 as Int64); Spark's pow is a double.
    if type_of(args[0]) in INTEGRAL and type_of(args[1]) in INTEGRAL:
        return cast(call("power", args[0], args[1]), "bigint")
    return call("power", args[0], args[1])


def _from_unixtime(args: list[exp.Expression], _t: TypeOf) -> exp.Expression:
    # DataFusion returns a timestamp; Spark's from_unixtime formats text.
    if len(args) == 2:
        raise Unfaithful("from_unixtime with a time zone has no Spark equivalent; timestamps are UTC instants, "
                         "write from_unixtime(x)")
    return call("timestamp_seconds", args[0])


BUILDERS: dict[str, Builtin] = {
    "concat": Builtin(1, None, _concat),
    "ltrim": Builtin(1, 2, _trim_side("LEADING")),
    "rtrim": Builtin(1, 2, _trim_side("TRAILING")),
    "substr": Builtin(2, 3, _substr),
    "substring": Builtin(2, 3, _substr),
    "strpos": Builtin(2, 2, _renamed("instr")),
    "substr_index": Builtin(3, 3, _renamed("substring_index")),
    "left": Builtin(2, 2, _left),
    "right": Builtin(2, 2, _right),
    "instr": Builtin(2, 2, _renamed("instr")),
    "starts_with": Builtin(2, 2, _renamed("startswith")),
    "startswith": Builtin(2, 2, _renamed("startswith")),
    "ends_with": Builtin(2, 2, _renamed("endswith")),
    "endswith": Builtin(2, 2, _renamed("endswith")),
    "lowercase": Builtin(1, 1, _renamed("lower")),
    "uppercase": Builtin(1, 1, _renamed("upper")),
    "charlength": Builtin(1, 1, _renamed("char_length")),
    "to_hex": Builtin(1, 1, _hex),
    "hex": Builtin(1, 1, _hex),
    "sha224": Builtin(1, 1, _sha(224)),
    "sha256": Builtin(1, 1, _sha(256)),
    "sha384": Builtin(1, 1, _sha(384)),
    "sha512": Builtin(1, 1, _sha(512)),
    "digest": Builtin(2, 2, _digest),
    "random": Builtin(0, 0, _renamed("rand")),
    "log": Builtin(1, 2, _log),
    "log10": Builtin(1, 1, lambda a, _t: _float_log("log10", a[0])),
    "log2": Builtin(1, 1, lambda a, _t: _float_log("log2", a[0])),
    "ln": Builtin(1, 1, lambda a, _t: _float_log("ln", a[0])),
    "power": Builtin(2, 2, _power),
    "pow": Builtin(2, 2, _power),
    "trunc": Builtin(1, 2, _trunc),
    "now": Builtin(0, 0, _now),
    "current_timestamp": Builtin(0, 0, _now),
    "today": Builtin(0, 0, _renamed("current_date")),
    "datetrunc": Builtin(2, 2, _renamed("date_trunc")),
    "date_part": Builtin(2, 2, _date_part),
    "datepart": Builtin(2, 2, _date_part),
    "to_timestamp": Builtin(1, None, _to_timestamp),
    "to_timestamp_seconds": Builtin(1, None, _timestamp_kind("SECOND", lambda v: call("timestamp_seconds", v))),
    "to_timestamp_millis": Builtin(1, None, _timestamp_kind("MILLISECOND", lambda v: call("timestamp_millis", v))),
    "to_timestamp_micros": Builtin(1, None, _timestamp_kind("MICROSECOND", lambda v: call("timestamp_micros", v))),
    "to_timestamp_nanos": Builtin(1, None, _timestamp_kind(
        "NANOSECOND", lambda v: call("timestamp_micros", exp.IntDiv(this=v, expression=num(1000))))),
    "to_date": Builtin(1, None, _to_date),
    "to_unixtime": Builtin(1, None, _to_unixtime),
    "from_unixtime": Builtin(1, 2, _from_unixtime),
    "to_char": Builtin(2, 2, _to_char),
    "date_format": Builtin(2, 2, _to_char),
    "regexp_like": Builtin(2, 3, _regexp_like),
    "regexp": Builtin(2, 3, _regexp_like),
    "similar": Builtin(2, 3, _regexp_like),
    "regexp_match": Builtin(2, 3, _regexp_match),
    "regexp_replace": Builtin(3, 4, _regexp_replace),
    "make_array": Builtin(0, None, _renamed("array")),
    "make_list": Builtin(0, None, _renamed("array")),
    "array": Builtin(0, None, _renamed("array")),
    "array_length": Builtin(1, 1, _renamed("array_size")),
    "array_has": Builtin(2, 2, _renamed("array_contains")),
    "list_has": Builtin(2, 2, _renamed("array_contains")),
    "array_contains": Builtin(2, 2, _renamed("array_contains")),
    "array_has_any": Builtin(2, 2, _renamed("arrays_overlap")),
    "array_has_all": Builtin(2, 2, _array_has_all),
    "array_element": Builtin(2, 2, _renamed("try_element_at")),
    "array_extract": Builtin(2, 2, _renamed("try_element_at")),
    "list_element": Builtin(2, 2, _renamed("try_element_at")),
    "array_position": Builtin(2, 3, _array_position),
    "array_slice": Builtin(3, 4, _array_slice),
    "array_prepend": Builtin(2, 2, lambda a, _t: call("array_prepend", a[1], a[0])),
    "array_concat": Builtin(1, None, _renamed("concat")),
    "array_cat": Builtin(1, None, _renamed("concat")),
    "array_remove_all": Builtin(2, 2, _renamed("array_remove")),
    "array_reverse": Builtin(1, 1, _renamed("reverse")),
    "array_sort": Builtin(1, 3, _array_sort),
    "array_to_string": Builtin(2, 3, _renamed("array_join")),
    "array_join": Builtin(2, 3, _renamed("array_join")),
    "string_to_array": Builtin(2, 3, _string_to_array),
    "empty": Builtin(1, 1, _empty),
    "array_empty": Builtin(1, 1, _empty),
    "struct": Builtin(1, None, _struct),
    "arrow_cast": Builtin(2, 2, _arrow_cast),
    "arrow_typeof": Builtin(1, 1, _arrow_typeof),
    "unnest": Builtin(1, 1, _unnest),
}
for _name, (_lo, _hi) in SAME_IN_SPARK.items():
    BUILDERS.setdefault(_name, Builtin(_lo, _hi, _renamed(_name)))


#: DataFusion functions with no faithful Spark translation → what to write instead
NOT_FAITHFUL: dict[str, str] = {
    "array_remove": "DataFusion's array_remove drops only the first match and Spark has no equivalent; "
                    "array_remove_all(array, value) drops every match",
    "date_bin": "date_bin has no Spark equivalent; use date_trunc(unit, ts)",
    "current_time": "a time-of-day type is not enabled on Spark here; use date_format(now(), 'HH:mm:ss.SSSSSS') "
                    "for text, or now() for a timestamp",
    "chr": "Spark's chr wraps code points modulo 256; write the character as a string literal",
    "encode": "encode's base64 and hex output differ on Spark; use to_hex or _gs_byte_to_hex",
    "decode": "decode's base64 and hex input differ on Spark; use _gs_hex_to_byte",
    "blake2b": "blake2b has no Spark equivalent", "blake2s": "blake2s has no Spark equivalent",
    "blake3": "blake3 has no Spark equivalent; use sha256 or _gs_xxhash",
    "make_map": "maps are not supported in transforms; use named_struct",
    "map": "maps are not supported in transforms; use named_struct",
    "range": "range (a table function) has no streaming equivalent; use _gs_generate_series",
    "generate_series": "generate_series (a table function) has no streaming equivalent; use _gs_generate_series",
    "overlay": "overlay is not supported; combine substr and concat",
    "initcap": "DataFusion starts a word after any non-alphanumeric character, Spark's initcap only after "
               "white space; write upper(left(s, 1)) || lower(substr(s, 2)) for a single word",
    "array_distinct": ("array_distinct's output order is not guaranteed to match on Spark; "
                                  "deduplicate with a sink primary key instead"),
}


