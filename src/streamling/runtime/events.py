"""Typed runtime events. The CLI, notebook widgets and telemetry subscribe; the engine never
imports any of them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    flow: str
    at: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True)
class FlowStarted(Event):
    query_id: str
    sources: list[str]
    sinks: list[str]
    bounded: bool


@dataclass(frozen=True)
class EpochPlanned(Event):
    """Spark wrote ``offsets/N``: the epoch's input is fixed and its transforms start."""

    epoch: int


@dataclass(frozen=True)
class EpochFlushed(Event):
    """Every sink of the flow durably wrote epoch N (before Spark commits it)."""

    epoch: int
    rows: dict[str, int]  # per sink
    durations_ms: dict[str, float]  # per sink, plus "transforms" and "total"
    #: output rows of every source and transform, counted in the sinks' own jobs (no extra job)
    node_rows: dict[str, int] = field(default_factory=dict)
    #: the largest event time (epoch ms) of each node with ``telemetry.event_time``
    event_time_ms: dict[str, float] = field(default_factory=dict)
    #: per node with ``telemetry.event_time``: its rows' lags (epoch start − event time, ms), bucketed
    #: by Spark as the lag histogram buckets them (``streamling.telemetry.histogram.Buckets``)
    event_time_lag: dict[str, Any] = field(default_factory=dict)
    #: a node's own time in the epoch (ms): sinks, their write; sources and transforms, their step on
    #: the driver (``streamling_elapsed_compute``; see ``runtime.flow.evaluate``)
    compute_ms: dict[str, float] = field(default_factory=dict)
    #: node → expectation → ``{"passed": n, "failed": n, "action": warn|drop|fail}``
    expectations: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class EpochFinalized(Event):
    """Spark wrote ``commits/N``: sources may advance; offsets are the epoch's end offsets."""

    epoch: int
    input_rows: int
    offsets: dict[str, Any]  # per source
    durations_ms: dict[str, float]
    input_rows_per_second: float = 0.0
    processed_rows_per_second: float = 0.0
    #: per Kafka source, messages each ``topic/partition`` is behind the latest offset Spark saw
    lag: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Spark's whole progress report of the epoch (the monitor shows it on request)
    progress: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class RowsSampled(Event):
    """A few rows of one node's output in one epoch (only when sampling is on).

    ``count`` is the node's full row count in the epoch when the bus asks for counts (the notebook
    monitor's rows/s per node); ``table`` is the sample as a ``pyarrow.Table`` with exact types, so
    a notebook can re-run a transform on it.
    """

    epoch: int
    node: str
    columns: list[str]
    rows: list[dict[str, Any]]
    count: int | None = None
    table: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class FlowStopped(Event):
    reason: str
    error: str | None = None


@dataclass(frozen=True)
class PipelineError(Event):
    node: str | None
    message: str
    retriable: bool = False
    attempt: int = 0


Subscriber = Callable[[Event], None]


class EventBus:
    """Fan-out of events to subscribers; a failing subscriber never breaks the pipeline."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        #: rows kept per node per epoch when > 0 (the notebook and live inspect turn this on); one
        #: small ``limit`` job per node per sampled epoch.
        self.sample_rows = 0
        #: rows kept of one node per sampled epoch when it needs more than ``sample_rows`` (a notebook
        #: ``%streamling display`` of its latest rows); a node listed here is sampled even when
        #: ``sample_rows`` is 0.
        self.node_sample_rows: dict[str, int] = {}
        #: at most one sampled epoch per flow every this many seconds (0: every epoch).
        self.sample_every_secs = 0.0
        #: at most this share of a flow's time goes to sampling (0: no limit): after an epoch whose
        #: samples took ``s`` seconds, the next sampled epoch starts no sooner than ``s / share`` later,
        #: so fast epochs are sampled every few seconds and the pipeline keeps its speed.
        self.sample_share = 0.0
        self._sampled_at: dict[str, float] = {}
        self._sample_cost: dict[str, float] = {}
        self._samples_taken: dict[str, int] = {}

    def wants_sample(self, flow: str) -> bool:
        """Whether this epoch of ``flow`` is sampled (sampling on, and its interval passed)."""
        if self.sample_rows <= 0 and not any(n > 0 for n in list(self.node_sample_rows.values())):
            return False
        now = time.monotonic()
        last = self._sampled_at.get(flow)
        if last is not None:
            budget = self._sample_cost.get(flow, 0.0) / self.sample_share if self.sample_share > 0 else 0.0
            if now - last < max(self.sample_every_secs, budget):
                return False
        self._sampled_at[flow] = now
        return True

    def sampled(self, flow: str, seconds: float) -> None:
        """What taking the samples of ``flow``'s last sampled epoch cost (for ``sample_share``).

        A flow's first sample pays for the session's cold start (the first Arrow collect, code
        generation) and would hold the next one off for minutes, so the monitor showed epoch #0 long
        after later ones ran: it sets no budget, the next epoch is sampled warm and its cost counts."""
        taken = self._samples_taken.get(flow, 0) + 1
        self._samples_taken[flow] = taken
        self._sample_cost[flow] = seconds if taken > 1 else 0.0

    def rows_to_sample(self, node: str) -> int:
        """Rows kept of ``node`` in a sampled epoch (0: the node is not sampled)."""
        return max(self.sample_rows, self.node_sample_rows.get(node, 0))

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(event)
            except Exception:  # noqa: BLE001 - observers must not stop the data
                log.exception("event subscriber %r failed on %s", fn, type(event).__name__)
