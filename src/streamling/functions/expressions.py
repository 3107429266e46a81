"""Rewrites of Streamling SQL functions into Spark built-ins (sqlglot trees, Spark dialect).

These run in the JVM at Spark speed, so they are preferred wherever a composition of Spark
built-ins has exactly Streamling's semantics. Templates are written as Spark SQL with ``_a0``,
``_a1``… standing for the call's arguments; lambda variables use a ``__gs_`` prefix so they cannot
capture a user column. Some functions need an argument to be a constant (a struct field name, a
list Streamling reads from the first row only): they raise a user error when it is not, rather
than give rows that differ from Streamling's.

No pyspark here: validation imports this module without a JVM.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache

import sqlglot
from sqlglot import exp

from streamling.spec.sql_calls import Unfaithful

Args = Sequence[exp.Expression]
Rewrite = Callable[[list[exp.Expression]], exp.Expression]

_PLACEHOLDER = re.compile(r"^_a(\d+)$")


@cache
def _parsed(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="spark")


def render(sql: str, args: Args) -> exp.Expression:
    """``sql`` with each ``_aN`` column replaced by a copy of ``args[N]``."""

    def substitute(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table:
            match = _PLACEHOLDER.match(node.name)
            if match:
                return args[int(match.group(1))].copy()
        return node

    return _parsed(sql).copy().transform(substitute)


def template(sql: str) -> Rewrite:
    """A rewrite that fills ``sql``'s placeholders with the call's arguments."""
    return lambda args: render(sql, args)


def call(name: str, args: Args) -> exp.Expression:
    """``name(args…)`` as an anonymous call (kept verbatim by the Spark generator)."""
    return exp.Anonymous(this=name, expressions=[a.copy() for a in args])


def string_literal(arg: exp.Expression) -> str | None:
    """The text of a string literal argument, else None."""
    if isinstance(arg, exp.Literal) and arg.is_string:
        return str(arg.this)
    return None


def is_null(arg: exp.Expression) -> bool:
    return isinstance(arg, exp.Null)


def is_constant(arg: exp.Expression) -> bool:
    """No column reference inside: the same value on every row."""
    return not any(True for _ in arg.find_all(exp.Column))


def user_error(function: str, message: str, hint: str | None = None) -> Unfaithful:
    """A call that cannot be translated as written: the translator reports it as a validation
    problem of the query, with what to write instead."""
    return Unfaithful(f"{message} ({hint})" if hint else message)


def java_regex_quote(text: str) -> str:
    """``text`` as a Java regex matching itself: every metacharacter escaped (a backslash before a
    non-letter is always a literal in Java)."""
    return "".join("\\" + c if c in _JAVA_REGEX_META else c for c in text)


_JAVA_REGEX_META = frozenset("\\.[]{}()<>*+-=!?^$|&")


def quoted_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def struct_field_name(function: str, arg: exp.Expression) -> str:
    """Spark resolves ``x.field`` at analysis time: the name must be a non-null string literal."""
    name = string_literal(arg)
    if name is None:
        raise user_error(function, "the field name must be a string literal such as 'name'")
    return name


# --- _gs_* ----------------------------------------------------------------------------------

#: Rust ``str::split("")`` yields an empty token, each character, then an empty token.
_CHARS = "regexp_extract_all(_a0, '(?s).', 0)"
_QUOTE_COLUMN = "concat('\\\\Q', replace(_a1, '\\\\E', '\\\\E\\\\\\\\E\\\\Q'), '\\\\E')"


def split_string_to_array(args: list[exp.Expression]) -> exp.Expression:
    """Literal separator (default and NULL: a space), every token kept."""
    text = args[0]
    sep = args[1] if len(args) > 1 else exp.Literal.string(" ")
    literal = " " if is_null(sep) else string_literal(sep)
    if literal == "":
        return render(f"concat(array(''), {_CHARS}, array(''))", [text])
    if literal is not None:
        return render("split(_a0, _a1, -1)", [text, exp.Literal.string(java_regex_quote(literal))])
    sep = exp.Coalesce(this=sep.copy(), expressions=[exp.Literal.string(" ")])
    return render(f"CASE WHEN _a1 = '' THEN concat(array(''), {_CHARS}, array('')) "
                  f"ELSE split(_a0, {_QUOTE_COLUMN}, -1) END", [text, sep])


def generate_series(args: list[exp.Expression]) -> exp.Expression:
    """Inclusive; a step in the wrong direction gives []; step 0 (NULL means 1) is an error."""
    step = args[2] if len(args) > 2 else exp.Literal.number(1)
    return render(
        "CASE WHEN _a0 IS NULL OR _a1 IS NULL THEN CAST(NULL AS ARRAY<BIGINT>) "
        "WHEN coalesce(_a2, 1) = 0 THEN raise_error('Step size cannot be 0 in _gs_generate_series!') "
        "WHEN (coalesce(_a2, 1) > 0 AND _a0 <= _a1) OR (coalesce(_a2, 1) < 0 AND _a0 >= _a1) "
        "THEN sequence(CAST(_a0 AS BIGINT), CAST(_a1 AS BIGINT), CAST(coalesce(_a2, 1) AS BIGINT)) "
        "ELSE CAST(array() AS ARRAY<BIGINT>) END", [args[0], args[1], step])


def zip_arrays(args: list[exp.Expression]) -> exp.Expression:
    """List<Struct<f0, f1, …>>; a NULL list gives [], lists of different lengths are an error."""
    n = len(args)
    fields = ", ".join(f"'f{i}', " + ("__gs_x" if i == 0 else f"get(_a{i}, __gs_i)") for i in range(n))
    zipped = f"transform(coalesce(_a0, array()), (__gs_x, __gs_i) -> named_struct({fields}))"
    any_null = " OR ".join(f"_a{i} IS NULL" for i in range(n))
    unequal = " OR ".join(f"size(_a{i}) <> size(_a0)" for i in range(1, n))
    return render(
        f"CASE WHEN {any_null} THEN filter({zipped}, __gs_z -> false) "
        f"WHEN {unequal} THEN raise_error('Arrays must have the same length when using _gs_zip_arrays!') "
        f"ELSE {zipped} END", args)


def array_enumerate(args: list[exp.Expression]) -> exp.Expression:
    return render("transform(_a0, (__gs_x, __gs_i) -> named_struct('index', CAST(__gs_i AS BIGINT), 'value', __gs_x))",
                  args)


def _field_matches(function: str, args: list[exp.Expression]) -> str:
    field = quoted_identifier(struct_field_name(function, args[1]))
    # NULL value matches NULL fields; NULL elements never match (Streamling's array_filter).
    return f"filter(_a0, __gs_x -> __gs_x IS NOT NULL AND __gs_x.{field} <=> _a2)"


def array_filter(args: list[exp.Expression]) -> exp.Expression:
    return render(_field_matches("array_filter", args), args)


def array_filter_first(args: list[exp.Expression]) -> exp.Expression:
    return render(f"get({_field_matches('array_filter_first', args)}, 0)", args)


def array_filter_in(args: list[exp.Expression]) -> exp.Expression:
    field = quoted_identifier(struct_field_name("array_filter_in", args[1]))
    if not is_constant(args[2]):
        raise user_error("array_filter_in", "the list of values must be a constant such as array('a', 'b')",
                         hint="Streamling reads this list from the first row of each batch only")
    return render(f"filter(_a0, __gs_x -> __gs_x IS NOT NULL AND array_contains(_a2, __gs_x.{field}))", args)


def array_struct_field(args: list[exp.Expression]) -> exp.Expression:
    field = quoted_identifier(struct_field_name("array_struct_field", args[1]))
    return render(f"transform(_a0, __gs_x -> __gs_x.{field})", args)


def identity(args: list[exp.Expression]) -> exp.Expression:
    return args[0].copy()


byte_to_hex = template("lower(hex(_a0))")
#: Hex with an optional ``0x``/``0X``; odd length, a non-hex character or NULL give empty bytes.
hex_to_byte = template(
    "CASE WHEN _a0 RLIKE '^(0[xX])?([0-9a-fA-F][0-9a-fA-F])*\\\\z' "
    "THEN unhex(regexp_replace(_a0, '^0[xX]', '')) ELSE X'' END")
reverse_bytes = template(
    "CASE WHEN _a0 IS NULL THEN NULL ELSE unhex(concat_ws('', reverse(regexp_extract_all(hex(_a0), '(..)', 1)))) END")
map_to_array_struct = template("map_entries(_a0)")
#: Any value as JSON: Spark's ``to_json`` serialises arrays, so serialise a one-element array.
json_string = template(
    "CASE WHEN _a0 IS NULL THEN CAST(NULL AS STRING) "
    "ELSE regexp_extract(to_json(array(_a0)), '(?s)^\\\\[(.*)\\\\]$', 1) END")


def coalesce(args: list[exp.Expression]) -> exp.Expression:
    return exp.Coalesce(this=args[0].copy(), expressions=[a.copy() for a in args[1:]])


def json_objects_to_clickhouse_tuples(udf_name: str) -> Rewrite:
    def rewrite(args: list[exp.Expression]) -> exp.Expression:
        if not is_constant(args[1]):
            raise user_error("_gs_json_objects_to_clickhouse_tuples",
                             "the list of keys must be a constant such as array('a', 'b')",
                             hint="Streamling reads the keys from the first row of each batch only")
        return call(udf_name, args)
    return rewrite


# --- Flink-compatible string functions -------------------------------------------------------

def regexp_extract_all(args: list[exp.Expression]) -> exp.Expression:
    group = args[2] if len(args) > 2 else exp.Literal.number(1)
    return render("regexp_extract_all(_a0, _a1, _a2)", [args[0], args[1], group])


def regexp_replace(args: list[exp.Expression]) -> exp.Expression:
    """Every match replaced by ``r`` taken literally: ``$`` and ``\\`` in it are escaped for Java."""
    literal = string_literal(args[2])
    if literal is not None:
        quoted = literal.replace("\\", "\\\\").replace("$", "\\$")
        return render("regexp_replace(_a0, _a1, _a2)", [args[0], args[1], exp.Literal.string(quoted)])
    return render("regexp_replace(_a0, _a1, regexp_replace(_a2, '([\\\\\\\\$])', '\\\\\\\\$1'))", args)


def locate(args: list[exp.Expression]) -> exp.Expression:
    if len(args) == 2:
        return render("locate(_a0, _a1)", args)
    # Spark's locate gives 0 for a NULL start; Flink gives NULL.
    return render("CASE WHEN _a2 IS NULL THEN CAST(NULL AS INT) ELSE locate(_a0, _a1, _a2) END", args)


def instr(udf_name: str) -> Rewrite:
    def rewrite(args: list[exp.Expression]) -> exp.Expression:
        if len(args) == 2:
            return render("locate(_a1, _a0)", args)
        return call(udf_name, args)
    return rewrite


def elt(args: list[exp.Expression]) -> exp.Expression:
    """Out-of-range index gives NULL (Spark's ANSI mode would fail the query)."""
    n = len(args) - 1
    values = ", ".join(f"_a{i}" for i in range(1, n + 1))
    return render(f"CASE WHEN _a0 BETWEEN 1 AND {n} THEN elt(_a0, {values}) END", args)


def split(args: list[exp.Expression]) -> exp.Expression:
    """Literal delimiter, empty tokens kept, an empty delimiter splits into characters."""
    literal = string_literal(args[1])
    if literal == "":
        return render(_CHARS, args)
    if literal is not None:
        return render("split(_a0, _a1, -1)", [args[0], exp.Literal.string(java_regex_quote(literal))])
    return render(f"CASE WHEN _a1 = '' THEN {_CHARS} ELSE split(_a0, {_QUOTE_COLUMN}, -1) END", args)


def split_index(args: list[exp.Expression]) -> exp.Expression:
    return render("get(_a0, _a1)", [split(args[:2]), args[2]])


# --- aliases ----------------------------------------------------------------------------------

def renamed(spark_name: str) -> Rewrite:
    """Same semantics as the Spark built-in ``spark_name``."""
    return lambda args: call(spark_name, args)


def udf_or_constant(udf_name: str, empty: str) -> Rewrite:
    """A variadic udf call; without arguments the constant ``empty`` (an Arrow UDF needs a column
    to know its batch's length)."""
    return lambda args: call(udf_name, args) if args else exp.Literal.string(empty)


def cast_udf(udf_name: str, returning: Callable[[list[exp.Expression]], str | None]) -> Rewrite:
    """A udf call, cast to the SQL type a literal argument names (``RETURNING``)."""
    def rewrite(args: list[exp.Expression]) -> exp.Expression:
        kind = returning(args)
        result = call(udf_name, args)
        if kind is None:
            return result
        try:
            target = exp.DataType.build(kind, dialect="spark")
        except (sqlglot.errors.ParseError, ValueError) as exc:
            raise user_error("", f"RETURNING {kind!r} is not a SQL type") from exc
        return exp.cast(result, target)
    return rewrite
