"""Base classes for the runtime side of each node kind.

A *source* produces a streaming DataFrame; a *transform* maps the DataFrames of its upstream
nodes to one DataFrame inside each micro-batch; a *sink* durably writes one micro-batch and
returns only once it is flushed. Together they run inside one ``foreachBatch`` per flow, which is
what makes a source advance only after every sink of the flow has flushed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from streamling.config import Settings
from streamling.errors import StreamlingError
from streamling.spec.options import NodeOptions
from streamling.spec.pipeline import NodeSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamling.functions.dynamic_table import DynamicTableBackend
    from streamling.state.base import StateBackend

GS_OP = "_gs_op"
#: the options model of a node type (``KafkaSourceOptions``…): ``self.options`` is typed by it.
OptionsT = TypeVar("OptionsT", bound=NodeOptions)


@dataclass(frozen=True)
class Epoch:
    """One micro-batch of one flow. ``epoch_id`` is Spark's batch id: a replay keeps it."""

    epoch_id: int
    flow: str
    application_id: str
    query_id: str = ""
    sink_token: str = ""  # stable per (application, flow, checkpoint) for idempotent writers
    started_at: float = 0.0  # epoch start (UNIX seconds): the single "now()" of this epoch

    @property
    def started_at_iso(self) -> str:
        import datetime as dt

        return dt.datetime.fromtimestamp(self.started_at, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


@dataclass
class NodeContext:
    """What every runtime node gets from the runtime; part of the public node contract."""

    #: the node's parsed YAML (name, type, options model, upstream, YAML location for errors).
    spec: NodeSpec
    settings: Settings
    #: the effective primary key: the node's own, inherited from upstream, or inferred by a source.
    primary_key: list[str] = field(default_factory=list)
    #: a scratch directory of this application (kept across restarts).
    state_dir: str = "./.streamling"
    #: ``--dry-run``/``--validate``: resolve schemas, contact nothing that has side effects.
    dry_run: bool = False
    #: the state backend (offsets, phase state), set when the pipeline starts; None before and on
    #: dry runs. Sources read what they stored here to resume; the flow writes their entries.
    state: StateBackend | None = None
    #: what a sink receives (the Spark schema of its input), set once the plan is analysed, so
    #: sinks can prepare tables in ``open`` before the first epoch.
    input_schema: StructType | None = None
    #: the plan's dynamic tables by node name: a ``dynamic_table`` transform registers its
    #: backend, SQL transforms calling ``dynamic_table_check`` read it.
    dynamic_tables: dict[str, DynamicTableBackend] = field(default_factory=dict)
    #: the namespace of this node's temporary views (one per flow: flows run concurrently).
    scope: str = "p"

    @property
    def name(self) -> str:
        return self.spec.name

    def error(self, message: str, **kwargs: Any) -> StreamlingError:
        return self.spec.error(message, **kwargs)


_PER_EPOCH = ("on Spark a node handles a whole epoch at once; epochs start every checkpoint_interval_sec, "
              "so set that (or kafka_source.max_offsets_per_epoch) to size them")


class Node(ABC, Generic[OptionsT]):  # noqa: B024 - shared base; each kind declares its abstract method
    #: Keys every node accepts (``parallelism``, ``batch_size``, ``batch_flush_interval``) that this
    #: node type acts on; the others, when set, are reported by ``ineffective_keys``. Sources and
    #: transforms honour ``parallelism``: the flow spreads their input over that many Spark
    #: partitions, hashed by the primary key (round-robin without one).
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"parallelism"})

    def __init__(self, ctx: NodeContext, options: OptionsT | None = None) -> None:
        self.ctx = ctx
        # The registry pairs each runtime class with its options model, and the spec was parsed
        # with that model: the cast only names what is already true.
        self.options: OptionsT = options if options is not None else cast(OptionsT, ctx.spec.options)

    @property
    def name(self) -> str:
        return self.ctx.name

    def ineffective_keys(self) -> dict[str, str]:
        """Keys set on this node that change nothing here, each with why and what to set instead.

        The planner logs them once per run, and ``--validate`` lists them under ``warnings``: a key
        Streamling documents is never accepted and silently ignored.
        """
        out: dict[str, str] = {}
        for key in ("parallelism", "batch_size", "batch_flush_interval"):
            if getattr(self.options, key) is not None and key not in self.honoured_keys:
                out[key] = self.common_key_reason(key)
        return out

    @classmethod
    def ineffective_settings(cls, settings: Settings) -> list[str]:
        """Warnings about settings keys (``kafka_source.*`` …) that matter only because a pipeline
        uses this node type and that change nothing on Spark, each saying why and what to use instead.

        A type's answer, not a node's: the planner asks each type of the pipeline once and logs each
        line once per plan, with the node keys of ``ineffective_keys``. A config written for
        Streamling must load unchanged, but a key that silently does nothing invites tuning that
        changes nothing.
        """
        return []

    def shared_paths(self) -> dict[str, str]:
        """Paths that Spark's executors read or write for this node, by option key (a Delta table, a
        folder of files). On a cluster of several hosts each must be on storage every host reaches;
        the planner refuses the others before anything runs (``storage.cluster_path_problem``)."""
        return {}

    def common_key_reason(self, key: str) -> str:
        """Why ``key`` (one of the keys every node accepts) does nothing on this node type."""
        if key == "parallelism":
            return "this node runs where Spark places it; parallelism applies to sources, transforms and sinks " \
                   "that write from executors"
        return _PER_EPOCH

    def spread(self, df: DataFrame) -> DataFrame:
        """``df`` over ``parallelism`` partitions, hashed by the primary key (round-robin without one):
        rows of one key stay together and in order, as Streamling's keyed repartition keeps them."""
        count = self.options.parallelism
        if not count or "parallelism" not in self.honoured_keys:
            return df
        keys = [k for k in self.ctx.primary_key if k in df.columns]
        return df.repartition(count, *keys) if keys else df.repartition(count)


class Source(Node[OptionsT]):
    """Produces the streaming DataFrame the flow's query reads. Always carries ``_gs_op``."""

    #: True when the source ends by itself (bounded file, bounded generate): the flow then runs
    #: with ``availableNow`` and the process exits once everything is drained.
    bounded: bool = False
    #: Seconds between polls of an unbounded source that finds new data by polling (a continuous
    #: file source): the flow triggers epochs at least that often. None: epochs follow
    #: ``checkpoint_interval_sec``.
    poll_interval_secs: float | None = None
    #: why this source must be the only one of its flow (its transforms and sinks read nothing
    #: else), or None when it may share a flow
    exclusive_in_flow: ClassVar[str | None] = None
    #: what reading "from the start" under a new ``application_id`` means for this source, when
    #: that is not simply its configured start (said when a checkpoint's topology changed)
    new_application_note: ClassVar[str | None] = None

    @abstractmethod
    def read_stream(self, spark: SparkSession) -> DataFrame:
        """The streaming DataFrame for this source."""

    def read_sample(self, spark: SparkSession, rows: int) -> DataFrame:
        """A streaming DataFrame whose first epoch holds at least ``rows`` rows, for previews.

        ``read_stream`` by default; sources whose first epoch is large (a ClickHouse page of
        millions of rows) make it small, so a notebook preview does not read it all."""
        return self.read_stream(spark)

    def decode(self, df: DataFrame, epoch: Epoch | None) -> DataFrame:
        """Turn the raw rows of ``read_stream`` into this node's rows, once per epoch.

        Identity for most sources; the Kafka source decodes Avro here so that writer schemas
        registered while the pipeline runs are picked up at the next epoch.
        """
        return df

    def on_flushed(self, epoch: Epoch, end_offset: Any) -> None:  # noqa: B027 - optional hook
        """Called inside the epoch once every sink of the flow wrote it, before Spark commits it;
        ``end_offset`` is where the epoch ends, as Spark's write-ahead log has it."""

    def on_finalized(self, epoch: Epoch, end_offset: Any) -> None:  # noqa: B027 - optional hook
        """Called after Spark committed the epoch (e.g. commit consumer-group offsets)."""

    def state_key(self) -> str:
        return f"{self.ctx.spec.type}:{self.name}"

    def state_entries(self, end_offset: Any) -> dict[str, dict[str, Any]]:
        """What to copy to the state backend once an epoch is committed."""
        return {self.state_key(): {"offset": end_offset}}

    def explain_failure(self, raw: DataFrame, exc: BaseException) -> StreamlingError | None:
        """Given an epoch that failed, find the input record responsible (poison messages)."""
        return None

    def inferred_primary_key(self) -> list[str]:
        """A key the source knows without YAML (Kafka: the Avro record's ``primaryKeys`` doc)."""
        return []

    def phase(self) -> str:
        """The name of the phase this source reads in ("" for single-phase sources). A flow keeps
        one Spark checkpoint per phase, because each phase reads a different Spark source."""
        return ""

    def next_phase(self) -> bool:
        """Called once a bounded flow drained and Spark committed its last epoch: move on to the
        next phase (a ``hybrid`` source going live) and return True, so the flow starts again on
        that phase's checkpoint; False when the source is done."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; called once when the flow stops."""


class Transform(Node[OptionsT]):
    """DataFrame → DataFrame over one micro-batch (stateless)."""

    #: True when ``apply`` runs a Spark job over its input itself (a dynamic table collecting the
    #: values to store): the flow then caches the micro-batch so its sources are read only once.
    reads_batch_eagerly: bool = False

    @abstractmethod
    def apply(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None) -> DataFrame:
        """Compute this node's output from its upstream DataFrames (keyed by node name)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; called once when the pipeline stops."""


class TargetReader(Protocol):
    """Reads back what a sink wrote (the notebook's ``display`` of a sink): the latest rows of its
    target, at most ``limit``."""

    @property
    def caption(self) -> str:
        """What the rows are, shown as the widget's caption."""

    def read(self, limit: int) -> tuple[pa.Table, list[str]]:
        """The rows and the type name of each column (as the target calls it)."""

    def error_text(self, exc: BaseException) -> str:
        """A failed read in words: what was queried, where, and why."""

    def close(self) -> None: ...


class Sink(Node[OptionsT]):
    """Writes each micro-batch; ``write`` returns only once the rows are durable."""

    #: Sinks that write from the executors, partition by partition, set ``{"parallelism"}``: the
    #: flow then spreads each epoch over that many writers. Sinks that write from the driver (one
    #: transaction per epoch, requests in order) keep the default and report the key.
    honoured_keys: ClassVar[frozenset[str]] = frozenset()

    def common_key_reason(self, key: str) -> str:
        if key == "parallelism":
            return (f"a {self.ctx.spec.type} sink writes each epoch from the driver as one unit (one transaction "
                    "or one ordered stream of requests), so there is a single writer")
        return super().common_key_reason(key)

    def open(self, spark: SparkSession) -> None:  # noqa: B027 - optional hook
        """Prepare before the first epoch (connect, create tables). Not called on dry runs."""

    #: whether ``write`` returns the number of rows it received; a sink that cannot count them without
    #: more work says False and the flow counts them in the write's own job
    counts_rows: ClassVar[bool] = True
    #: whether ``write`` reads the batch exactly once (one Spark job over all of it): the flow of a
    #: single source and this single sink then takes the epoch's input count from Spark's own scan
    #: metric instead of observing the input (an observation costs every record a little)
    reads_once: ClassVar[bool] = False
    #: whether the count ``write`` returns is exactly the rows it was given (none dropped, merged or
    #: deduplicated): the flow then takes the count of the node the sink alone reads from the write
    #: instead of observing that node (``counts_rows`` must be True too)
    counts_received: ClassVar[bool] = False

    @abstractmethod
    def write(self, df: DataFrame, epoch: Epoch) -> int:
        """Write the batch; return the number of rows the sink received (ignored when not ``counts_rows``)."""

    def ddl_statements(self) -> list[str]:
        """The SQL that ``open`` runs to prepare the target, computed without connecting (shown by
        ``--dry-run``); empty for sinks that create nothing or cannot say before connecting."""
        return []

    def on_finalized(self, epoch: Epoch) -> None:  # noqa: B027 - optional hook
        """Called after Spark committed the epoch: every sink of the flow wrote it and the sources
        advanced past it, so it is never replayed (clean up what only a replay would need)."""

    def wants_stop(self) -> bool:
        """True once the sink has what it was asked for (``num_records_before_stop``): the flow
        then stops after the epoch that got it there commits."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; called once when the flow stops."""

    #: why this sink type cannot run without a primary key (Streamling refuses it whatever
    #: ``enforce_primary_keys`` says); None: a sink without one warns, or fails under that switch
    primary_key_reason: ClassVar[str | None] = None

    def missing_key_error(self) -> StreamlingError:
        """The validation error of a sink whose ``primary_key_reason`` is set and that has no key."""
        return self.ctx.error(f"requires a primary key: {self.primary_key_reason}", code="primary_key_required",
                              hint="set primary_key on the sink or on a node upstream")

    def read_back(self, spark: SparkSession) -> TargetReader | None:
        """How to query what this sink wrote (a table), for the notebook's ``display``; None for a
        sink that keeps nothing to query (print, kafka, webhook, …)."""
        return None
