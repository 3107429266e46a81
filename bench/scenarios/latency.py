"""``latency``: how long a row waits between its creation and its commit, and what an epoch costs.

An unbounded generate source releases 10,000 rows/s by the clock (row ``i`` exists once the clock
reached it) → the blackhole SQL → blackhole, and → a Postgres upsert sink, in-process with
``checkpoint_interval_sec: 0`` (the next epoch starts as soon as the last one ends: the latency
setting). A row's latency is its epoch's commit time (its progress event reaching the driver's
Python) minus its release time; the rows an epoch takes were released, at the source's constant
rate, between the previous epoch's start and its own (its progress time less Spark's
``triggerExecution``), which places every row. Both sides are timed the same way. The hand-written
side is a ``foreachBatch`` over the same source running the same SQL into ``noop``: the difference
of the two sides' ``triggerExecution`` is the framework's fixed cost per epoch.
"""

from __future__ import annotations

import statistics
import textwrap
import threading
import time
from typing import Any

from scenarios.common import (
    Options,
    ScenarioResult,
    Side,
    bench_settings,
    interleaved,
    log,
    session_facts,
    shared_session,
    temp_dir,
)

NAME = "latency"
RATE = 10_000
SECONDS = 30.0
WARMUP_EPOCHS = 3
SQL = "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders WHERE amount > 100"
SOURCE = {"rows_per_second": RATE, "rows_per_batch": 1_000_000, "partitions": 2, "profile": "orders"}


def _latencies(epochs: list[tuple[float, float, int]]) -> list[float]:
    """Row latencies (ms) from ``(planned, committed, rows)`` per epoch, oldest first."""
    import numpy as np

    out: list[Any] = []
    for (prev_planned, _, _), (planned, committed, rows) in zip(epochs, epochs[1:], strict=False):
        if rows <= 0:
            continue
        released = np.linspace(prev_planned, planned, rows, endpoint=False)
        out.append((committed - released) * 1000)
    return list(np.concatenate(out)) if out else []


def _percentiles(values: list[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {"p50": float("nan"), "p99": float("nan")}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def _streamling(spark: Any, sink: dict[str, Any], seconds: float) -> dict[str, Any]:
    import yaml

    from streamling.runtime import events as ev
    from streamling.runtime.pipeline import PipelineRun
    from streamling.spec import parse_pipeline

    doc = {"sources": {"orders": {"type": "generate", "primary_key": "id", **SOURCE}},
           "transforms": {"filtered": {"type": "sql", "sql": SQL}}, "sinks": {"out": {**sink, "from": "filtered"}}}
    epochs: list[tuple[float, float, int]] = []
    spark_ms: list[float] = []  # Spark's triggerExecution of each epoch, as the hand-written side reports
    lock = threading.Lock()

    def on_event(event: ev.Event) -> None:
        now = time.perf_counter()
        with lock:
            if isinstance(event, ev.EpochFinalized) and event.input_rows:
                # as on the hand-written side: the epoch began triggerExecution before its progress arrived
                trigger = float(event.durations_ms.get("triggerExecution", float("nan")))
                epochs.append((now - trigger / 1000, now, int(event.input_rows)))
                spark_ms.append(trigger)

    bus = ev.EventBus()
    bus.subscribe(on_event)
    with temp_dir("latency") as workdir:
        settings = bench_settings(workdir, f"bench_latency_{sink['type']}", admin_api_port=0)
        run = PipelineRun(parse_pipeline(textwrap.dedent(yaml.safe_dump(doc))), settings, spark, bus)
        run.start()
        time.sleep(seconds)
        run.request_stop("latency measured")
        run.wait(timeout_secs=120)
        run.stop("latency measured")
    measured = epochs[WARMUP_EPOCHS:]
    return {"latency_ms": _percentiles(_latencies(measured)), "epochs": len(measured),
            "trigger_ms": statistics.median(spark_ms[WARMUP_EPOCHS:]) if measured else float("nan"),
            "rows_per_epoch": statistics.median(r for _, _, r in measured) if measured else float("nan")}


def _handwritten(spark: Any, seconds: float) -> dict[str, Any]:
    from pyspark.sql.streaming import StreamingQueryListener

    from streamling.sources.generate import generate_stream

    progress: list[dict[str, Any]] = []

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            return None

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if p.numInputRows:
                progress.append({"t": time.perf_counter(), "ms": float(p.durationMs.get("triggerExecution", 0)),
                                 "rows": int(p.numInputRows)})

        def onQueryIdle(self, event: Any) -> None:
            return None

        def onQueryTerminated(self, event: Any) -> None:
            return None

    def batch(df: Any, _id: int) -> None:
        df.createOrReplaceTempView("orders")
        df.sparkSession.sql(SQL).write.format("noop").mode("overwrite").save()

    listener = Listener()
    spark.streams.addListener(listener)
    try:
        with temp_dir("latency-hw") as workdir:
            query = (generate_stream(spark, SOURCE).writeStream.foreachBatch(batch)
                     .option("checkpointLocation", str(workdir / "checkpoint")).start())
            time.sleep(seconds)
            query.stop()
    finally:
        spark.streams.removeListener(listener)
    measured = progress[WARMUP_EPOCHS:]
    # Spark's progress time is the commit; the epoch was planned triggerExecution earlier.
    epochs = [(p["t"] - p["ms"] / 1000, p["t"], p["rows"]) for p in measured]
    return {"latency_ms": _percentiles(_latencies(epochs)), "epochs": len(measured),
            "trigger_ms": statistics.median(p["ms"] for p in measured) if measured else float("nan"),
            "rows_per_epoch": statistics.median(p["rows"] for p in measured) if measured else float("nan")}


def run(opts: Options) -> ScenarioResult:
    from scenarios.generate_sql_postgres import ensure_postgres

    spark = shared_session()
    seconds = SECONDS
    sides = {"blackhole": Side("blackhole"), "postgres": Side("postgres"), "hand-written": Side("hand-written")}
    no_postgres = ensure_postgres()
    runners = {"blackhole": lambda: _streamling(spark, {"type": "blackhole"}, seconds),
               "hand-written": lambda: _handwritten(spark, seconds)}
    if no_postgres is None:
        runners["postgres"] = lambda: _streamling(spark, {"type": "postgres", "schema": "bench",
                                                          "table": "latency"}, seconds)
    log(f"{NAME}: {opts.runs} rounds, {seconds:g}s per side at {RATE:,} rows/s")
    # One unmeasured run per side first, then ABBA: the side run first in a cold JVM paid for the
    # JIT (its Spark calls took ~30 % longer per epoch than the same calls made later).
    interleaved(opts.runs, runners, sides, log)
    result = ScenarioResult(NAME, {"rate": RATE, "seconds": seconds, "sql": SQL, "spark": session_facts(spark),
                                   **({"postgres": no_postgres} if no_postgres else {})}, sides)
    for name, side in sides.items():
        if not side.runs:
            continue
        result.figures[f"{name} p50 latency"] = (statistics.median(r["latency_ms"]["p50"] for r in side.runs), "ms")
        result.figures[f"{name} p99 latency"] = (statistics.median(r["latency_ms"]["p99"] for r in side.runs), "ms")
        result.figures[f"{name} epoch (Spark's triggerExecution)"] = (side.median("trigger_ms"), "ms")
        result.figures[f"{name} rows per epoch"] = (side.median("rows_per_epoch"), "rows")
    # Like for like: Spark's own triggerExecution of both sides' epochs (planning, foreachBatch, commit).
    hw, ours_spark = sides["hand-written"].median("trigger_ms"), sides["blackhole"].median("trigger_ms")
    result.ratios = {"triggerExecution, hand-written / blackhole": hw / ours_spark}
    result.notes.append(f"framework cost per epoch, both in Spark's triggerExecution: {ours_spark - hw:.0f} ms "
                        f"({(ours_spark - hw) / hw * 100:.0f} %)")
    return result
