"""What a flow's epochs report besides their rows: how many rows each node had, the largest event
times, the expectations' results and samples of rows.

Counting must cost the epoch as little as it can while staying exact, so each count comes from the
cheapest exact place: a sink that counts what it writes, Spark's scan metric when one job read the
batch once, a recount of a retried epoch's cached batch, else an observation (``observe``).
``EpochCounts`` keeps what that choice needs from one epoch to the next.
"""

from __future__ import annotations

import decimal
import logging
from typing import TYPE_CHECKING, Any

from streamling.runtime import events as ev
from streamling.runtime import expectations
from streamling.runtime.nodes import Epoch, Sink, Source
from streamling.runtime.observe import EVENT_TIME, EVENT_TIME_MAX, ROWS, EpochObservations
from streamling.runtime.planner import Flow, Plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

#: the flow's log lines name the flow module, whichever part of it speaks
log = logging.getLogger("streamling.runtime.flow")


class EpochCounts:
    """The input counts of one flow's epochs, and what choosing how to count them needs."""

    def __init__(self, flow: Flow, sources: list[Source], sinks: list[Sink], side_outputs: bool) -> None:
        self.flow = flow
        # Input rows of epochs that were retried, counted once on the cached batch: Spark's
        # numInputRows adds up every re-execution of the batch's plan.
        self.retried_input: dict[int, int] = {}
        #: the epoch's source rows as the sources' observations counted them (exact, whatever else read them)
        self.observed_input: dict[int, int] = {}
        #: per node, whether its plan keeps its input's rows (then it shares its input's count)
        self.shapes: dict[str, bool] = {}
        #: whether the epoch's input count can be read from Spark's scan metric (see ``scanned_rows``)
        self.scan_counts = True
        #: nodes whose count is a sink's write, not an observation (``counted_by_sinks``): node → sink
        self.by_sink = counted_by_sinks(flow, sources, sinks, side_outputs)
        self.execution: Any = None  # the query's StreamExecution (JVM), for its epoch's plan

    def observations(self, observe_input: bool, start_ms: float) -> EpochObservations:
        """A fresh observation of one evaluation of the epoch."""
        return EpochObservations(shapes=self.shapes, observe_input=observe_input, by_sink=self.by_sink,
                                 start_ms=start_ms)

    def scanned_rows(self, query: StreamingQuery | None) -> int | None:
        """The rows the epoch's source scan produced, from Spark's own metric on the plan of the epoch
        in flight (exact when one job read the batch once). None, and the flow observes its input
        from the next epoch on, if the plan does not have exactly one scan with that metric."""
        try:
            if self.execution is None and query is not None:
                self.execution = query._jsq.streamingQuery()
            leaves = self.execution.lastExecution().executedPlan().collectLeaves()
            if leaves.size() == 1:
                return int(leaves.head().metrics().apply("numOutputRows").value())
        except Exception:  # noqa: BLE001 - an internal API: fall back to observing the input
            log.debug("reading the scan metric failed", exc_info=True)
        log.info("flow '%s': Spark's scan metric is not available; counting input rows by observation",
                 self.flow.name)
        self.scan_counts = False
        return None

    def count_input(self, batch: DataFrame, batch_id: int, cached: list[bool]) -> None:
        """Before an epoch's first retry: cache the batch so further attempts read it rather than
        the source, and count it once, so the epoch reports its real input however often it runs.
        Only retried epochs pay this job; a normal epoch keeps Spark's numInputRows."""
        try:
            if not cached[0]:
                batch.persist()
                cached[0] = True
            self.retried_input[batch_id] = batch.count()
        except Exception:  # noqa: BLE001 - a metric must never fail the epoch; the retry reports the cause
            log.debug("counting the input of retried epoch %d failed", batch_id, exc_info=True)

    def input_rows(self, batch_id: int, progress: dict[str, Any]) -> int:
        """The epoch's input: Spark's count, unless the epoch was retried (then counted by the flow)."""
        counted = self.retried_input.pop(batch_id, None)
        observed = self.observed_input.pop(batch_id, None)
        if counted is not None:
            return counted
        return observed if observed is not None else int(progress.get("numInputRows") or 0)


def counted_by_sinks(flow: Flow, sources: list[Source], sinks: list[Sink], side_outputs: bool) -> dict[str, str]:
    """Nodes whose rows one sink alone reads, as given, and counts exactly (``counts_received``,
    no expectations of its own): node → sink. Their count is the write's, not an observation's."""
    readers: dict[str, int] = {}
    for spec in [*flow.transforms, *flow.sinks]:
        for upstream in spec.upstream:
            readers[upstream] = readers.get(upstream, 0) + 1
    if side_outputs:  # side outputs read the sources' rows too
        for source in sources:
            readers[source.name] = readers.get(source.name, 0) + 1
    out: dict[str, str] = {}
    for sink in sinks:
        inputs = sink.ctx.spec.upstream
        if (sink.counts_rows and sink.counts_received and len(inputs) == 1 and readers[inputs[0]] == 1
                and not expectations.has_rules(sink)):
            out[inputs[0]] = sink.name
    return out


def expectation_results(plan: Plan, flow: Flow,
                        observed: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each transform's and sink's expectations as the epoch's observations found them, by node."""
    out = {}
    for spec in [*flow.transforms, *flow.sinks]:
        found = expectations.results(plan.nodes[spec.name], observed)
        if found:
            out[spec.name] = found
    return out


def event_times(plan: Plan, observed: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The largest event time of each node with ``telemetry.event_time``, in epoch milliseconds."""
    out: dict[str, float] = {}
    for key, values in observed.items():
        name = key.removesuffix(EVENT_TIME)  # a sink's input
        node = plan.nodes.get(name)
        value = values.get(EVENT_TIME_MAX)
        event_time = node.options.telemetry.event_time if node and node.options.telemetry else None
        if value is None or event_time is None:
            continue
        if hasattr(value, "timestamp"):  # a timestamp column
            out[name] = value.timestamp() * 1000
        elif isinstance(value, (int, float, decimal.Decimal)):  # others were reported when the run started
            scale = {"seconds": 1000.0, "milliseconds": 1.0, "microseconds": 0.001}[event_time.unit]
            out[name] = float(value) * scale
    return out


def publish_samples(bus: ev.EventBus, flow: str, epoch: Epoch, frames: dict[str, DataFrame],
                    observed: dict[str, dict[str, Any]]) -> None:
    """A few rows of every node (notebook monitor, live inspect); counts come from the observations."""
    for name, df in frames.items():
        n = bus.rows_to_sample(name)
        if n <= 0:
            continue
        try:
            table = df.limit(n).toArrow()
        except Exception:  # noqa: BLE001 - sampling is best effort, never fails the epoch
            log.debug("sampling %s failed", name, exc_info=True)
            continue
        count = observed.get(name, {}).get(ROWS)
        bus.publish(ev.RowsSampled(flow, epoch=epoch.epoch_id, node=name, columns=table.column_names,
                                   rows=table.to_pylist(), count=None if count is None else int(count),
                                   table=table))
