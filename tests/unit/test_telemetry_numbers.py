"""Telemetry without Spark: OTLP over http/json and grpc to real receivers, endpoint resolution,
a failed start that leaves the pipeline running, and the run's numbers folded from events."""

from __future__ import annotations

import logging

import pytest
from otlp_receiver import Receiver, serve_grpc, serve_http

from streamling.config import load_settings
from streamling.config.sections import OpenTelemetrySettings
from streamling.runtime import events as ev
from streamling.runtime.flow import partition_lag
from streamling.telemetry import otlp
from streamling.telemetry.metrics import start_metrics
from streamling.telemetry.stats import RunStats


def _export_one(endpoint: str, protocol: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    reader = PeriodicExportingMetricReader(otlp.exporter(endpoint, protocol), export_interval_millis=60_000)
    provider = MeterProvider(resource=Resource.create({"service.name": "streamling"}), metric_readers=[reader])
    provider.get_meter("streamling").create_counter("streamling_output_rows").add(42, {"id": "out"})
    provider.shutdown()


@pytest.mark.parametrize("protocol", ["http/json", "http/protobuf", "grpc"])
def test_each_otlp_protocol_reaches_a_real_receiver(protocol: str) -> None:
    receiver = Receiver()
    if protocol == "grpc":
        server, endpoint = serve_grpc(receiver)
    else:
        server, endpoint = serve_http(receiver)
    try:
        _export_one(endpoint, protocol)
    finally:
        server.stop(0) if protocol == "grpc" else server.shutdown()
    [point] = receiver.latest("streamling_output_rows")
    assert (point.value, point.attributes, point.resource["service.name"]) == (42, {"id": "out"}, "streamling")
    expected = {"http/json": "application/json", "http/protobuf": "application/x-protobuf", "grpc": "grpc"}
    assert receiver.content_types == [expected[protocol]]


def test_endpoint_and_protocol_come_from_the_config_then_the_otel_environment() -> None:
    none = OpenTelemetrySettings()
    assert otlp.resolve(none, environ={}) is None
    assert otlp.resolve(none, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == (
        "http://collector:4318/v1/metrics", "http/protobuf")
    assert otlp.resolve(none, environ={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "collector:4317",
                                       "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ("collector:4317", "grpc")
    mine = OpenTelemetrySettings(ingestion_endpoint="http://otel:4318/custom/path", endpoint_protocol="http/json")
    assert otlp.resolve(mine, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored"}) == (
        "http://otel:4318/custom/path", "http/json")


def test_telemetry_that_cannot_start_is_a_warning(caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "smoke-signals")
    caplog.set_level(logging.WARNING)
    assert start_metrics(load_settings(environ={}), RunStats(), ev.EventBus()) is None
    assert "telemetry could not start, the pipeline runs without metrics: OTLP protocol 'smoke-signals'" in caplog.text


def test_the_runs_numbers_are_folded_from_its_events() -> None:
    stats = RunStats(application_id="app")
    stats(ev.FlowStarted("f", query_id="q", sources=["src"], sinks=["out"], bounded=False))
    stats(ev.EpochPlanned("f", epoch=0))
    stats(ev.EpochFlushed("f", epoch=0, rows={"out": 7}, durations_ms={"out": 3.0}, node_rows={"src": 10, "t": 7},
                          expectations={"t": {"positive": {"passed": 7, "failed": 3, "action": "drop"}}}))
    assert stats.in_flight() == 1
    stats(ev.EpochFinalized("f", epoch=0, input_rows=10, offsets={}, durations_ms={},
                            lag={"src": {"orders/0": 5, "orders/1": 0}}))
    snap = stats.snapshot()
    assert (snap["nodes"]["src"]["output_rows"], snap["nodes"]["t"]["output_rows"], stats.rows_to_sinks()) == (10, 7, 7)
    assert snap["nodes"]["src"]["lag"] == {"orders/0": 5, "orders/1": 0}
    assert snap["nodes"]["t"]["expectations"]["positive"] == {"passed": 7, "failed": 3, "action": "drop"}
    assert snap["checkpoint"]["epochs_succeeded"] == 1 and stats.in_flight() == 0
    stats(ev.PipelineError("f", node="out", message="down", retriable=True, attempt=1))
    assert stats.status == "retrying"
    stats(ev.EpochFlushed("f", epoch=1, rows={"out": 1}, durations_ms={}))
    assert stats.status == "running"


def test_kafka_lag_per_partition_from_the_offsets_spark_reports() -> None:
    assert partition_lag({"t": {"0": 10, "1": 5}}, {"t": {"0": 25, "1": 5}}) == {"t/0": 15, "t/1": 0}
    assert partition_lag({"row": 10}, {"row": 20}) is None  # not Kafka offsets
