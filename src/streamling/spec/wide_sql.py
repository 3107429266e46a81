"""What SQL may do with wide decimal columns (exact text beyond Spark's 38 digits).

A wide column (see ``streamling.spec.types``) is canonical decimal text in Spark, so equality is
exact (``=``, ``<>``, ``IN``, ``GROUP BY``, ``DISTINCT``, passing it through, ``coalesce``) but
ordering would compare text and arithmetic would go through ``double``. Rather than answer
wrongly, a transform doing either is rejected at validate time; an explicit ``CAST`` to a decimal
of at most 38 digits is allowed (Spark's ANSI mode fails on a value that does not fit, it never
narrows silently), a cast to a floating-point type is not.

The SQL validator calls ``wide_decimal_problems`` with its parsed tree and the upstream wide
columns (``types.wide_columns`` for a declared schema, ``types.wide_fields`` for a Spark schema).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from streamling.spec.types import SPARK_MAX_PRECISION, ColumnType

_ORDERING: tuple[type[exp.Expression], ...] = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)
_ARITHMETIC: tuple[type[exp.Expression], ...] = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg,
                                                 exp.IntDiv)
_AGGREGATES: tuple[type[exp.Expression], ...] = (exp.Sum, exp.Avg, exp.Min, exp.Max)
_EQUALITY: tuple[type[exp.Expression], ...] = (exp.EQ, exp.NEQ, exp.In)
_FLOATS = {exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE}


def _operands(node: exp.Expression) -> list[exp.Expression]:
    """The direct value operands of an operator (not nested sub-expressions' operands)."""
    if isinstance(node, exp.Ordered):
        return [node.this]
    return [v for v in node.args.values() if isinstance(v, exp.Expression)]


def _wide_column(node: exp.Expression, wide: Mapping[str, ColumnType]) -> tuple[str, ColumnType] | None:
    """The wide column an operand is (through parentheses), if any."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column):
        for name in (node.name, node.name.lower()):  # unquoted names fold to lower case
            if name in wide:
                return name, wide[name]
    return None


def _what(node: exp.Expression) -> str:
    if isinstance(node, _ORDERING):
        return "an ordering comparison on it"
    if isinstance(node, _ARITHMETIC):
        return "arithmetic on it"
    if isinstance(node, _AGGREGATES):
        return f"{type(node).__name__.upper()}() on it"
    if isinstance(node, exp.Ordered):
        return "ORDER BY on it"
    if isinstance(node, _EQUALITY):
        return "comparing it with a number, which Spark does in floating point,"
    return "casting it to a floating-point type"


def _numeric_literal(node: exp.Expression) -> bool:
    while isinstance(node, exp.Paren | exp.Neg):
        node = node.this
    return isinstance(node, exp.Literal) and not node.is_string


def _inexact(node: exp.Expression) -> bool:
    """Whether ``node`` is an operation that is not exact on decimal text."""
    if isinstance(node, exp.Cast):
        return node.to.this in _FLOATS
    if isinstance(node, _EQUALITY):  # text equality is exact; against a number it is not
        sides = [node.this, *node.expressions] if isinstance(node, exp.In) else [node.this, node.expression]
        return any(_numeric_literal(side) for side in sides if side is not None)
    return isinstance(node, (*_ORDERING, *_ARITHMETIC, *_AGGREGATES, exp.Ordered))


def wide_decimal_problems(tree: exp.Expression, wide: Mapping[str, ColumnType]) -> list[str]:
    """One message per inexact use of a wide column in ``tree`` (empty when all uses are exact)."""
    if not wide:
        return []
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for node in tree.walk():
        if not _inexact(node):
            continue
        for operand in _operands(node):
            hit = _wide_column(operand, wide)
            if hit is None:
                continue
            name, kind = hit
            what = _what(node)
            if (name, what) in seen:
                continue
            seen.add((name, what))
            problems.append(
                f"column '{name}' is {kind.name}, wider than Spark's {SPARK_MAX_PRECISION}-digit decimals, and "
                f"is carried as exact decimal text: {what} (`{node.sql(dialect='spark')}`) would not be exact; "
                "only =, <>, IN (with string literals), GROUP BY and DISTINCT are. Compute it in the sink's "
                f"database, or CAST it to DECIMAL(p,s) with p <= {SPARK_MAX_PRECISION} where the values fit (a "
                "value that does not fit fails the epoch)")
    return problems
