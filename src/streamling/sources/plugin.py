"""A source plugin as a Spark streaming source.

The plugin's offsets are Spark's: ``latestOffset`` asks the plugin's ``read(start)`` for what
follows ``start`` (in Spark's source runner, where one instance lives for the query) and keeps the
batch until Spark plans it, so the rows are read once; Spark writes the end offset to its
write-ahead log before the epoch runs. After a crash, the epoch in the log is replayed with
``read_between(start, end)`` on an executor, and reading goes on from the last committed offset:
a restart resumes where the last finalized epoch ended, whatever the plugin kept in memory.
The epoch hooks (``on_epoch_flushed``, ``on_epoch_finalized``) run on a driver-side instance.

A source that declares several partitions (``preferred_partitions``) is read in parallel instead:
its offset is the list of its partitions' offsets; the source runner holds one instance per
partition and only plans (``latest_offset``), and each partition that moved is one Spark input
partition, read on an executor by an instance of its own with ``read_between(start, end)``.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from streamling.errors import NodeFailure
from streamling.plugins.api import PluginEpoch, SourcePlugin
from streamling.plugins.host import GS_OP, PluginJob, conform, node_job, offset_json
from streamling.runtime.nodes import Epoch, NodeContext, Source
from streamling.spec.nodes import PluginSourceOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

FORMAT = "streamling_plugin"
#: offsets travel in Spark's log wrapped in a dict: Spark's Python sources need a JSON object
WRAP = "v"


def _arrow_schema(job: PluginJob, plugin: SourcePlugin[Any]) -> pa.Schema:
    """The plugin's schema with ``_gs_op`` (the runtime adds it as inserts when the plugin has none)."""
    import pyarrow as pa

    schema = job.call("output_schema()", plugin.output_schema)
    if not isinstance(schema, pa.Schema):
        raise job.error(f"output_schema() returned {type(schema).__name__}, not a pyarrow.Schema")
    if schema.get_field_index(GS_OP) < 0:
        schema = schema.append(pa.field(GS_OP, pa.string()))
    return schema


def _data_source_class() -> type:
    import pickle

    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class PluginPartition(InputPartition):
        def __init__(self, start: Any, end: Any, data: bytes | None, index: int = -1) -> None:
            super().__init__(None)
            self.start, self.end, self.data, self.index = start, end, data, index

    def read_between(job: PluginJob, schema: pa.Schema, part: Any, partitions: int = 1) -> Iterator[pa.RecordBatch]:
        """``part``'s rows read by an instance of its own on an executor (a replay, or a partition)."""
        plugin: Any = job.create("executor", part.index, partitions=partitions)
        try:
            batch = job.on_executor("read_between()", lambda: plugin.read_between(part.start, part.end))
            if batch is not None:
                yield job.on_executor("read_between()", lambda: conform(job, batch, schema, "read_between()"))
        finally:
            job.on_executor("close()", plugin.close)

    class PluginStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, job: PluginJob, schema: pa.Schema) -> None:
            self.job = job
            self.schema = schema
            self.plugin: Any = None
            #: batches read ahead of Spark's plan, by (start, end) offset text
            self.cache: dict[tuple[str, str], bytes] = {}

        def _reader(self) -> Any:
            if self.plugin is None:
                self.plugin = self.job.create("reader")
            return self.plugin

        def initialOffset(self) -> dict[str, Any]:
            plugin = self._reader()
            return {WRAP: self.job.on_executor("initial_offset()", plugin.initial_offset)}

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            plugin = self._reader()
            got = self.job.on_executor("read()", lambda: plugin.read(start[WRAP]))
            if not (isinstance(got, tuple) and len(got) == 2):
                raise NodeFailure.of(self.job.error(
                    f"read() must return (batch or None, end offset), got {type(got).__name__}"))
            batch, end = got
            key = (offset_json(start[WRAP]), offset_json(end))
            if batch is not None:
                batch = conform(self.job, batch, self.schema, "read()")
            if key[0] == key[1]:
                if batch is not None and batch.num_rows:
                    raise NodeFailure.of(self.job.error(f"read() returned {batch.num_rows} rows but did not move the "
                                                        f"offset past {key[0]}; the rows would be read again forever"))
                return start
            sink = pa.BufferOutputStream()
            if batch is not None and batch.num_rows:
                with pa.ipc.new_stream(sink, self.schema) as writer:
                    writer.write_batch(batch)
            self.cache[key] = sink.getvalue().to_pybytes()
            return {WRAP: end}

        def prepareForTriggerAvailableNow(self) -> None:
            """A bounded plugin ends its own stream: ``read`` returns nothing once it is exhausted."""

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
            key = (offset_json(start[WRAP]), offset_json(end[WRAP]))
            return [PluginPartition(start[WRAP], end[WRAP], self.cache.get(key))]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            part: Any = partition
            if part.data is not None:
                if part.data:
                    with pa.ipc.open_stream(part.data) as stream:
                        yield from stream
                return
            # A replay after a restart: the plan's offsets, read again by the plugin.
            yield from read_between(self.job, self.schema, part)

        def commit(self, end: dict[str, Any]) -> None:
            # Spark will not plan anything up to ``end`` again: drop the batches read ahead for it.
            done = offset_json(end[WRAP])
            ends = [k[1] for k in self.cache]
            if done in ends:
                for key in list(self.cache)[:ends.index(done) + 1]:
                    del self.cache[key]

        def stop(self) -> None:
            if self.plugin is not None:
                self.job.on_executor("close()", self.plugin.close)

    class PartitionedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        """Plans each partition's end on the driver; executors read the partitions in parallel."""

        def __init__(self, job: PluginJob, schema: pa.Schema, partitions: int) -> None:
            self.job = job
            self.schema = schema
            self.count = partitions
            self.plugins: list[Any] = []

        def _readers(self) -> list[Any]:
            if not self.plugins:
                self.plugins = [self.job.create("reader", i, partitions=self.count) for i in range(self.count)]
            return self.plugins

        def _offsets(self, offset: dict[str, Any]) -> list[Any]:
            values = offset[WRAP]
            if not isinstance(values, list) or len(values) != self.count:
                held = len(values) if isinstance(values, list) else 1
                raise NodeFailure.of(self.job.error(
                    f"the checkpoint holds offsets of {held} partition(s), but the source now reads {self.count}",
                    hint="run it under a new application_id (or remove its checkpoint) to start over with the new "
                         "partitioning"))
            return values

        def initialOffset(self) -> dict[str, Any]:
            return {WRAP: [self.job.on_executor("initial_offset()", p.initial_offset) for p in self._readers()]}

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            ends = []
            for plugin, begin in zip(self._readers(), self._offsets(start), strict=True):
                end = self.job.on_executor("latest_offset()", lambda p=plugin, b=begin: p.latest_offset(b))
                offset_json(end)  # a JSON value, or a clear error now rather than in Spark's log
                ends.append(end)
            return {WRAP: ends}

        def prepareForTriggerAvailableNow(self) -> None:
            """A bounded partition ends its own stream: ``latest_offset`` stops moving once it is exhausted."""

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
            pairs = zip(self._offsets(start), self._offsets(end), strict=True)
            return [PluginPartition(a, b, None, index=i) for i, (a, b) in enumerate(pairs)
                    if offset_json(a) != offset_json(b)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            yield from read_between(self.job, self.schema, partition, self.count)

        def commit(self, end: dict[str, Any]) -> None:
            """Nothing is held between plans: executors read every epoch themselves."""

        def stop(self) -> None:
            for plugin in self.plugins:
                self.job.on_executor("close()", plugin.close)
            self.plugins = []

    class PluginDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            job, arrow, partitions = pickle.loads(base64.b64decode(self.options["job"]))
            if partitions:
                return PartitionedStreamReader(job, arrow, partitions)
            return PluginStreamReader(job, arrow)

    return PluginDataSource




class PluginSource(Source[PluginSourceOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self._job: PluginJob | None = None
        self._driver: SourcePlugin[Any] | None = None
        cls = self.job.cls
        assert issubclass(cls, SourcePlugin)
        self.bounded = bool(cls.is_bounded(self.options.plugin_options))
        self.poll_interval_secs = cls.poll_interval_secs
        #: partitions planned with ``latest_offset`` and read on executors; 0: read with ``read``
        self.partitions = self._partitions(cls)

    def _partitions(self, cls: type[SourcePlugin[Any]]) -> int:
        """The partitions the plugin declares for these options, checked before anything runs; 0 for
        a source that reads with ``read`` in Spark's source runner."""
        count = self.job.call("preferred_partitions()", lambda: cls.preferred_partitions(self.options.plugin_options))
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise self.job.error(f"preferred_partitions() returned {count!r}, not a whole number of at least 1")
        if count > 1 and cls.latest_offset is SourcePlugin.latest_offset:
            raise self.job.error(
                f"the plugin declares {count} partitions but does not define latest_offset(): a partitioned "
                "source is planned partition by partition before executors read it with read_between()",
                hint="define latest_offset(start) on the plugin, or declare one partition")
        return count if cls.planned(self.options.plugin_options) else 0

    @property
    def job(self) -> PluginJob:
        if self._job is None:
            self._job = node_job("source", self.ctx.spec.type, self.name, self.options.plugin_options,
                                 self.ctx.primary_key, self.ctx.settings)
        return self._job

    def driver_plugin(self) -> SourcePlugin[Any]:
        if self._driver is None:
            plugin = self.job.create("driver")
            assert isinstance(plugin, SourcePlugin)
            self._driver = plugin
        return self._driver

    def spark_schema(self) -> StructType:
        from streamling.spec.types import spark_schema_from_arrow

        return spark_schema_from_arrow(_arrow_schema(self.job, self.driver_plugin()))

    def read_stream(self, spark: SparkSession) -> DataFrame:
        from pyspark import cloudpickle
        from pyspark.sql.pandas.types import to_arrow_schema

        from streamling.runtime.session import register_data_source

        register_data_source(spark, FORMAT, _data_source_class)
        schema = self.spark_schema()
        arrow = to_arrow_schema(schema, timezone="UTC")
        payload = base64.b64encode(cloudpickle.dumps((self.job, arrow, self.partitions))).decode()
        return spark.readStream.format(FORMAT).schema(schema).option("job", payload).load()

    def _epoch(self, epoch: Epoch, end_offset: Any) -> PluginEpoch:
        end = end_offset.get(WRAP) if isinstance(end_offset, dict) else end_offset
        return PluginEpoch(epoch.epoch_id, sink_token=epoch.sink_token, end_offset=end)

    def on_flushed(self, epoch: Epoch, end_offset: Any) -> None:
        plugin = self.driver_plugin()
        self.job.call("on_epoch_flushed()", lambda: plugin.on_epoch_flushed(self._epoch(epoch, end_offset)))

    def on_finalized(self, epoch: Epoch, end_offset: Any) -> None:
        plugin = self.driver_plugin()
        self.job.call("on_epoch_finalized()", lambda: plugin.on_epoch_finalized(self._epoch(epoch, end_offset)))

    def close(self) -> None:
        if self._driver is not None:
            self.job.call("close()", self._driver.close)
            self._driver = None
