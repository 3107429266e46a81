"""An epoch's DAG: each source's rows decoded, each transform applied, every node's output observed.

One function, ``evaluate``, serves the flow's ``foreachBatch`` and the notebook's previews and
transform debugging alike, so what a user debugs is exactly what runs. The observation it adds
(rows, and with ``telemetry.event_time`` the watermark and the lags) rides on the sinks' own jobs.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from streamling.runtime import expectations
from streamling.runtime.nodes import Epoch, Node, Source, Transform
from streamling.runtime.observe import EVENT_TIME_MAX, INPUT, LAG_BUCKETS, LAG_SUM, EpochObservations
from streamling.runtime.planner import Flow, Plan, event_time_kind
from streamling.telemetry.histogram import LAG_BOUNDARIES_MS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: the flow's log lines name the flow module, whichever part of it speaks
log = logging.getLogger("streamling.runtime.flow")


def evaluate(plan: Plan, flow: Flow, spark: SparkSession, raw: dict[str, DataFrame], epoch: Epoch | None,
             upto: str | None = None, watch: EpochObservations | None = None) -> dict[str, DataFrame]:
    """Decode each source's raw rows and apply the flow's transforms in dependency order.

    The one place an epoch's DAG is evaluated: the flow's ``foreachBatch`` calls it on the
    micro-batch, and notebook previews and transform debugging call it on captured batches, so
    what a user debugs is exactly what runs. ``upto`` stops after that node. With ``watch``, every
    node's output is observed (rows, event time) in the same pass as the sinks' writes, and each
    node's step is timed into ``watch.compute_ms``.

    That step time is what a source's or transform's ``streamling_elapsed_compute`` reports: the
    driver's time for the node's part of the epoch (SQL parsing and analysis, building its plan, and
    any work a node does eagerly, such as a dynamic table's lookup). Its row work is not in it: Spark
    runs every node's rows fused into the sinks' jobs (whole-stage code generation), where no
    operator-level clock separates one node's rows from another's, so that time is in the sinks'
    figure (a sink's write runs the rows of every node upstream of it).
    """
    frames: dict[str, DataFrame] = {}
    for source in plan.sources(flow):
        t0 = time.perf_counter()
        read = raw[source.name]
        if watch is not None and watch.observe_input:
            read = watch.watch(source.name + INPUT, read)
        frame = source.spread(source.decode(read, epoch))
        frames[source.name] = _watched(plan, watch, source, frame, (source.name + INPUT, read))
        if watch is not None:
            watch.compute_ms[source.name] = (time.perf_counter() - t0) * 1000
        if source.name == upto:
            return frames
    for node in plan.transforms(flow):
        t0 = time.perf_counter()
        spec = node.ctx.spec
        frame = node.apply(spark, {u: node.spread(frames[u]) for u in spec.upstream}, epoch)
        frames[spec.name] = _watched(plan, watch, node, expectations.guard(node, frame, watch),
                                     only_input(spec, frames))
        if watch is not None:
            watch.compute_ms[spec.name] = (time.perf_counter() - t0) * 1000
        if spec.name == upto:
            break
    return frames


def only_input(spec: Any, frames: dict[str, DataFrame]) -> tuple[str, DataFrame] | None:
    """A node's single input and its frame (whose count it may share), None when it reads several."""
    return (spec.upstream[0], frames[spec.upstream[0]]) if len(spec.upstream) == 1 else None


def event_time_aggregates(column: str, kind: str, unit: str, start_ms: float) -> dict[str, Column]:
    """The aggregates an observation adds for an event-time column: its largest value (the watermark)
    and its rows' lags, ``start_ms`` − event time in ms (0 for a row from the future), bucketed as the
    lag histogram buckets them (``telemetry.histogram``); rows without an event time are left out.

    Each aggregate of an observation costs every row an interpreted update (Spark's ``CollectMetrics``
    is not code-generated): one ``count_if`` per bucket made an event-time node three times slower.
    So each row gets its bucket's index from a few comparisons of the column with per-bucket
    thresholds that are constants of the epoch (a binary search of ``when``s, no arithmetic on the
    row), and a single ``histogram_numeric`` counts rows per index: with more bins than indexes it
    never merges two indexes, so its counts are exact. The lags' total comes from a second
    ``histogram_numeric``, of two bins, over the lags themselves: merging two bins keeps the sum of
    centre × rows, so that sum is the lags' total (in doubles: whole milliseconds for a timestamp
    column, no overflow). ``histogram_numeric`` updates its buffer directly, where a ``sum`` is an
    interpreted expression per row: a ``try_sum`` cost an event-time pipeline 0.1–0.15 of its
    throughput more (``bench/run.py telemetry``). No extra job, no Python per row."""
    from pyspark.sql import functions as F

    col = F.col(f"`{column}`")
    if kind == "number":
        scale = {"seconds": 1000.0, "milliseconds": 1.0, "microseconds": 0.001}[unit]
        thresholds = [F.lit((start_ms - bound) / scale) for bound in LAG_BOUNDARIES_MS]
        behind = F.least(col.cast("double") * F.lit(scale) - F.lit(float(start_ms)), F.lit(0.0))
    else:  # a timestamp: compared as one, summed in whole milliseconds
        start_us = int(start_ms * 1000)
        thresholds = [F.timestamp_micros(F.lit(start_us - int(bound * 1000))) for bound in LAG_BOUNDARIES_MS]
        if kind == "timestamp_ntz":
            thresholds = [t.cast("timestamp_ntz") for t in thresholds]
        millis = F.unix_millis(col if kind == "timestamp" else col.cast("timestamp"))
        behind = F.least(millis - F.lit(int(start_ms)), F.lit(0))
    last = len(thresholds)

    def index(lo: int, hi: int) -> Column:  # the first bucket i in [lo, hi] whose bound the lag is within
        if lo == hi:  # past every threshold only when the column is older than the last one (not null)
            return F.lit(lo) if lo < last else F.when(col < thresholds[-1], F.lit(lo))
        mid = (lo + hi) // 2
        return F.when(col >= thresholds[mid], index(lo, mid)).otherwise(index(mid + 1, hi))

    return {EVENT_TIME_MAX: F.max(col), LAG_SUM: F.histogram_numeric(behind.cast("double"), F.lit(2)),
            LAG_BUCKETS: F.histogram_numeric(index(0, last), F.lit(2 * (last + 1)))}


def event_time_extra(plan: Plan, watch: EpochObservations, node: Node, frame: DataFrame) -> dict[str, Column]:
    """``event_time_aggregates`` for ``frame`` (a node's output, a sink's input) when the node has
    ``telemetry.event_time`` and its column can be one (the planner's verdict; a node it could not
    type is checked once here, on the frame, and said once otherwise)."""
    event_time = node.options.telemetry.event_time if node.options.telemetry else None
    if event_time is None:
        return {}
    if node.name not in plan.event_time_kinds:
        try:
            plan.event_time_kinds[node.name] = event_time_kind(node.ctx.spec.label, node.ctx.spec.kind,
                                                               event_time.column, frame.schema)
        except Exception:  # noqa: BLE001 - a metric must never fail the epoch
            log.debug("typing the event-time column of %s failed", node.name, exc_info=True)
            plan.event_time_kinds[node.name] = None
    kind = plan.event_time_kinds[node.name]
    if kind is None:
        return {}
    return event_time_aggregates(event_time.column, kind, event_time.unit, watch.start_ms)


def _watched(plan: Plan, watch: EpochObservations | None, node: Source | Transform, frame: DataFrame,
             like: tuple[str, DataFrame] | None) -> DataFrame:
    """``frame`` counted (and its event time observed) as ``node``'s output; ``like`` is its input,
    whose count it shares when its plan keeps the input's rows."""
    if watch is None:
        return frame
    return watch.count(node.name, frame, like, event_time_extra(plan, watch, node, frame))
