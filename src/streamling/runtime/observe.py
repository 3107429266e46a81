"""Per-node metrics of an epoch, computed in the same pass as the sinks' writes.

Each node's output DataFrame carries a Spark ``Observation`` (``df.observe``): its row count and,
where configured, the largest event time and expectation failures. Spark fills the observation when
a sink's job runs the plan, so counting costs no extra job; results are read without blocking once
the sinks have written (an observation whose plan no job ran stays unknown rather than waiting).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation

log = logging.getLogger(__name__)
ROWS = "rows"
#: the key suffix of a source's raw input (what it read, before decoding and its filter)
INPUT = "#input"
EVENT_TIME_MAX = "event_time_max"
_ids = itertools.count()


@dataclass
class EpochObservations:
    """The observations of one epoch's nodes, by node name."""

    observations: dict[str, Observation] = field(default_factory=dict)

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
        out: dict[str, dict[str, Any]] = {}
        for node, obs in self.observations.items():
            jo = getattr(obs, "_jo", None)
            try:
                if jo is None or not jo.future().isCompleted():
                    continue
                out[node] = dict(obs.get)
            except Exception:  # noqa: BLE001 - a metric must never fail the epoch
                log.debug("reading the observation of %s failed", node, exc_info=True)
        return out


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
