"""Streamling's SQL as DataFusion reads it, for sqlglot.

sqlglot has no DataFusion dialect. DataFusion's parser is close to PostgreSQL's (``"x"`` is an
identifier, ``'x'`` a string, ``::`` casts, unquoted names fold to lower case), so the dialect
builds on sqlglot's Postgres one with the differences that change results:

* backticks also quote identifiers (DataFusion's generic dialect accepts both);
* ``FLOAT`` is a 32-bit float, ``regexp`` a function name;
* ``^`` is bitwise XOR, not power;
* array subscripts stay as written (1-based), the translator turns them into ``try_element_at``;
* function calls are *not* turned into sqlglot's typed function nodes (whose Spark output encodes
  other engines' semantics): every call stays a plain call, and ``sql_functions`` maps each
  DataFusion name to a faithful Spark expression. Only aggregates keep their typed nodes, so
  validation can recognise and reject them, and the few calls with special syntax (``CAST``,
  ``EXTRACT``, ``SUBSTRING … FROM``, ``POSITION … IN``, ``TRIM(BOTH …)``) keep their parsers.
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.tokens import TokenType

_SPECIAL_SYNTAX = {"CAST", "TRY_CAST", "EXTRACT", "POSITION", "SUBSTRING", "TRIM"}


def _aggregate_builders() -> dict[str, Any]:
    """Postgres' builders of aggregate functions only (``count``, ``sum``, …)."""
    out: dict[str, Any] = {}
    for name, builder in Postgres.Parser.FUNCTIONS.items():
        cls = getattr(builder, "__self__", None)
        if isinstance(cls, type) and issubclass(cls, exp.AggFunc):
            out[name] = builder
    for cls in exp.ALL_FUNCTIONS:
        if issubclass(cls, exp.AggFunc):
            for name in cls.sql_names():
                out.setdefault(name, cls.from_arg_list)
    return out


class DataFusion(Postgres):
    """DataFusion's SQL surface as far as Streamling users write it."""

    INDEX_OFFSET = 0

    class Tokenizer(Postgres.Tokenizer):
        IDENTIFIERS = ['"', "`"]
        # ``regexp`` is a function (an alias of regexp_like), not MySQL's infix operator
        KEYWORDS = {k: v for k, v in Postgres.Tokenizer.KEYWORDS.items() if k != "REGEXP"}
        KEYWORDS["FLOAT"] = TokenType.FLOAT  # DataFusion's FLOAT is 32-bit (PostgreSQL's is double)

    class Parser(Postgres.Parser):
        FUNCTIONS = _aggregate_builders()
        FUNCTION_PARSERS = {k: v for k, v in Postgres.Parser.FUNCTION_PARSERS.items() if k in _SPECIAL_SYNTAX}
        EXPONENT = {k: v for k, v in Postgres.Parser.EXPONENT.items() if k != TokenType.CARET}
        FACTOR = {**Postgres.Parser.FACTOR, TokenType.CARET: exp.BitwiseXor}
