"""A sink plugin: each epoch written from the executors, one instance per partition.

``parallelism`` sets the number of writers; rows are hashed by the primary key, so one key's ops
reach one instance in their order. An instance gets its partition's batches (``_gs_op`` included),
then ``on_epoch_flushed``; the epoch counts as written once every partition returned, and only then
does the flow let Spark commit it. A replayed epoch keeps its id and partitioning, so a plugin that
records ``(epoch_id, partition)`` with its writes can skip what it already wrote. ``open`` and
``on_epoch_finalized`` run on a driver-side instance.

Executor-side instances live across epochs: the Python worker that wrote a partition keeps its
instance (``plugins.instances.EXECUTOR_SINKS``, keyed by the node's job, the partition and the
epoch's sink token), and the next epoch's task for that partition in that worker writes with it
instead of constructing another. An instance whose ``write_batch`` or ``on_epoch_flushed`` raised
(or whose task stopped half-way) is closed and never reused: the retry or replay gets a fresh one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from streamling.plugins.api import PluginEpoch, SinkPlugin
from streamling.plugins.host import PluginJob, node_job
from streamling.plugins.instances import EXECUTOR_SINKS
from streamling.runtime.nodes import Epoch, NodeContext, Sink
from streamling.spec.nodes import PluginNodeOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession


def _write(job: PluginJob, epoch: Epoch, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    from pyspark import TaskContext

    task = TaskContext.get()
    partition = task.partitionId() if task else -1
    at = PluginEpoch(epoch.epoch_id, partition=partition, sink_token=epoch.sink_token)
    rows = 0
    # kept for this worker's next epoch of the partition only once the epoch is flushed; closed
    # and dropped when anything before that raises
    with EXECUTOR_SINKS.lease(job.instance_family(partition), epoch.sink_token,
                              lambda: job.create("executor", partition)) as plugin:
        for batch in batches:
            if batch.num_rows:
                job.on_executor("write_batch()", lambda b=batch: plugin.write_batch(b, at))
                rows += batch.num_rows
        job.on_executor("on_epoch_flushed()", lambda: plugin.on_epoch_flushed(at))
    yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


class PluginSink(Sink[PluginNodeOptions]):
    #: written from the executors: ``parallelism`` sets how many instances write at once
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"parallelism"})
    # One job reads the batch once, and ``write`` returns every row it handed to the instances: the
    # flow needs no observation of this sink's input (it would cost every row a little).
    reads_once = True
    counts_received = True

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._driver: SinkPlugin[Any] | None = None
        self._jobs: dict[str, PluginJob] = {}

    def job(self, df: DataFrame | None = None) -> PluginJob:
        """The node's job for ``df``'s schema (the planned input schema without one), built once per schema."""
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = df.schema if df is not None else self.ctx.input_schema
        key = schema.json() if schema is not None else ""
        if key not in self._jobs:
            job = node_job("sink", self.ctx.spec.type, self.name, self.options.plugin_options, self.ctx.primary_key,
                           self.ctx.settings)
            if schema is not None:
                job.input_schema = to_arrow_schema(schema, timezone="UTC")
            self._jobs[key] = job
        return self._jobs[key]

    def _driver_plugin(self) -> SinkPlugin[Any]:
        if self._driver is None:
            plugin = self.job().create("driver")
            assert isinstance(plugin, SinkPlugin)
            self._driver = plugin
        return self._driver

    def open(self, spark: SparkSession) -> None:
        plugin = self._driver_plugin()
        self.job().call("open()", plugin.open)

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        job = self.job(df)
        counts = df.mapInArrow(lambda batches: _write(job, epoch, batches), "rows bigint").collect()
        return sum(int(row[0]) for row in counts)

    def on_finalized(self, epoch: Epoch) -> None:
        plugin = self._driver_plugin()
        at = PluginEpoch(epoch.epoch_id, sink_token=epoch.sink_token)
        self.job().call("on_epoch_finalized()", lambda: plugin.on_epoch_finalized(at))

    def close(self) -> None:
        if self._driver is not None:
            self.job().call("close()", self._driver.close)
            self._driver = None
