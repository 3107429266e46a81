"""Built-in ``generate`` source: deterministic rows for demos, tests and benchmarks.

Row ``i`` is a pure function of ``(seed, i)``, so a replayed epoch yields the very same rows and
a rerun can be compared with the last one. Offsets are row indexes kept by Spark's checkpoint;
the reader derives "latest" from its ``start`` argument (and the clock, when rate-limited), never
from process memory, so a restart resumes exactly where the checkpoint says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from streamling.runtime.nodes import NodeContext, Source
from streamling.runtime.session import has_native_classes
from streamling.sources.generate_rows import (
    BASE_TS_US,
    COUNTRIES,
    CUSTOMERS,
    FORMAT,
    SCHEMAS,
    _data_source_class,
    generate_batch,
    generate_exprs,
    register_generate,
)
from streamling.spec.sources import GenerateSourceOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BASE_TS_US", "COUNTRIES", "CUSTOMERS", "FORMAT", "SCHEMAS", "GenerateSource", "_data_source_class",
           "NATIVE_FORMAT", "generate_batch", "generate_exprs", "generate_stream", "register_generate"]


#: The JVM reader of the row indexes (``runtime/java/GenerateSource.java``), passed to ``format()``.
NATIVE_FORMAT = "streamling.spark.GenerateSource"
_OPTION_KEYS = ("rows", "rows_per_second", "rows_per_batch", "partitions", "seed", "start_id", "profile")


def generate_stream(spark: SparkSession, options: Mapping[str, object], native: bool | None = None) -> DataFrame:
    """The ``generate`` source's streaming DataFrame for ``options`` (the node's keys).

    In the JVM when the session has streamling's JVM classes (``runtime.jars.native_jar``): the
    row indexes come from a JVM source and the columns are Spark expressions, so no Python worker
    starts (~3 s of a cold start) and whole-stage code generation covers the read. Otherwise, in the
    Python data source. Both give the same rows, epochs and offsets, so either resumes the other's
    checkpoint. ``native`` chooses one (a comparison); by default the JVM one when it is there."""
    opts = {k: str(options[k]) for k in _OPTION_KEYS if options.get(k) is not None}
    profile = opts.get("profile", "orders")
    if has_native_classes(spark) if native is None else native:
        rows = spark.readStream.format(NATIVE_FORMAT).options(**opts).load()
        seed, start_id = int(opts.get("seed", "0")), int(opts.get("start_id", "0"))
        return rows.selectExpr(*generate_exprs("idx", profile, seed, start_id))
    register_generate(spark)
    return spark.readStream.format(FORMAT).options(**opts).load()


class GenerateSource(Source[GenerateSourceOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.bounded = self.options.rows is not None
        self._frame: tuple[SparkSession, DataFrame] | None = None

    def read_stream(self, spark: SparkSession) -> DataFrame:
        # Analysis and the flow's start both ask (~0.3 s of JVM calls each): a DataFrame is an
        # immutable plan and every query started from it gets a stream of its own.
        if self._frame is None or self._frame[0] is not spark:
            self._frame = (spark, generate_stream(spark, self.options.model_dump()))
        return self._frame[1]
