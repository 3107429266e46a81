"""Built-in ``generate`` source: deterministic rows for demos, tests and benchmarks.

Row ``i`` is a pure function of ``(seed, i)``, so a replayed epoch yields the very same rows and
a rerun can be compared with the last one. Offsets are row indexes kept by Spark's checkpoint;
the reader derives "latest" from its ``start`` argument (and the clock, when rate-limited), never
from process memory, so a restart resumes exactly where the checkpoint says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.runtime.nodes import NodeContext, Source
from streamling.sources.generate_rows import (
    BASE_TS_US,
    COUNTRIES,
    CUSTOMERS,
    FORMAT,
    SCHEMAS,
    _data_source_class,
    generate_batch,
    register_generate,
)
from streamling.spec.nodes import GenerateSourceOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BASE_TS_US", "COUNTRIES", "CUSTOMERS", "FORMAT", "SCHEMAS", "GenerateSource", "_data_source_class",
           "generate_batch", "register_generate"]


class GenerateSource(Source[GenerateSourceOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.bounded = self.options.rows is not None

    def read_stream(self, spark: SparkSession) -> DataFrame:
        register_generate(spark)
        o = self.options
        reader = spark.readStream.format(FORMAT)
        for key in ("rows", "rows_per_second", "rows_per_batch", "partitions", "seed", "start_id", "profile"):
            value = getattr(o, key)
            if value is not None:
                reader = reader.option(key, str(value))
        return reader.load()
