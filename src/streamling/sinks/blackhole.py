"""``blackhole`` sink: evaluates the batch fully and discards it (benchmarks, dry plumbing)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from streamling.runtime.nodes import Epoch, Sink
from streamling.runtime.observe import Counted
from streamling.runtime.session import has_native_classes
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class BlackholeSinkOptions(FromNodeOptions):
    type: Literal["blackhole"] = "blackhole"


class BlackholeSink(Sink[BlackholeSinkOptions]):
    # One job runs the whole plan (every column of every row) and counts the rows as it discards
    # them, so neither this sink's input nor the node it reads needs an observation of its own.
    reads_once = True
    counts_received = True
    #: whether the session has streamling's JVM classes; None until the first write asks
    _native: bool | None = None
    _drain: Any = None

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        if self._native is None:
            self._native = has_native_classes(df.sparkSession)
            if self._native:  # looked up once: each lookup is four round trips to the JVM
                jvm = df.sparkSession._jvm
                assert jvm is not None
                self._drain = jvm.streamling.spark.Drain
        if self._native:
            # streamling's JVM helper: Spark's no-op write and the count in one pass, one py4j call
            return int(self._drain.count(df._jdf, f"blackhole sink '{self.name}'"))
        counted = Counted()
        counted.on(df).write.format("noop").mode("overwrite").save()
        return counted.rows()
