"""The OTLP exporter for ``open_telemetry_metrics``: the OpenTelemetry SDK's own exporters.

``http/protobuf`` and ``grpc`` are the SDK's OTLP exporters; ``http/json`` (which the Python SDK does
not ship) encodes the SDK's own protobuf request as OTLP/JSON (camelCase fields, enums as integers,
64-bit integers as strings, as the OTLP specification allows). The endpoint and protocol come from
the config, else from ``OTEL_EXPORTER_OTLP_METRICS_*`` / ``OTEL_EXPORTER_OTLP_*`` like any OTel SDK.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

    from streamling.config.sections import OpenTelemetrySettings

PROTOCOLS = ("http/protobuf", "http/json", "grpc")


def resolve(settings: OpenTelemetrySettings, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(endpoint, protocol)`` to export to, or None when nothing is configured."""
    env = os.environ if environ is None else environ
    endpoint = settings.ingestion_endpoint.strip()
    if endpoint.lower() in ("", "none"):
        endpoint = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "")
        if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            base = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/")
            endpoint = base  # the signal path is added below for HTTP
    if not endpoint:
        return None
    protocol = (settings.endpoint_protocol or env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol not in PROTOCOLS:
        raise ValueError(f"OTLP protocol '{protocol}' is not one of {', '.join(PROTOCOLS)}")
    if protocol != "grpc":
        parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        if parsed.path in ("", "/"):
            endpoint = parsed._replace(path="/v1/metrics").geturl()
        else:
            endpoint = parsed.geturl()
    return endpoint, protocol


def exporter(endpoint: str, protocol: str) -> MetricExporter:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        target = endpoint.split("://", 1)[-1]
        return Grpc(endpoint=target, insecure=not endpoint.startswith("https://"))
    if protocol == "http/json":
        return JsonMetricExporter(endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    return Http(endpoint=endpoint)


def _json_exporter_base() -> type:
    from opentelemetry.sdk.metrics.export import MetricExporter

    return MetricExporter


class JsonMetricExporter(_json_exporter_base()):  # type: ignore[misc]
    """OTLP/HTTP with a JSON body, built on the SDK's protobuf encoder."""

    def __init__(self, endpoint: str, timeout_secs: float = 10.0) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.timeout_secs = timeout_secs

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any) -> MetricExportResult:
        import httpx
        from google.protobuf.json_format import MessageToJson
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
        from opentelemetry.sdk.metrics.export import MetricExportResult

        body = MessageToJson(encode_metrics(metrics_data), use_integers_for_enums=True, indent=None)
        try:
            response = httpx.post(self.endpoint, content=body, headers={"Content-Type": "application/json"},
                                  timeout=min(self.timeout_secs, timeout_millis / 1000))
        except httpx.HTTPError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS if response.is_success else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        return None
