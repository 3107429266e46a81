"""Streamling's own SQL functions (the ``_gs_*`` family, ``uuid7``, Flink-compatible helpers) on Spark.

Each function is either an **expression**: a rewrite of the call into Spark built-ins (sqlglot
trees, Spark dialect), so it runs in the JVM at Spark speed; or a **udf**: a vectorised Arrow UDF
registered in the session under ``udf_name``, for what Spark cannot express (hashes, base58, …).
The SQL translator (``streamling.spec.sql``) looks calls up here by lower-cased name, checks their
argument count at validate time and rewrites them; the runtime calls ``register_udfs`` once per
session before any query runs.

This module must not import pyspark at import time: validation runs without a JVM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

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
        if count < self.min_args or (self.max_args is not None and count > self.max_args):
            want = (f"{self.min_args}" if self.max_args == self.min_args
                    else f"{self.min_args} or more" if self.max_args is None
                    else f"{self.min_args} to {self.max_args}")
            return f"{self.name} takes {want} arguments, found {count}"
        return None


def _byte_to_hex(args: list[exp.Expression]) -> exp.Expression:
    return exp.Lower(this=exp.Hex(this=args[0]))


FUNCTIONS: dict[str, SqlFunction] = {
    f.name: f for f in [
        SqlFunction("_gs_byte_to_hex", 1, 1, "binary → lower-case hex text; NULL stays NULL",
                    to_spark=_byte_to_hex),
    ]
}


def lookup(name: str) -> SqlFunction | None:
    """The Streamling function called ``name`` (any case), or None."""
    return FUNCTIONS.get(name.lower())


def register_udfs(spark: SparkSession) -> None:
    """Register every udf-kind function in ``spark`` (idempotent; cheap after the first call)."""
    return None
