"""``blackhole`` sink: evaluates the batch fully and discards it (benchmarks, dry plumbing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.runtime.nodes import Epoch, Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class BlackholeSink(Sink):
    # The flow counts what it gives the sink (usually for free: the count of the node it reads),
    # so the write is Spark's no-op writer alone, as a hand-written job would do it.
    counts_rows = False
    reads_once = True

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        # Spark's no-op writer runs the whole plan (every column, every row) without storing.
        df.write.format("noop").mode("overwrite").save()
        return 0
