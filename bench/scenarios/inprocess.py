"""Timed in-process runs on the shared SparkSession: a streamling pipeline via ``PipelineRun``,
and the hand-written equivalent (same ``generate`` source, plain ``foreachBatch``).

Both sides are timed the same way: from just before the query is started until Spark reports the
last epoch committed (``commits/N``, seen through a query listener), so the difference between
them is exactly what streamling adds around the same Spark work.
"""

from __future__ import annotations

import statistics
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scenarios.common import bench_settings
from scenarios.profiling import phase_timers, summarize_timings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from streamling.runtime import events as ev

#: what a hand-written job does with one micro-batch; returns the rows written when it knows them.
BatchFn = Callable[["DataFrame", int], int | None]


def generate_yaml(source: dict[str, Any], sql: str, sink: dict[str, Any]) -> str:
    """generate → one SQL transform → one sink; the shape every throughput scenario uses."""
    import yaml

    doc = {
        "sources": {"orders": {"type": "generate", "primary_key": "id", **source}},
        "transforms": {"filtered": {"type": "sql", "sql": sql}},
        "sinks": {"out": {**sink, "from": "filtered"}},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _summary(t0: float, flushed: list[dict[str, Any]], finalized: list[dict[str, Any]], stopped: float,
             source_rows: int) -> dict[str, Any]:
    end = max((e["t"] for e in finalized), default=float("nan"))
    flush_end = max((e["t"] for e in flushed), default=float("nan"))
    wall = end - t0
    return {
        "wall_s": wall,
        "flush_wall_s": flush_end - t0,
        "total_s": stopped - t0,
        "rows_per_s": source_rows / wall if wall > 0 else float("nan"),
        "epochs": len(finalized),
        "input_rows": sum(int(e.get("input_rows", 0)) for e in finalized),
        "epoch_ms": [round(e["ms"], 1) for e in flushed],
        "spark_ms": [e.get("spark_ms", {}) for e in finalized],
        "first_epoch_after_s": (min((e["t"] for e in flushed), default=float("nan")) - t0),
        "flushed": [{k: v for k, v in e.items() if k != "t"} for e in flushed],
    }


def run_streamling(spark: SparkSession, yaml_text: str, workdir: Path, source_rows: int,
                   phases: Sequence[str] = (), telemetry: bool = False, sample_rows: int = 0, sample_share: float = 0.0,
                   **settings_overrides: Any) -> dict[str, Any]:
    """Run one pipeline to its end with ``PipelineRun`` and time it from ``start()``.

    ``phases`` (``"module:Class.method"``) are timed during the run and reported under
    ``"phases"``; a wrapper costs microseconds per call, so every measured run carries its own
    breakdown and can be compared with the hand-written run of the same round.
    """
    from streamling.runtime import events as ev
    from streamling.runtime.pipeline import PipelineRun
    from streamling.spec import parse_pipeline

    flushed: list[dict[str, Any]] = []
    finalized: list[dict[str, Any]] = []

    def on_event(event: ev.Event) -> None:
        now = time.perf_counter()
        if isinstance(event, ev.EpochFlushed):
            flushed.append({"t": now, "epoch": event.epoch, "ms": event.durations_ms.get("total", 0.0),
                            "durations_ms": {k: round(v, 1) for k, v in event.durations_ms.items()},
                            "rows": event.rows})
        elif isinstance(event, ev.EpochFinalized):
            finalized.append({"t": now, "epoch": event.epoch, "input_rows": event.input_rows,
                              "spark_ms": _spark_phases(event.durations_ms)})

    bus = _bus(on_event)
    settings = bench_settings(workdir, f"bench_{workdir.name.replace('-', '_')}", **settings_overrides)
    spec = parse_pipeline(textwrap.dedent(yaml_text))
    run = PipelineRun(spec, settings, spark, bus)
    bus.sample_rows = sample_rows  # the notebook monitor's sampling
    bus.sample_share = sample_share
    attached = None
    if telemetry:  # what a CLI run attaches: stats, metrics (Prometheus registry), admin API, live inspect
        from streamling.telemetry.attach import attach

        attached = attach(run.plan, settings, bus)
    with phase_timers(phases) as timings:
        t0 = time.perf_counter()
        run.start()
        started = time.perf_counter()
        try:
            run.wait(timeout_secs=1800)
        finally:
            run.stop("benchmark run finished")
            if attached is not None:
                attached.close()
        stopped = time.perf_counter()
    out = _summary(t0, flushed, finalized, stopped, source_rows)
    out["start_call_s"] = started - t0
    out["phases"] = summarize_timings(timings)
    return out


def _bus(fn: Callable[[ev.Event], None]) -> ev.EventBus:
    from streamling.runtime import events as ev

    bus = ev.EventBus()
    bus.subscribe(fn)
    return bus


def _spark_phases(durations: dict[str, Any]) -> dict[str, float]:
    """Spark's own per-trigger breakdown (``addBatch`` is our foreachBatch, the rest is Spark's
    planning, offset log and commit log work)."""
    keep = ("triggerExecution", "addBatch", "latestOffset", "getBatch", "queryPlanning", "walCommit",
            "commitOffsets", "commitBatch")
    return {k: float(durations[k]) for k in keep if k in durations}


class _CommitListener:
    """Records when Spark reports each committed batch of one query (the hand-written side)."""

    def __init__(self) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        self.query_id: str | None = None
        self.finalized: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                return None

            def onQueryProgress(self, event: Any) -> None:
                now = time.perf_counter()
                progress = event.progress
                with outer._lock:
                    outer.finalized.append({"t": now, "query_id": str(progress.id), "epoch": progress.batchId,
                                            "input_rows": progress.numInputRows,
                                            "spark_ms": _spark_phases(dict(progress.durationMs))})

            def onQueryIdle(self, event: Any) -> None:
                return None

            def onQueryTerminated(self, event: Any) -> None:
                return None

        self.listener = Listener()

    def for_query(self, query_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.finalized if e["query_id"] == query_id]


def run_handwritten(spark: SparkSession, source_options: dict[str, Any], process: BatchFn, workdir: Path,
                    source_rows: int) -> dict[str, Any]:
    """The job a PySpark user would write by hand: readStream of the same source, availableNow,
    ``foreachBatch(process)``, checkpoint in a fresh directory."""
    from streamling.sources.generate import generate_stream

    flushed: list[dict[str, Any]] = []

    def batch_fn(batch: DataFrame, batch_id: int) -> None:
        t = time.perf_counter()
        rows = process(batch, batch_id)
        now = time.perf_counter()
        flushed.append({"t": now, "epoch": batch_id, "ms": (now - t) * 1000, "rows": rows})

    commits = _CommitListener()
    spark.streams.addListener(commits.listener)
    try:
        t0 = time.perf_counter()
        query = (generate_stream(spark, source_options).writeStream.foreachBatch(batch_fn)
                 .option("checkpointLocation", str(workdir / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        stopped = time.perf_counter()
        if query.exception() is not None:
            raise RuntimeError(f"hand-written query failed: {query.exception()}")
        expected = len(flushed)
        deadline = time.monotonic() + 5
        while len(commits.for_query(str(query.id))) < expected and time.monotonic() < deadline:
            time.sleep(0.01)  # progress events reach Python asynchronously, as in streamling
    finally:
        spark.streams.removeListener(commits.listener)
    return _summary(t0, flushed, commits.for_query(str(query.id)), stopped, source_rows)


#: the runtime's phase functions timed in every streamling run (missing ones are skipped).
RUNTIME_PHASES = (
    "streamling.runtime.pipeline:PipelineRun.start",
    "streamling.runtime.pipeline:analyze",
    "pyspark.sql.streaming.query:StreamingQueryManager.addListener",
    "streamling.runtime.flow:FlowRunner.start",
    "streamling.runtime.flow:FlowRunner._input_frame",
    "streamling.runtime.flow:FlowRunner._run_epoch",
    "streamling.transforms.sql:SqlTransform.apply",
    "streamling.runtime.flow:FlowRunner.on_progress",
    "streamling.runtime.pipeline:PipelineRun.stop",
)


def phase_medians(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase, across runs: calls per run and the median of each run's median and total ms."""
    labels: dict[str, None] = {}
    for run in runs:
        labels.update(dict.fromkeys(run.get("phases", {})))
    out: dict[str, dict[str, float]] = {}
    for label in labels:
        per_run = [run["phases"][label] for run in runs if label in run.get("phases", {})]
        out[label] = {"calls": statistics.median(p["calls"] for p in per_run),
                      "median_ms": round(statistics.median(p["median_ms"] for p in per_run), 1),
                      "total_ms": round(statistics.median(p["total_ms"] for p in per_run), 1)}
    return out
