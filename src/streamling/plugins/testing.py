"""Drive a plugin through epochs, crashes and restarts, without Spark.

The runners build instances, check batches and classify failures with the runtime's own code
(``streamling.plugins.host``), and follow the protocol the Spark adapters follow: a source's offset
is checkpointed when its epoch is planned and committed when it is finalized; a crash loses every
instance and whatever was not finalized; a restart replays the planned, unfinished epoch with
``read_between`` and goes on from there. Each runner records the hooks it called in ``calls``.

    from streamling.plugins.testing import SourceRunner

    runner = SourceRunner(MySource, {"max_rows": 10})
    first = runner.epoch()            # read, flushed, finalized
    runner.epoch(finalize=False)      # planned and flushed, not committed
    runner.crash(); runner.restart()  # the unfinished epoch is read again, identically
    assert runner.table().num_rows == 10
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from pydantic import BaseModel

from streamling.plugins.api import MetricsRecorder, PluginEpoch, SinkPlugin, SourcePlugin, TransformPlugin
from streamling.plugins.host import GS_OP, PluginJob, PluginT, conform, offset_json
from streamling.plugins.instances import InstanceCache
from streamling.plugins.registry import Kind

__all__ = ["SinkRunner", "SourceRunner", "TransformRunner", "with_ops"]


def _job(kind: Kind, cls: type[PluginT], options: Mapping[str, Any] | BaseModel | None, node: str,
         primary_key: list[str] | None, input_schema: pa.Schema | None) -> PluginJob[PluginT]:
    model = options if isinstance(options, BaseModel) else cls.Options.model_validate(dict(options or {}))
    return PluginJob(cls, cls.plugin_id or cls.__name__, kind, node, model, list(primary_key or []),
                     input_schema=input_schema)


def with_ops(batch: pa.RecordBatch, op: str = "i") -> pa.RecordBatch:
    """``batch`` with a ``_gs_op`` column (all ``op``) when it has none."""
    if GS_OP in batch.schema.names:
        return batch
    return batch.append_column(GS_OP, pa.array([op] * batch.num_rows, pa.string()))


class SourceRunner:
    """A source plugin under the runtime's checkpoint protocol."""

    def __init__(self, cls: type[SourcePlugin[Any]], options: Mapping[str, Any] | BaseModel | None = None,
                 node: str = "source") -> None:
        self.job = _job("source", cls, options, node, None, None)
        self.metrics = MetricsRecorder(node, self.job.plugin_id)
        self.calls: list[tuple[str, int | None]] = []
        self.batches: list[pa.RecordBatch] = []  #: every batch delivered downstream (replays included)
        self.committed: Any = None  #: the offset of the last finalized epoch (a list, one per partition)
        self.planned: list[tuple[int, Any, Any]] = []  #: (epoch, start, end) planned, not finalized
        self.next_epoch = 0
        self._started = False
        #: partitions read in parallel (``preferred_partitions``): then offsets are lists, each epoch
        #: is planned with ``latest_offset`` and read partition by partition with ``read_between``
        self.partitions = int(self.job.call("preferred_partitions()",
                                            lambda: cls.preferred_partitions(self.job.options)))
        self.planned_reads = bool(cls.planned(self.job.options))
        self.readers: list[SourcePlugin[Any]] = []
        self.plugin: SourcePlugin[Any] = self._create()
        self.schema = self._schema()

    def _create(self) -> SourcePlugin[Any]:
        if self.planned_reads:  # planning instances, one per partition; hooks run on a driver-side one
            self.readers = [self._instance("reader", i) for i in range(self.partitions)]
            return self._instance("driver", -1)
        return self._instance("reader", -1)

    def _instance(self, role: str, partition: int) -> SourcePlugin[Any]:
        return self.job.create(role, partition, metrics=self.metrics, partitions=self.partitions)

    def _schema(self) -> pa.Schema:
        schema = self.job.call("output_schema()", self.plugin.output_schema)
        return schema if GS_OP in schema.names else schema.append(pa.field(GS_OP, pa.string()))

    def _start(self) -> Any:
        if not self._started:
            if self.planned_reads:
                self.committed = [self.job.call("initial_offset()", r.initial_offset) for r in self.readers]
            else:
                self.committed = self.job.call("initial_offset()", self.plugin.initial_offset)
            offset_json(self.committed)
            self._started = True
        return self.planned[-1][2] if self.planned else self.committed

    def _read_partitions(self, start: list[Any], end: list[Any], epoch: int | None) -> pa.RecordBatch | None:
        """Every partition that moved, each read by an executor-side instance of its own."""
        out = []
        for index, (begin, until) in enumerate(zip(start, end, strict=True)):
            if offset_json(begin) == offset_json(until):
                continue
            plugin = self._instance("executor", index)
            try:
                batch = self.job.call("read_between()", lambda p=plugin, b=begin, u=until: p.read_between(b, u))
            finally:
                self.job.call("close()", plugin.close)
            self.calls.append(("read_between", epoch))
            if batch is not None:
                out.append(conform(self.job, batch, self.schema, "read_between()"))
        return pa.concat_batches(out) if out else None

    def epoch(self, finalize: bool = True) -> pa.RecordBatch | None:
        """Plan one epoch (``read`` from the last planned offset; a partitioned source: ``latest_offset``
        per partition, then ``read_between`` of each that moved); unless the source had nothing, call
        ``on_epoch_flushed`` and, with ``finalize``, ``on_epoch_finalized``. The batch, or None."""
        start = self._start()
        if self.planned_reads:
            ends = [self.job.call("latest_offset()", lambda r=r, b=b: r.latest_offset(b))
                    for r, b in zip(self.readers, start, strict=True)]
            self.calls.append(("latest_offset", None))
            if offset_json(ends) == offset_json(start):
                return None
            epoch = self.next_epoch
            self.next_epoch += 1
            self.planned.append((epoch, start, ends))
            out = self._read_partitions(start, ends, epoch)
            self._deliver(epoch, out, ends)
            if finalize:
                self.finalize()
            return out
        batch, end = self.job.call("read()", lambda: self.plugin.read(start))
        self.calls.append(("read", None))
        if offset_json(end) == offset_json(start):
            if batch is not None and batch.num_rows:
                raise self.job.error(f"read() returned {batch.num_rows} rows without moving the offset")
            return None
        out = conform(self.job, batch, self.schema, "read()") if batch is not None else None
        epoch = self.next_epoch
        self.next_epoch += 1
        self.planned.append((epoch, start, end))
        self._deliver(epoch, out, end)
        if finalize:
            self.finalize()
        return out

    def _deliver(self, epoch: int, batch: pa.RecordBatch | None, end: Any) -> None:
        if batch is not None:
            self.batches.append(batch)
        at = PluginEpoch(epoch, end_offset=end)
        self.job.call("on_epoch_flushed()", lambda: self.plugin.on_epoch_flushed(at))
        self.calls.append(("flushed", epoch))

    def finalize(self) -> None:
        """Commit every planned epoch, oldest first."""
        while self.planned:
            epoch, _, end = self.planned.pop(0)
            at = PluginEpoch(epoch, end_offset=end)
            self.job.call("on_epoch_finalized()", lambda a=at: self.plugin.on_epoch_finalized(a))
            self.calls.append(("finalized", epoch))
            self.committed = end

    def run(self, max_epochs: int = 1000) -> int:
        """Epochs until the source has nothing more (a bounded source's end); how many ran."""
        for count in range(max_epochs):
            if self.epoch() is None:
                return count
        raise AssertionError(f"source still had data after {max_epochs} epochs")

    def crash(self) -> None:
        """The process dies: instances are gone, planned epochs stay in the write-ahead log."""
        self.calls.append(("crash", None))
        self.plugin = None  # type: ignore[assignment]

    def restart(self) -> None:
        """A new instance; the planned, unfinished epochs are replayed with ``read_between``."""
        self.plugin = self._create()
        self.calls.append(("restart", None))
        for epoch, start, end in list(self.planned):
            if self.planned_reads:
                self._deliver(epoch, self._read_partitions(start, end, epoch), end)
                continue
            batch = self.job.call("read_between()", lambda s=start, e=end: self.plugin.read_between(s, e))
            self.calls.append(("read_between", epoch))
            out = conform(self.job, batch, self.schema, "read_between()") if batch is not None else None
            self._deliver(epoch, out, end)
        self.finalize()

    def table(self) -> pa.Table:
        """Every delivered batch as one table (a replay delivers its epoch again: at-least-once)."""
        return pa.Table.from_batches(self.batches, schema=self.schema)


class TransformRunner:
    """A transform plugin over batches, one instance per partition as on Spark."""

    def __init__(self, cls: type[TransformPlugin[Any]], options: Mapping[str, Any] | BaseModel | None,
                 input_schema: pa.Schema, node: str = "transform") -> None:
        self.job = _job("transform", cls, options, node, None, input_schema)
        self.metrics = MetricsRecorder(node, self.job.plugin_id)
        driver = self.job.create("driver", metrics=self.metrics)
        self.output_schema: pa.Schema = self.job.call("output_schema()", lambda: driver.output_schema(input_schema))
        if GS_OP in input_schema.names and GS_OP not in self.output_schema.names:
            raise self.job.error("output_schema() drops the _gs_op column: upserts and deletes travel in it")

    def process(self, batches: Iterable[pa.RecordBatch], partition: int = 0) -> pa.Table:
        plugin: Any = self.job.create("executor", partition, metrics=self.metrics)
        out = []
        try:
            for batch in batches:
                got = self.job.call("process_batch()", lambda b=batch: plugin.process_batch(b))
                if got is not None:
                    out.append(conform(self.job, got, self.output_schema, "process_batch()"))
        finally:
            self.job.call("close()", plugin.close)
        return pa.Table.from_batches(out, schema=self.output_schema)


class SinkRunner:
    """A sink plugin under the runtime's protocol: partitions written, flushed, then finalized.

    As in a Spark worker, a partition's instance is kept from epoch to epoch (``instances``) and
    closed and replaced after a hook of it raised; ``close`` closes them all."""

    def __init__(self, cls: type[SinkPlugin[Any]], options: Mapping[str, Any] | BaseModel | None,
                 input_schema: pa.Schema, primary_key: list[str] | None = None, node: str = "sink",
                 sink_token: str = "test") -> None:
        self.job = _job("sink", cls, options, node, primary_key, input_schema)
        self.metrics = MetricsRecorder(node, self.job.plugin_id)
        self.sink_token = sink_token
        self.calls: list[tuple[str, int, int]] = []
        self.driver = self._instance("driver", -1)
        self.job.call("open()", self.driver.open)
        self.next_epoch = 0
        #: the executor-side instances kept between epochs, one per partition
        self.instances: InstanceCache[SinkPlugin[Any]] = InstanceCache(capacity=1 << 16, close=self._close)

    def _instance(self, role: str, partition: int) -> SinkPlugin[Any]:
        return self.job.create(role, partition, metrics=self.metrics)

    def write_epoch(self, partitions: list[list[pa.RecordBatch]], epoch: int | None = None,
                    finalize: bool = True) -> int:
        """Write one epoch (``epoch``: replay that id) given each partition's batches; rows written."""
        epoch_id = self.next_epoch if epoch is None else epoch
        self.next_epoch = max(self.next_epoch, epoch_id + 1)
        rows = 0
        for partition, batches in enumerate(partitions):
            at = PluginEpoch(epoch_id, partition=partition, sink_token=self.sink_token)
            with self.instances.lease(self.job.instance_family(partition), self.sink_token,
                                      functools.partial(self._instance, "executor", partition)) as plugin:
                for batch in batches:
                    if batch.num_rows:
                        self.job.call("write_batch()", functools.partial(plugin.write_batch, with_ops(batch), at))
                        rows += batch.num_rows
                self.job.call("on_epoch_flushed()", functools.partial(plugin.on_epoch_flushed, at))
                self.calls.append(("flushed", epoch_id, partition))
        if finalize:
            self.finalize(epoch_id)
        return rows

    def finalize(self, epoch: int) -> None:
        at = PluginEpoch(epoch, sink_token=self.sink_token)
        self.job.call("on_epoch_finalized()", lambda: self.driver.on_epoch_finalized(at))
        self.calls.append(("finalized", epoch, -1))

    def _close(self, plugin: SinkPlugin[Any]) -> None:
        self.calls.append(("closed", -1, plugin.ctx.partition))
        self.job.call("close()", plugin.close)

    def close(self) -> None:
        """Close the partitions' instances, then the driver's."""
        self.instances.close_all()
        self.job.call("close()", self.driver.close)
