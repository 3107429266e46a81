"""``blackhole`` sink: evaluates the batch fully and discards it (benchmarks, dry plumbing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.runtime.nodes import Epoch, Sink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class BlackholeSink(Sink):
    def write(self, df: DataFrame, epoch: Epoch) -> int:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        # Spark's no-op writer runs the whole plan (every column, every row) without storing;
        # the observation counts rows on the way through, in the same job.
        obs = Observation(f"blackhole_{self.name}_{epoch.epoch_id}")
        df.observe(obs, F.count(F.lit(1)).alias("rows")).write.format("noop").mode("overwrite").save()
        return int(obs.get["rows"])
