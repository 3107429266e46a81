"""What a translation of a DataFusion call into Spark is made of: the builder's contract, Spark
calls and literals, and the error that says a call cannot be translated as written.

Kept apart from the catalogue (``sql_functions``) so that the translator and the pattern helpers
(``sql_patterns``) share them without depending on the catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

#: an argument's Spark type (``bigint``, ``string``, ``timestamp``…) when known, else None
TypeOf = Callable[[exp.Expression], "str | None"]
Build = Callable[[list[exp.Expression], TypeOf], exp.Expression]


class Unfaithful(Exception):
    """A call that cannot be translated as written; the message says what to write instead."""


@dataclass(frozen=True)
class Builtin:
    """A DataFusion function Streamling accepts: how many arguments it takes, and its Spark form."""

    min_args: int
    max_args: int | None
    build: Build

    def arity_problem(self, name: str, count: int) -> str | None:
        want = wanted_args(count, self.min_args, self.max_args)
        return None if want is None else f"{name} takes {want} argument{'' if want == '1' else 's'}, found {count}"


def wanted_args(count: int, min_args: int, max_args: int | None) -> str | None:
    """How many arguments a function takes, in words (``2``, ``1 or more``, ``2 to 3``), when
    ``count`` does not fit; None when it does. Shared by the built-ins and Streamling's own functions."""
    if count < min_args or (max_args is not None and count > max_args):
        return (f"{min_args}" if max_args == min_args
                else f"{min_args} or more" if max_args is None
                else f"{min_args} to {max_args}")
    return None


def call(name: str, *args: exp.Expression) -> exp.Expression:
    """A Spark call by name, generated verbatim (no sqlglot re-interpretation)."""
    return exp.Anonymous(this=name, expressions=list(args))


def lit(value: str) -> exp.Literal:
    return exp.Literal.string(value)


def num(value: int) -> exp.Expression:
    return exp.Literal.number(value)


def cast(arg: exp.Expression, to: str) -> exp.Cast:
    return exp.Cast(this=arg, to=exp.DataType.build(to, dialect="spark"))


def string_literal(arg: exp.Expression, what: str) -> str:
    """The text of a string literal argument; any other expression cannot be translated."""
    if isinstance(arg, exp.Literal) and arg.is_string:
        return str(arg.this)
    raise Unfaithful(f"{what} must be a string literal")


#: Spark's integral types (DataFusion keeps integer arithmetic integral)
INTEGRAL = {"tinyint", "smallint", "int", "bigint"}
