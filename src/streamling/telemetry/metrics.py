"""Streamling's metric vocabulary on the OpenTelemetry SDK, fed by a run's events.

Every series carries ``id`` (the node), ``topology_node_type``, ``operator_type`` and
``service_instance_id`` (= ``application_id``), the node's ``telemetry.labels`` and the
``global_tags``; the resource says ``service.name=streamling``. Counters are cumulative (Prometheus
shows ``…_total``); ``streamling_output_rows_delta`` is the rows of the last export interval.
Checkpoint series carry ``id="checkpoint_coordinator"`` and the flow. The same provider feeds a
Prometheus registry (the admin API's ``/metrics``) and, when configured, an OTLP exporter.
Telemetry that cannot start logs a warning and the pipeline runs without it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from streamling.runtime import events as ev
from streamling.telemetry.histogram import bucketed_supported, bucketed_view, record_buckets
from streamling.telemetry.stats import RunStats

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation
    from prometheus_client import CollectorRegistry

    from streamling.config import Settings

log = logging.getLogger(__name__)
COORDINATOR = "checkpoint_coordinator"
CHECKPOINT_COUNTERS = ("markers_sent", "acks_received", "epochs_succeeded", "epochs_failed", "finalizers_sent")


class PipelineMetrics:
    """The run's meter provider and instruments; subscribe it to the run's ``EventBus``."""

    def __init__(self, settings: Settings, stats: RunStats, prometheus: bool = True) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import DropAggregation, View
        from opentelemetry.sdk.resources import Resource

        from streamling.telemetry import otlp

        self.stats = stats
        self.settings = settings
        config = settings.open_telemetry_metrics
        self.global_tags = config.tags()
        self.interval_secs = config.batch_interval_secs
        readers: list[MetricReader] = []
        self.registry: CollectorRegistry | None = None
        if prometheus:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            self.registry = CollectorRegistry()
            readers.append(PrometheusMetricReader(registry=self.registry, disable_target_info=True))
        self.target = otlp.resolve(config)
        if self.target is not None:
            readers.append(PeriodicExportingMetricReader(otlp.exporter(*self.target),
                                                         export_interval_millis=self.interval_secs * 1000))
        denied = {n for name in config.metric_deny_list
                  for n in (name, "streamling_" + name.replace(".", "_"), name.replace(".", "_"))}
        views = [View(instrument_name=name, aggregation=DropAggregation()) for name in sorted(denied)]
        #: whether the lag histogram takes Spark's per-bucket counts whole (``telemetry.histogram``)
        self.bucketed = bucketed_supported()
        if self.bucketed and not denied & {"streamling_event_time_lag", "event_time_lag"}:
            views.append(bucketed_view("streamling_event_time_lag"))
        elif not self.bucketed:
            log.info("this OpenTelemetry SDK cannot take pre-bucketed counts: streamling_event_time_lag gets one "
                     "observation per bucket and epoch, its buckets are right but its count is not the rows'")
        resource = Resource.create({"service.name": "streamling", "service.instance.id": settings.application_id,
                                    **self.global_tags})
        self.provider = MeterProvider(resource=resource, metric_readers=readers, views=views)
        meter = self.provider.get_meter("streamling")
        self.output_rows = meter.create_counter("streamling_output_rows", description="rows a node emitted")
        self.input_rows = meter.create_counter("streamling_input_rows", description="rows a node received")
        self.compute = meter.create_histogram(
            "streamling_elapsed_compute", unit="ms",
            description="a node's own time in an epoch: a sink's write (Spark's fused job over every node "
                        "upstream); a source's or transform's step on the driver (planning its part of the DAG, "
                        "eager work)")
        self.checkpoint = {name: meter.create_counter(f"streamling_checkpoint_{name}") for name in CHECKPOINT_COUNTERS}
        self.epoch_duration = meter.create_histogram("streamling_checkpoint_epoch_duration", unit="ms",
                                                     description="epoch planned → finalized")
        self.finalization_wait = meter.create_histogram("streamling_checkpoint_finalization_wait", unit="ms",
                                                        description="epoch flushed → finalized")
        self.marker_arrival = meter.create_histogram("streamling_checkpoint_marker_arrival", unit="ms",
                                                     description="epoch planned → every sink flushed")
        self.sink_flush = meter.create_histogram("streamling_checkpoint_sink_flush", unit="ms")
        self.batch_duration = meter.create_histogram("streamling_batch_duration", unit="ms",
                                                     description="Spark's time for the epoch (triggerExecution)")
        self.event_time_lag = meter.create_histogram("streamling_event_time_lag", unit="ms",
                                                     description="per row: the epoch's start − its event time")
        self.expectation_rows = meter.create_counter("streamling_expectation_rows",
                                                     description="rows checked by an expectation, by result")
        meter.create_observable_gauge("streamling_checkpoint_epochs_in_flight", [self._in_flight])
        meter.create_observable_gauge("streamling_output_rows_delta", [self._delta],
                                      description="rows a node emitted in the last export interval")
        meter.create_observable_gauge("streamling_output_rows_rate", [self._rate], unit="{rows}/s")
        meter.create_observable_gauge("streamling_kafka_consumer_messages_lag", [self._lag])
        meter.create_observable_gauge("streamling_event_time_watermark", [self._watermark], unit="ms")
        meter.create_observable_gauge("streamling_input_rows_per_second", [self._input_rate], unit="{rows}/s")
        meter.create_observable_gauge("streamling_processed_rows_per_second", [self._processed_rate],
                                      unit="{rows}/s")
        self._planned: dict[tuple[str, int], float] = {}
        self._flushed: dict[tuple[str, int], float] = {}

    # --- tags ------------------------------------------------------------------------------------

    def tags(self, node: str) -> dict[str, str]:
        stats = self.stats.nodes.get(node)
        base = {"id": node, "topology_node_type": stats.kind if stats else "",
                "operator_type": stats.type if stats else "", "service_instance_id": self.settings.application_id}
        return {**self.global_tags, **(stats.labels if stats else {}), **base}

    def _coordinator(self, flow: str) -> dict[str, str]:
        return {**self.global_tags, "id": COORDINATOR, "flow": flow,
                "service_instance_id": self.settings.application_id}

    # --- events ----------------------------------------------------------------------------------

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.EpochPlanned):
            self._planned[(event.flow, event.epoch)] = event.at
            self.checkpoint["markers_sent"].add(1, self._coordinator(event.flow))
        elif isinstance(event, ev.EpochFlushed):
            self._on_flushed(event)
        elif isinstance(event, ev.EpochFinalized):
            self._on_finalized(event)
        elif isinstance(event, ev.PipelineError) and not event.retriable:
            self.checkpoint["epochs_failed"].add(1, self._coordinator(event.flow))

    def _on_flushed(self, event: ev.EpochFlushed) -> None:
        key = (event.flow, event.epoch)
        self._flushed[key] = event.at
        coordinator = self._coordinator(event.flow)
        self.checkpoint["acks_received"].add(len(event.rows), coordinator)
        if key in self._planned:
            self.marker_arrival.record((event.at - self._planned[key]) * 1000, coordinator)
        emitted = dict(event.node_rows)
        for sink, rows in event.rows.items():  # a sink's output is what it wrote
            self.input_rows.add(rows, self.tags(sink))
            self.output_rows.add(rows, self.tags(sink))
            ms = event.durations_ms.get(sink)
            if ms is not None:
                self.sink_flush.record(ms, {**coordinator, "sink": sink})
        compute = {**{s: event.durations_ms[s] for s in event.rows if s in event.durations_ms}, **event.compute_ms}
        for node, ms in compute.items():
            self.compute.record(ms, self.tags(node))
        for node, rows in emitted.items():
            self.output_rows.add(rows, self.tags(node))
            stats = self.stats.nodes.get(node)
            if stats is not None and stats.kind == "source":
                self.input_rows.add(rows, self.tags(node))
            elif stats is not None:
                received = sum(emitted.get(u, 0) for u in stats.upstream)
                self.input_rows.add(received, self.tags(node))
        for node, buckets in event.event_time_lag.items():
            record_buckets(self.event_time_lag, buckets, self.tags(node), self.bucketed)
        for node, results in event.expectations.items():
            for name, result in results.items():
                for outcome in ("passed", "failed"):
                    self.expectation_rows.add(int(result.get(outcome, 0)), {
                        **self.tags(node), "expectation": name, "result": outcome,
                        "action": str(result.get("action", ""))})

    def _on_finalized(self, event: ev.EpochFinalized) -> None:
        key = (event.flow, event.epoch)
        if key not in self._flushed:
            return  # a progress report for an epoch that is not committed yet
        coordinator = self._coordinator(event.flow)
        self.checkpoint["epochs_succeeded"].add(1, coordinator)
        self.checkpoint["finalizers_sent"].add(1, coordinator)
        planned = self._planned.pop(key, None)
        flushed = self._flushed.pop(key)
        if planned is not None:
            self.epoch_duration.record((event.at - planned) * 1000, coordinator)
        self.finalization_wait.record((event.at - flushed) * 1000, coordinator)
        trigger = event.durations_ms.get("triggerExecution")
        if trigger is not None:
            self.batch_duration.record(trigger, coordinator)

    # --- observable gauges -----------------------------------------------------------------------

    def _in_flight(self, _: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        counts: dict[str, int] = {flow: 0 for flow in self.stats.flows}
        for flow, _epoch in self._planned:
            counts[flow] = counts.get(flow, 0) + 1
        return [Observation(n, self._coordinator(flow)) for flow, n in counts.items()]

    def _delta(self, _: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        rows = self.stats.rows_since(self.interval_secs)
        return [Observation(rows.get(name, 0), self.tags(name)) for name in self.stats.nodes]

    def _rate(self, _: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(n.last_rate, self.tags(n.name)) for n in self.stats.nodes.values() if n.last_at]

    def _lag(self, _: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        out = []
        for node in self.stats.nodes.values():
            for where, behind in node.lag.items():
                topic, _sep, partition = where.rpartition("/")
                out.append(Observation(behind, {**self.tags(node.name), "topic": topic, "partition": partition}))
        return out

    def _watermark(self, _: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(n.event_time_ms, self.tags(n.name)) for n in self.stats.nodes.values()
                if n.event_time_ms is not None]

    def _flow_gauge(self, key: str) -> list[Observation]:
        from opentelemetry.metrics import Observation

        return [Observation(float(flow.get(key) or 0.0), self._coordinator(name))
                for name, flow in self.stats.flows.items()]

    def _input_rate(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._flow_gauge("input_rows_per_second")

    def _processed_rate(self, _: CallbackOptions) -> Iterable[Observation]:
        return self._flow_gauge("processed_rows_per_second")

    # --- lifecycle -------------------------------------------------------------------------------

    def prometheus_text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry) if self.registry is not None else b""

    def shutdown(self) -> None:
        """Export what is left (OTLP) and stop the readers."""
        try:
            self.provider.shutdown(timeout_millis=5_000)
        except Exception:  # noqa: BLE001 - telemetry never fails the run
            log.debug("telemetry shutdown failed", exc_info=True)


def start_metrics(settings: Settings, stats: RunStats, bus: ev.EventBus) -> PipelineMetrics | None:
    """Metrics for a run, subscribed to its bus; None (and a warning) when they cannot start."""
    try:
        metrics = PipelineMetrics(settings, stats)
    except Exception as exc:  # noqa: BLE001 - Streamling: telemetry failing to start never stops the pipeline
        log.warning("telemetry could not start, the pipeline runs without metrics: %s", exc)
        return None
    bus.subscribe(metrics)
    if metrics.target is not None:
        log.info("exporting metrics over OTLP (%s) to %s every %gs", metrics.target[1], metrics.target[0],
                 metrics.interval_secs)
    return metrics


__all__ = ["PipelineMetrics", "RunStats", "start_metrics"]
