"""Per-node metrics of an epoch, computed in the same pass as the sinks' writes.

A node's output DataFrame carries a Spark ``Observation`` (``df.observe``): its row count and,
where configured, the largest event time and expectation failures. Spark fills the observation when
a sink's job runs the plan, so counting costs no extra job; results are read without blocking once
the sinks have written (an observation whose plan no job ran stays unknown rather than waiting).

An observation is not free: Spark's ``CollectMetrics`` operator is not code-generated, so each one
in the middle of a plan splits its generated code and touches every row once more (on Kafka → SQL
→ blackhole, one per node cost a fifth of the throughput). A node whose plan provably keeps its
input's rows one for one (projections, renames, repartitions, sorts: checked on Spark's analysed
plan, never guessed from SQL text) is therefore not observed: its count is its input's.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

log = logging.getLogger(__name__)
ROWS = "rows"
#: the key suffix of a source's raw input (what it read, before decoding and its filter)
INPUT = "#input"
#: the key suffix of what a sink was given, counted by the flow for sinks that do not count
RECEIVED = "#received"
#: the key suffix of a sink's input observed for its ``telemetry.event_time`` (its rows are the sink's)
EVENT_TIME = "#event_time"
EVENT_TIME_MAX = "event_time_max"
#: the observed lag aggregates (``runtime.epoch_dag.event_time_aggregates``): the lags' two-bin histogram (its
#: centre × rows is their sum, ms) and the rows per lag bucket, as (bucket index, rows) pairs
LAG_SUM, LAG_BUCKETS = "lag_sum", "lag_buckets"
_ids = itertools.count()


#: logical operators that emit exactly one row per input row (the analysed plan's node names)
ROW_PRESERVING = frozenset({"Project", "SubqueryAlias", "View", "Repartition", "RepartitionByExpression",
                            "RebalancePartitions", "Sort", "ResolvedHint", "Window", "CollectMetrics"})


def keeps_rows(df: DataFrame, source: DataFrame) -> bool:
    """Whether ``df`` has exactly the rows of ``source`` one for one: walking down ``df``'s analysed plan
    reaches ``source``'s plan through row-preserving single-child operators only."""
    target = source._jdf.queryExecution().analyzed()
    node = df._jdf.queryExecution().analyzed()
    for _ in range(64):
        if node.equals(target):
            return True
        if node.nodeName() not in ROW_PRESERVING or node.children().size() != 1:
            return False
        node = node.children().head()
    return False


@dataclass
class EpochObservations:
    """The observations of one epoch's nodes, by node name.

    ``shapes`` remembers, per node, whether its plan keeps its input's rows; it is shared by the
    epochs of one flow, whose nodes keep their plan shape (same definitions, same input schemas).
    """

    observations: dict[str, Observation] = field(default_factory=dict)
    #: node → the observed node whose row count it has
    same_rows: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, bool] = field(default_factory=dict)
    #: whether sources' raw input is observed; False when Spark's scan metric counts it exactly
    observe_input: bool = True
    #: counts known without an observation (``given``), by key
    given: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: nodes whose only reader is a sink that counts exactly what it receives (node → sink): left
    #: unobserved, their count is that write's (the flow puts it in ``given``)
    by_sink: dict[str, str] = field(default_factory=dict)
    #: when the epoch started (epoch ms): the instant event-time lags are measured from
    start_ms: float = field(default_factory=lambda: time.time() * 1000)
    #: each source's and transform's step time on the driver (ms), by node (``runtime.flow.evaluate``)
    compute_ms: dict[str, float] = field(default_factory=dict)

    def count(self, node: str, df: DataFrame, like: tuple[str, DataFrame] | None = None,
              extra: dict[str, Column] | None = None) -> DataFrame:
        """``df``'s rows counted for ``node``: by its own observation, or, when there are no ``extra``
        aggregates, as ``like``'s when ``df`` keeps the rows of ``like`` (a counted node and its frame),
        or by the sink that alone reads it (``by_sink``)."""
        if like is not None and not extra:
            keeps = self.shapes.get(node)
            if keeps is None:
                try:
                    keeps = self.shapes[node] = keeps_rows(df, like[1])
                except Exception:  # noqa: BLE001 - a plan we cannot walk is simply observed
                    log.debug("walking the plan of %s failed", node, exc_info=True)
                    keeps = self.shapes[node] = False
            if keeps:
                self.same_rows[node] = like[0]
                return df
        if not extra and node in self.by_sink:
            return df
        return self.watch(node, df, extra)

    def watch(self, node: str, df: DataFrame, extra: dict[str, Column] | None = None) -> DataFrame:
        """``df`` observed: its rows counted (and ``extra`` aggregates computed) as sinks read it."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        obs = Observation(f"stl_{next(_ids)}")
        exprs = [F.count(F.lit(1)).alias(ROWS), *[e.alias(k) for k, e in (extra or {}).items()]]
        self.observations[node] = obs
        return df.observe(obs, *exprs)

    def results(self) -> dict[str, dict[str, Any]]:
        """Every observation Spark has filled, by node; nodes whose plan no job ran are left out."""
        out: dict[str, dict[str, Any]] = dict(self.given)
        for node, obs in self.observations.items():
            jo = getattr(obs, "_jo", None)
            try:
                if jo is None or not jo.future().isCompleted():
                    continue
                out[node] = dict(obs.get)
            except Exception:  # noqa: BLE001 - a metric must never fail the epoch
                log.debug("reading the observation of %s failed", node, exc_info=True)
        for node in self.same_rows:
            counted = self._counted_as(node)
            if counted in out:
                out[node] = {ROWS: out[counted][ROWS]}
        return out

    def _counted_as(self, node: str) -> str:
        seen = {node}
        while node in self.same_rows and self.same_rows[node] not in seen:
            node = self.same_rows[node]
            seen.add(node)
        return node


class Counted:
    """One DataFrame's rows counted as a write reads them (``on``), instead of by a job of its own."""

    def __init__(self) -> None:
        self._watch = EpochObservations()

    def on(self, df: DataFrame) -> DataFrame:
        return self._watch.watch("df", df)

    def done(self) -> bool:
        """Whether a job read the whole DataFrame (a write Delta skipped as already done reads nothing)."""
        return "df" in self._watch.results()

    def rows(self) -> int:
        return int(self._watch.results()["df"][ROWS])
