"""Operating a run: OTLP export to a real receiver, the Prometheus scrape and the admin API while the
pipeline runs, expectations counted in the same pass, and the admin API during a retried failure."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Runner
from otlp_receiver import Receiver, free_port, serve_http
from prometheus_client.parser import text_string_to_metric_families

from streamling.plugins.discovery import load_plugins
from streamling.runtime import events as ev

SECRET = "hunter2-not-for-logs"
PIPELINE = """
sources:
  orders:
    type: generate
    rows_per_second: 3000
    primary_key: id
    telemetry:
      labels: {team: payments}
      event_time: {column: created_at}
transforms:
  big:
    type: sql
    sql: SELECT id, customer, amount, quantity, created_at, _gs_op FROM orders
    expectations:
      - {name: big_amount, condition: amount > 100, on_violation: drop}
      - {name: few_items, condition: quantity < 9, on_violation: warn}
sinks:
  out: {type: blackhole, from: big}
"""


def _scrape(port: int) -> dict[str, list[Any]]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_metrics_reach_an_otlp_receiver_and_a_prometheus_scrape_with_the_admin_api_live(
        runner: Runner, spark: Any) -> None:
    receiver = Receiver()
    server, endpoint = serve_http(receiver)
    port = free_port()
    runner.with_telemetry = True
    answers: dict[str, Any] = {}

    def enough(r: Runner) -> bool:
        finalized = [e for e in r.of_type(ev.EpochFinalized) if e.input_rows]
        if len(finalized) < 3:
            return False
        base = f"http://127.0.0.1:{port}"
        answers.update({path: httpx.get(base + path, timeout=10) for path in
                        ("/health/live", "/health/ready", "/topology", "/epochs?limit=5", "/inspect", "/config")})
        answers["scrape"] = _scrape(port)
        return True

    try:
        runner.run_until(PIPELINE, enough, checkpoint_interval_sec=0.5, admin_api_port=port,
                         live_data_inspect_enabled=True, live_data_inspect={"refresh_in_secs": 0.5},
                         open_telemetry_metrics={"ingestion_endpoint": endpoint, "batch_interval_secs": 60,
                                                 "global_tags": "region:eu-1"},
                         postgres_sink={"pass": SECRET})
    finally:
        runner.close_telemetry()  # the final export
        server.shutdown()

    flushed = {e.epoch: e for e in runner.of_type(ev.EpochFlushed)}
    committed = [e for e in runner.of_type(ev.EpochFinalized) if e.epoch in flushed]
    # OTLP: the SDK's exporter against a real receiver; values equal what the run reports
    assert receiver.content_types and all(t == "application/x-protobuf" for t in receiver.content_types)
    rows = {p.attributes["id"]: p for p in receiver.latest("streamling_output_rows")}
    assert rows["out"].value == sum(e.rows["out"] for e in flushed.values())  # rows that reached the sink
    assert rows["big"].value == sum(e.node_rows["big"] for e in flushed.values())
    assert rows["orders"].value == sum(e.node_rows["orders"] for e in flushed.values()) > rows["big"].value
    source = rows["orders"]
    assert source.resource["service.name"] == "streamling"
    assert source.resource["service.instance.id"] == "test_app"
    assert {k: source.attributes[k] for k in ("id", "topology_node_type", "operator_type", "service_instance_id",
                                              "team", "region")} == {
        "id": "orders", "topology_node_type": "source", "operator_type": "generate",
        "service_instance_id": "test_app", "team": "payments", "region": "eu-1"}
    [succeeded] = receiver.latest("streamling_checkpoint_epochs_succeeded")
    assert succeeded.value == len(committed) and succeeded.attributes["id"] == "checkpoint_coordinator"
    checks = {(p.attributes["expectation"], p.attributes["result"]): p.value
              for p in receiver.latest("streamling_expectation_rows")}
    assert checks[("big_amount", "passed")] + checks[("big_amount", "failed")] == rows["orders"].value
    assert checks[("big_amount", "passed")] == rows["big"].value  # dropped rows never reached the sink
    assert checks[("few_items", "failed")] > 0
    [watermark] = receiver.latest("streamling_event_time_watermark")
    assert watermark.attributes["id"] == "orders" and watermark.value > 1.7e12

    # the admin API answered while the pipeline ran, from the same numbers
    assert answers["/health/live"].status_code == 200
    assert answers["/health/ready"].json() == {"status": "running", "error": None}
    topology = answers["/topology"].json()
    assert topology["nodes"]["big"]["expectations"]["big_amount"]["action"] == "drop"
    assert topology["nodes"]["orders"]["rows_per_second"] > 0
    assert [e["state"] for e in answers["/epochs?limit=5"].json()["epochs"]][-1] in ("planned", "flushed",
                                                                                     "finalized")
    inspect = answers["/inspect"].json()
    assert inspect["enabled"] and 0 < len(inspect["nodes"]["big"]["rows"]) <= 15
    assert all(r["amount"] > 100 for r in inspect["nodes"]["big"]["rows"])
    assert all(SECRET not in response.text for key, response in answers.items() if key != "scrape")
    assert answers["/config"].json()["postgres_sink"]["pass"] == "***"
    scrape = answers["scrape"]
    assert any(s.labels["id"] == "out" and s.value > 0 for s in scrape["streamling_output_rows_total"])
    assert scrape["streamling_checkpoint_epochs_succeeded_total"][0].value >= 3
    assert "streamling_checkpoint_sink_flush_milliseconds_count" in scrape


def test_the_admin_api_reports_a_flow_stuck_retrying_as_not_ready(runner: Runner, tmp_path: Path) -> None:
    assert not load_plugins(str(Path(__file__).resolve().parents[2] / "fixtures" / "plugins"
                                / "journal_plugins.py"))
    port = free_port()
    runner.with_telemetry = True
    seen: dict[str, Any] = {}

    def retrying(_: Runner) -> bool:
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=5)
        except httpx.HTTPError:
            return False
        if ready.status_code != 503:
            return False
        seen.update(ready=ready.json(), live=httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=5))
        return True

    try:
        runner.run_until(f"""
            sources:
              counter: {{type: journal.counter, dir: {tmp_path}, batch: 10}}
            transforms:
              doubled: {{type: journal.flaky, from: counter, dir: {tmp_path}, fail_times: 1000}}
            sinks:
              out: {{type: blackhole, from: doubled}}
        """, retrying, timeout_secs=120, admin_api_port=port, checkpoint_interval_sec=0.5,
            retry={"max_attempts": 1000, "initial_backoff_ms": 100, "max_backoff_ms": 200})
    except Exception as exc:  # noqa: BLE001 - the stop interrupts the retry loop: that ends the run
        assert "stop requested while retrying" in str(exc), exc
    finally:
        runner.close_telemetry()
    assert seen["ready"]["status"] == "retrying"
    assert "journal.flaky transform 'doubled'" in seen["ready"]["error"] and "upstream busy" in seen["ready"]["error"]
    assert seen["live"].status_code == 200
    assert json.loads(seen["live"].text)["status"] == "live"


def test_an_event_time_column_that_cannot_be_one_is_said_once_and_the_rows_still_flow(
        runner: Runner, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="streamling.runtime.planner")
    runner.run("""
sources:
  orders:
    type: generate
    rows: 20
    rows_per_batch: 10
    telemetry: {event_time: {column: created}}
transforms:
  names:
    type: sql
    sql: SELECT id, customer FROM orders
    telemetry: {event_time: {column: customer}}
sinks:
  out: {type: blackhole, from: names}
""")
    skipped = [r.getMessage() for r in caplog.records if "event-time instrumentation skipped" in r.getMessage()]
    assert skipped == [
        "generate source 'orders': event-time instrumentation skipped: its output has no column 'created' (did you "
        "mean 'created_at'?) (telemetry.event_time.column)",
        "sql transform 'names': event-time instrumentation skipped: column 'customer' is string, not a timestamp or "
        "a number (telemetry.event_time.column)"]
    flushed = runner.of_type(ev.EpochFlushed)
    assert runner.input_rows() == 20 and len(flushed) == 2
    assert all(not e.event_time_ms and not e.event_time_lag for e in flushed)


def test_a_sink_with_an_event_time_has_its_own_watermark(runner: Runner, caplog: pytest.LogCaptureFixture) -> None:
    """Streamling's event-time series cover sinks too (what reached them); a sink's column is looked
    for in its input, and a missing one is said once, as for other nodes."""
    caplog.set_level(logging.WARNING, logger="streamling.runtime.planner")
    runner.run("""
sources:
  orders: {type: generate, rows: 20, rows_per_batch: 10, telemetry: {event_time: {column: created_at}}}
transforms:
  recent:
    type: sql
    sql: SELECT id, created_at, _gs_op FROM orders WHERE id % 2 = 0
sinks:
  out: {type: blackhole, from: recent, telemetry: {event_time: {column: created_at}}}
  other: {type: blackhole, from: recent, telemetry: {event_time: {column: created}}}
""")
    flushed = runner.of_type(ev.EpochFlushed)
    assert len(flushed) == 2
    for epoch in flushed:
        assert set(epoch.event_time_ms) == {"orders", "out"}, epoch.event_time_ms
        assert 1.7e12 < epoch.event_time_ms["out"] <= epoch.event_time_ms["orders"]
        assert "out" not in epoch.node_rows and epoch.rows["out"] == 5
    skipped = [r.getMessage() for r in caplog.records if "event-time instrumentation skipped" in r.getMessage()]
    assert skipped == ["blackhole sink 'other': event-time instrumentation skipped: its input has no column "
                       "'created' (did you mean 'created_at'?) (telemetry.event_time.column)"]


def test_event_time_lags_are_counted_per_row_into_the_histograms_buckets_by_spark(spark: Any) -> None:
    """The aggregates an observation adds for an event time give, per bucket, the rows a per-row
    histogram would have put there: a timestamp and a number column, rows from the future at 0, rows
    without an event time left out."""
    from datetime import UTC, datetime

    from streamling.runtime.epoch_dag import event_time_aggregates
    from streamling.runtime.flow import _lags
    from streamling.telemetry.histogram import Buckets

    start_ms = 1_750_000_000_000.0
    lags = [0.0, 4.0, 5.0, 6.0, 250.0, 9_999.0, 3_600_000.0, -30.0]  # the last one is in the future
    rows = [(datetime.fromtimestamp((start_ms - lag) / 1000, tz=UTC), int((start_ms - lag) / 1000 * 1e6),
             (start_ms - lag) / 1000) for lag in lags] + [(None, None, None)]
    df = spark.createDataFrame(rows, "ts TIMESTAMP, us LONG, secs DOUBLE").repartition(3)  # partial counts merge
    df = df.withColumn("ntz", df.ts.cast("timestamp_ntz"))
    expected = [max(0.0, lag) for lag in lags]
    per_row = Buckets.of(expected).counts  # as the SDK buckets each value
    assert per_row[:3] == (2, 2, 1) and per_row[-1] == 1
    for column, kind, unit in (("ts", "timestamp", "seconds"), ("ntz", "timestamp_ntz", "seconds"),
                               ("us", "number", "microseconds"), ("secs", "number", "seconds")):
        aggregates = event_time_aggregates(column, kind, unit, start_ms)
        observed = df.agg(*[e.alias(k) for k, e in aggregates.items()]).first().asDict()
        buckets = _lags({"node": observed})["node"]
        assert buckets.counts == per_row, column
        assert buckets.count == 8
        assert buckets.sum == pytest.approx(sum(expected), abs=0.01)


def test_event_time_metrics_across_source_transform_and_sink(runner: Runner) -> None:
    """As Streamling exports them: a lag observation per row and a watermark for the source, the
    transform and the sink that name an event time, and an elapsed_compute series for the SQL
    transform, read from the Prometheus registry as a scrape shows them."""
    runner.with_telemetry = True
    try:
        runner.run("""
sources:
  orders: {type: generate, rows: 20, rows_per_batch: 10, telemetry: {event_time: {column: created_at}}}
transforms:
  recent:
    type: sql
    sql: SELECT id, created_at, _gs_op FROM orders WHERE id % 4 = 0
    telemetry: {event_time: {column: created_at}}
sinks:
  out: {type: blackhole, from: recent, telemetry: {event_time: {column: created_at}}}
""", admin_api_port=0)
        text = runner.telemetry.metrics.prometheus_text().decode()
    finally:
        runner.close_telemetry()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def by_node(name: str) -> dict[str, float]:
        return {s.labels["id"]: s.value for s in samples if s.name == name}

    flushed = runner.of_type(ev.EpochFlushed)
    assert len(flushed) == 2
    to_sink = sum(e.rows["out"] for e in flushed)
    assert to_sink == 5
    assert by_node("streamling_event_time_lag_milliseconds_count") == {"orders": 20, "recent": 5, "out": 5}
    watermarks = by_node("streamling_event_time_watermark_milliseconds")
    assert set(watermarks) == {"orders", "recent", "out"} and all(v > 1.7e12 for v in watermarks.values())
    assert watermarks["recent"] == watermarks["out"] <= watermarks["orders"]
    compute = by_node("streamling_elapsed_compute_milliseconds_count")
    assert compute["recent"] == 2 and compute["orders"] == 2 and compute["out"] == 2
