"""Event-time and compute metrics without Spark: Spark's per-bucket lag counts reach the lag
histogram as if every row had been recorded, every node's compute time is exported, and a node's
watermark never goes back."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from streamling.config import load_settings
from streamling.runtime import events as ev
from streamling.telemetry.histogram import LAG_BOUNDARIES_MS, Buckets, bucketed_supported
from streamling.telemetry.metrics import PipelineMetrics
from streamling.telemetry.stats import NodeStats, RunStats

#: ten rows' lags (ms), as Streamling would record them one by one
LAGS = [0.0, 0.0, 3.0, 5.0, 7.5, 99.0, 100.0, 2600.0, 12_000.0, 86_400_000.0]


def _bucketed(lags: list[float]) -> Buckets:
    """What Spark's observation counts for ``lags`` (``runtime.flow.event_time_aggregates``): rows
    whose lag is within each boundary, told apart from the rows within the one before."""
    at_most = [sum(1 for v in lags if v <= bound) for bound in LAG_BOUNDARIES_MS]
    counts = [n - below for n, below in zip([*at_most, len(lags)], [0, *at_most], strict=True)]
    return Buckets(tuple(counts), sum(lags))


def _metrics() -> PipelineMetrics:
    stats = RunStats(application_id="app")
    for name, kind, upstream in (("src", "source", []), ("t", "transform", ["src"]), ("out", "sink", ["t"])):
        stats.nodes[name] = NodeStats(name, kind, "x", upstream, {})
    return PipelineMetrics(load_settings(environ={}), stats)


def _samples(metrics: PipelineMetrics, name: str) -> list[Any]:
    return [s for family in text_string_to_metric_families(metrics.prometheus_text().decode())
            for s in family.samples if s.name == name]


def _histogram(metrics: PipelineMetrics, node: str, base: str = "streamling_event_time_lag_milliseconds"
               ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for suffix in ("_count", "_sum", "_bucket"):
        for s in _samples(metrics, base + suffix):
            if s.labels["id"] == node:
                key = suffix + (s.labels["le"] if suffix == "_bucket" else "")
                out[key] = s.value
    return out


def test_pre_bucketed_lags_export_exactly_what_recording_every_row_would() -> None:
    assert bucketed_supported()
    batch = _bucketed(LAGS)
    assert batch.counts[:5] == (2, 2, 1, 0, 0) and batch.counts[-1] == 2 and batch.count == 10
    assert batch == Buckets.of(LAGS)  # as the SDK buckets each value
    fed, recorded = _metrics(), _metrics()
    fed(ev.EpochFlushed("f", epoch=0, rows={"out": 10}, durations_ms={}, event_time_lag={"src": batch}))
    for lag in LAGS:  # the per-row reference: Streamling's histogram
        recorded.event_time_lag.record(lag, recorded.tags("src"))
    exported = _histogram(fed, "src")
    assert exported == _histogram(recorded, "src")
    assert exported["_count"] == 10 and exported["_sum"] == sum(LAGS)
    assert (exported["_bucket0.0"], exported["_bucket5.0"], exported["_bucket+Inf"]) == (2, 4, 10)
    # a second epoch adds up (cumulative, as Prometheus and OTLP read it)
    fed(ev.EpochFlushed("f", epoch=1, rows={"out": 3}, durations_ms={}, event_time_lag={"src": _bucketed([1, 2, 3])}))
    assert _histogram(fed, "src")["_count"] == 13


def test_elapsed_compute_is_exported_for_transforms_and_sources_as_well_as_sinks() -> None:
    metrics = _metrics()
    metrics(ev.EpochFlushed("f", epoch=0, rows={"out": 5}, durations_ms={"out": 40.0, "transforms": 9.0},
                            compute_ms={"src": 2.0, "t": 7.0, "out": 40.0}))
    metrics(ev.EpochFlushed("f", epoch=1, rows={"out": 5}, durations_ms={"out": 30.0}))  # older events: sinks
    compute = {node: _histogram(metrics, node, "streamling_elapsed_compute_milliseconds")
               for node in ("src", "t", "out")}
    assert {n: (h["_count"], h["_sum"]) for n, h in compute.items()} == {
        "src": (1, 2.0), "t": (1, 7.0), "out": (2, 70.0)}


def test_each_nodes_watermark_is_its_largest_event_time_so_far() -> None:
    metrics = _metrics()
    metrics.stats(ev.EpochFlushed("f", epoch=0, rows={"out": 1}, durations_ms={},
                                  event_time_ms={"src": 2000.0, "t": 1500.0, "out": 1500.0}))
    metrics.stats(ev.EpochFlushed("f", epoch=1, rows={"out": 1}, durations_ms={},
                                  event_time_ms={"src": 1000.0, "t": 1800.0, "out": 1800.0}))  # late rows
    watermarks = {s.labels["id"]: s.value for s in _samples(metrics, "streamling_event_time_watermark_milliseconds")}
    assert watermarks == {"src": 2000.0, "t": 1800.0, "out": 1800.0}
