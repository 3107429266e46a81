"""``blackhole`` sink: evaluates the batch fully and discards it (benchmarks, dry plumbing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.runtime.nodes import Epoch, Sink
from streamling.runtime.observe import Counted
from streamling.runtime.session import has_native_classes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class BlackholeSink(Sink):
    # One job runs the whole plan (every column of every row) and counts the rows as it discards
    # them, so neither this sink's input nor the node it reads needs an observation of its own.
    reads_once = True
    counts_received = True
    _native: bool | None = None

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        if self._native is None:
            self._native = has_native_classes(df.sparkSession)
        if self._native:
            # streamling's JVM helper: Spark's no-op write and the count in one pass, one py4j call
            jvm = df.sparkSession._jvm
            assert jvm is not None
            return int(jvm.streamling.spark.Drain.count(df._jdf, f"blackhole sink '{self.name}'"))
        counted = Counted()
        counted.on(df).write.format("noop").mode("overwrite").save()
        return counted.rows()
