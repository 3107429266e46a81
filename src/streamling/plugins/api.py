"""The plugin API: what a plugin author subclasses, and what the runtime hands each plugin.

Plugins exchange ``pyarrow.RecordBatch``es with the runtime and get the same guarantees as the
built-ins: their options are validated before anything starts, their sources advance only after
every sink flushed (checkpoint-coordinated at-least-once), ``_gs_op`` travels through them, and
their failures are classified: raise ``TransientError`` (or a ``ConnectionError``/``TimeoutError``)
for what a retry can fix — the flow retries the epoch with the pipeline's ``retry`` policy — and
anything else for what it cannot, which stops the flow naming the plugin and the node.

Where each hook runs, on Spark:

- **SourcePlugin**: ``read`` runs in Spark's source runner (one instance for the life of the
  query); a replayed epoch after a restart is re-read with ``read_between`` on an executor. The
  epoch hooks run on the driver, on an instance of their own. Offsets are the only state shared
  between these instances: keep in the offset whatever ``on_epoch_finalized`` needs.
- **TransformPlugin**: one instance per partition of each epoch, on executors (``parallelism`` sets
  how many); rows of one primary key are in one partition, in order.
- **SinkPlugin**: one instance per partition on executors, likewise, kept across epochs: the Spark
  Python worker that wrote a partition keeps its instance, and its next task for that partition
  writes with it (see ``SinkPlugin``). ``open`` and ``on_epoch_finalized`` run on the driver.

This module imports neither pyspark nor the runtime: plugin packages import it cheaply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:
    import pyarrow as pa

    from streamling.config import Settings
    from streamling.state.base import StateBackend

log = logging.getLogger(__name__)

#: A JSON value: what a source plugin's offsets are made of (the runtime checkpoints them).
Offset = Any
OptionsM = TypeVar("OptionsM", bound=BaseModel)


class TransientError(Exception):
    """A failure a retry can fix (a server briefly away, a throttled request): the flow retries the
    epoch with the pipeline's ``retry`` policy before giving up."""


class NoOptions(BaseModel):
    """The options model of a plugin that takes none: any key given to it is an error."""

    model_config = {"extra": "forbid"}


@dataclass(frozen=True)
class PluginEpoch:
    """The epoch a hook is called for. ``epoch_id`` is kept by a replay, so a writer that records
    ``(epoch_id, partition)`` with its data can skip what it already wrote."""

    epoch_id: int
    #: the partition this instance handles (executor-side hooks); -1 on the driver
    partition: int = -1
    #: stable for one application, flow and checkpoint: epoch ids start over with a new checkpoint
    sink_token: str = ""
    #: a source's offsets: where the epoch ends (source hooks only)
    end_offset: Offset = None


class MetricsRecorder:
    """Counters, latencies and gauges a plugin records (Streamling's ``record_count``,
    ``record_latency``, ``record_gauge``; tags are optional everywhere). Kept per process, tagged
    with the node; ``snapshot`` reads them (the testing kit and the telemetry exporter do)."""

    def __init__(self, node: str = "", plugin_id: str = "") -> None:
        self.node = node
        self.plugin_id = plugin_id
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._latencies: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    @staticmethod
    def _key(name: str, tags: Mapping[str, str] | None) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted((str(k), str(v)) for k, v in (tags or {}).items()))

    def record_count(self, name: str, value: float = 1, tags: Mapping[str, str] | None = None) -> None:
        with self._lock:
            key = self._key(name, tags)
            self._counts[key] = self._counts.get(key, 0) + value

    def record_latency(self, name: str, seconds: float, tags: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._latencies.setdefault(self._key(name, tags), []).append(seconds)

    def record_gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._gauges[self._key(name, tags)] = value

    def snapshot(self) -> dict[str, Any]:
        """``{"counts": {name: total}, "latencies": {name: [s…]}, "gauges": {name: value}}``; tagged
        series appear as ``name{k=v,…}``."""
        def label(key: tuple[str, tuple[tuple[str, str], ...]]) -> str:
            name, tags = key
            return f"{name}{{{','.join(f'{k}={v}' for k, v in tags)}}}" if tags else name

        with self._lock:
            return {"counts": {label(k): v for k, v in self._counts.items()},
                    "latencies": {label(k): list(v) for k, v in self._latencies.items()},
                    "gauges": {label(k): v for k, v in self._gauges.items()}}


class PluginState:
    """The state backend, namespaced to one node: keys a plugin stores never meet the runtime's or
    another node's. Opened on first use, from the pipeline's ``state_backend`` settings: SQLite and
    Postgres are shared by every process of the pipeline; the in-memory backend is per process."""

    def __init__(self, settings: Settings | None, node: str) -> None:
        self._settings = settings
        self._prefix = f"plugin:{node}:"
        self._backend: StateBackend | None = None

    def _open(self) -> StateBackend:
        if self._backend is None:
            from streamling.state import create_state_backend
            from streamling.state.memory import InMemoryStateBackend

            self._backend = (create_state_backend(self._settings) if self._settings is not None
                             else InMemoryStateBackend("plugin"))
        return self._backend

    def get(self, key: str) -> dict[str, Any] | None:
        return self._open().get(self._prefix + key)

    def put(self, key: str, data: dict[str, Any]) -> None:
        self._open().put(self._prefix + key, data)

    def delete(self, key: str) -> None:
        self._open().delete(self._prefix + key)

    def list(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        found = self._open().list(self._prefix + prefix)
        return {k[len(self._prefix):]: v for k, v in found.items()}

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def __getstate__(self) -> dict[str, Any]:  # shipped to executors unopened
        return {**self.__dict__, "_backend": None}


@dataclass
class PluginContext(Generic[OptionsM]):
    """What a plugin instance is constructed with."""

    #: ``namespace.name`` as written in the pipeline's ``type``
    plugin_id: str
    #: the node's name in the pipeline (a preprocessor's is "", a side output's is its source's)
    node: str
    #: the plugin's options, validated against its ``Options`` model (YAML ``options:`` and the keys
    #: flattened onto the node, flattened keys winning, then ``STREAMLING__PLUGIN__<ID>__<KEY>``)
    options: OptionsM
    #: the Arrow schema of the input (transforms, sinks, side outputs); None for sources
    input_schema: pa.Schema | None = None
    #: the node's effective primary key (its own, or inherited from upstream)
    primary_key: list[str] = field(default_factory=list)
    state: PluginState = field(default_factory=lambda: PluginState(None, ""))
    metrics: MetricsRecorder = field(default_factory=MetricsRecorder)
    #: where this instance runs: "driver", "reader" (a source's Spark source runner) or "executor"
    role: str = "driver"
    #: the partition an executor-side instance handles (and a partitioned source's instance on the
    #: driver plans); -1 elsewhere
    partition: int = -1
    #: how many partitions a partitioned source reads (``SourcePlugin.preferred_partitions``); 1 otherwise
    partitions: int = 1

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(f"streamling.plugin.{self.plugin_id}")


class Plugin(Generic[OptionsM]):
    """Shared by every plugin kind: the options model and the constructor."""

    #: the plugin's id, ``namespace.name``; set by the registration decorator
    plugin_id: ClassVar[str] = ""
    #: the pydantic model of the plugin's options; a plugin without options keeps ``NoOptions``
    Options: ClassVar[type[BaseModel]] = NoOptions

    def __init__(self, ctx: PluginContext[OptionsM]) -> None:
        self.ctx = ctx
        self.options: OptionsM = ctx.options

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; called when the runtime is done with the instance. A transform's or side
        output's is closed at the end of its partition's epoch, a sink's executor-side one when it is
        dropped (after a failure, evicted, at worker exit: see ``SinkPlugin``), a driver-side one at
        the end of the run. Nothing that must happen may wait for it: it can be skipped."""


class SourcePlugin(Plugin[OptionsM]):
    """Produces record batches from offsets it defines.

    The runtime asks ``read(start)`` for what follows ``start`` and checkpoints the offset it gets
    back; after a restart it replays an unfinished epoch with ``read_between(start, end)`` and goes
    on from the last checkpointed offset. Offsets are JSON values (numbers, strings, lists, dicts).

    A source that declares several partitions (``preferred_partitions``) is read in parallel: each
    partition has an offset and an instance of its own (``ctx.partition`` of ``ctx.partitions``).
    Per epoch the driver asks each partition's instance for ``latest_offset(start)``, and executors
    read ``read_between(start, end)`` of every partition that moved, one task per partition; the
    epoch's offset is the list of the partitions' offsets.
    """

    #: True when the source ends by itself: ``read`` then returns ``None`` once everything was read,
    #: and the pipeline exits when every sink has written it (``job_mode`` accepts the source).
    bounded: ClassVar[bool] = False
    #: seconds between reads when ``read`` found nothing (an unbounded source polling)
    poll_interval_secs: ClassVar[float | None] = None

    @classmethod
    def is_bounded(cls, options: Any) -> bool:
        """Whether a node with these options ends by itself (``bounded`` unless overridden, e.g. a
        source bounded only when a row limit is set)."""
        return cls.bounded

    @classmethod
    def preferred_partitions(cls, options: Any) -> int:
        """How many partitions a node with these options reads in parallel, one instance each; more
        than one needs ``latest_offset``. A checkpoint keeps the count: changing it needs a new one."""
        return 1

    @classmethod
    def planned(cls, options: Any) -> bool:
        """Whether the source is planned partition by partition (``latest_offset``) and read on
        executors (``read_between``): with several partitions, or when it defines no ``read``."""
        return cls.preferred_partitions(options) > 1 or cls.read is SourcePlugin.read

    def output_schema(self) -> pa.Schema:
        """The Arrow schema of every batch; a ``_gs_op`` column (i/u/d) may be part of it, else
        every row is an insert."""
        raise NotImplementedError(f"source plugin '{self.plugin_id}' must define output_schema()")

    def latest_offset(self, start: Offset) -> Offset:
        """A partitioned source: where this partition's available data ends now, without reading it
        (``start`` when nothing is new, or when a bounded partition is exhausted). Executors then
        read ``read_between(start, end)``, which must return exactly those rows."""
        raise NotImplementedError(f"source plugin '{self.plugin_id}' declares partitions and must define "
                                  "latest_offset()")

    def initial_offset(self) -> Offset:
        """Where a brand-new pipeline starts reading."""
        return None

    def read(self, start: Offset) -> tuple[pa.RecordBatch | None, Offset]:
        """The rows after ``start`` available now, and the offset after them. Return ``(None,
        start)`` when there is nothing new (a bounded source: when it is exhausted)."""
        raise NotImplementedError(f"source plugin '{self.plugin_id}' must define read()")

    def read_between(self, start: Offset, end: Offset) -> pa.RecordBatch | None:
        """Exactly the rows between ``start`` and ``end`` again (an epoch replayed after a crash; for a
        partitioned source, every epoch of a partition, read on an executor).

        By default ``read(start)``, accepted when it ends at ``end``; a source whose ``read`` may
        return more (new data arrived) must override this to stop at ``end``."""
        batch, reached = self.read(start)
        if reached != end:
            raise RuntimeError(f"source plugin '{self.plugin_id}' cannot replay the epoch from {start!r} to "
                               f"{end!r}: read() now ends at {reached!r}; implement read_between()")
        return batch

    def on_epoch_flushed(self, epoch: PluginEpoch) -> None:  # noqa: B027 - optional hook
        """Every sink has durably written the epoch ending at ``epoch.end_offset`` (driver)."""

    def on_epoch_finalized(self, epoch: PluginEpoch) -> None:  # noqa: B027 - optional hook
        """The epoch is committed: the runtime will never ask for data before ``epoch.end_offset``
        again. Acknowledge upstream here (delete queue messages, advance a replication slot)."""


class TransformPlugin(Plugin[OptionsM]):
    """Maps each record batch to a record batch (stateless per batch)."""

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The Arrow schema ``process_batch`` returns; by default the input's."""
        return input_schema

    def process_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """The output rows for ``batch`` (None: no rows). Keep ``_gs_op``: it carries upserts."""
        raise NotImplementedError(f"transform plugin '{self.plugin_id}' must define process_batch()")


class SinkPlugin(Plugin[OptionsM]):
    """Writes record batches; ``_gs_op`` says whether a row is an insert, update or delete.

    Lifecycle on Spark: ``open`` once on the driver; then, per epoch, each partition's instance on
    an executor gets ``write_batch`` for each of its batches and ``on_epoch_flushed``; then
    ``on_epoch_finalized`` on the driver. An executor-side instance lives across epochs: the Python
    worker keeps it after ``on_epoch_flushed`` returned, and the next epoch's task for the same
    partition that lands on that worker reuses it (the constructor's connections and clients too);
    one that lands on another worker gets that worker's instance, or a new one. So keep per-epoch
    state keyed by ``epoch.epoch_id`` or reset it in ``on_epoch_flushed``, and expect several
    instances of one partition over a run (one per worker that wrote it).

    An instance is kept for one run of the node with one input schema and one ``sink_token``; it is
    closed (``close``) and never reused once ``write_batch`` or ``on_epoch_flushed`` raised or its
    task stopped half-way: a retried or replayed epoch gets a fresh instance. A worker closes the
    least recently used instances beyond a few, and the rest at exit, best effort (Spark may end a
    worker without running Python's exit hooks). Durability belongs to ``on_epoch_flushed``, never to
    ``close``. A replayed epoch keeps its id and partitioning: record ``(epoch_id, partition)`` with
    what you write to skip it on a replay.
    """

    def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare the target once, before the first epoch (driver): create tables, check access."""

    def write_batch(self, batch: pa.RecordBatch, epoch: PluginEpoch) -> None:
        """Write ``batch``. The runtime calls ``on_epoch_flushed`` after this instance's last batch
        of the epoch; the epoch counts as written once every instance returned from it."""
        raise NotImplementedError(f"sink plugin '{self.plugin_id}' must define write_batch()")

    def on_epoch_flushed(self, epoch: PluginEpoch) -> None:  # noqa: B027 - optional hook
        """Make this instance's writes of the epoch durable (commit, flush a buffer); returning
        means they are. Called on every partition's instance, even one that got no rows."""

    def on_epoch_finalized(self, epoch: PluginEpoch) -> None:  # noqa: B027 - optional hook
        """The epoch is committed by every sink of the flow and its sources advanced (driver)."""


class PreprocessorPlugin(Plugin[OptionsM]):
    """Rewrites the pipeline's YAML text before it is parsed (``plugin.preprocessor_ids``)."""

    def preprocess(self, pipeline_text: str) -> str:
        raise NotImplementedError(f"preprocessor plugin '{self.plugin_id}' must define preprocess()")


class SideOutputPlugin(Plugin[OptionsM]):
    """Sees every record batch each source produces (``plugin.side_output_ids``), on executors,
    inside the epoch: the epoch is committed only after every side output returned."""

    def process_batch(self, batch: pa.RecordBatch) -> None:
        raise NotImplementedError(f"side output plugin '{self.plugin_id}' must define process_batch()")


def elapsed(since: float) -> float:
    """Seconds since ``since`` (a ``time.perf_counter()`` reading), for ``record_latency``."""
    return time.perf_counter() - since
