"""A real OTLP metrics receiver for tests (importable as ``otlp_receiver``): OTLP/HTTP (protobuf or
JSON bodies) and OTLP/gRPC, decoding requests with the official ``opentelemetry-proto`` messages."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from streamling.util import free_port

__all__ = ["Point", "Receiver", "free_port", "points", "serve_grpc", "serve_http"]


@dataclass
class Point:
    name: str
    attributes: dict[str, Any]
    value: float
    resource: dict[str, Any] = field(default_factory=dict)


def _attrs(kvs: Any) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        value = kv.value
        kind = value.WhichOneof("value")
        out[kv.key] = getattr(value, kind) if kind else None
    return out


def points(request: Any) -> Iterator[Point]:
    """Every data point of an ``ExportMetricsServiceRequest`` (histograms as their count)."""
    for rm in request.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                data = getattr(metric, kind)
                for dp in data.data_points:
                    if kind == "histogram":
                        value: float = dp.count
                    else:
                        value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                    yield Point(metric.name, _attrs(dp.attributes), float(value), resource)


class Receiver:
    """Collects every request it receives; ``latest(name)`` gives the newest points of a metric."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.content_types: list[str] = []
        self.lock = threading.Lock()

    def add(self, request: Any, content_type: str) -> None:
        with self.lock:
            self.requests.append(request)
            self.content_types.append(content_type)

    def latest(self, name: str) -> list[Point]:
        with self.lock:
            for request in reversed(self.requests):
                found = [p for p in points(request) if p.name == name]
                if found:
                    return found
        return []

    def names(self) -> set[str]:
        with self.lock:
            return {p.name for r in self.requests for p in points(r)}


def serve_http(receiver: Receiver) -> tuple[ThreadingHTTPServer, str]:
    """OTLP/HTTP on a free loopback port; returns the server and its ``/v1/metrics`` URL."""
    from google.protobuf.json_format import Parse
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            kind = self.headers.get("Content-Type", "")
            request = ExportMetricsServiceRequest()
            if "json" in kind:
                Parse(body.decode(), request)
            else:
                request.ParseFromString(body)
            receiver.add(request, kind)
            self.send_response(200)
            self.send_header("Content-Type", kind or "application/x-protobuf")
            self.end_headers()
            self.wfile.write(b"{}" if "json" in kind else b"")

        def log_message(self, *_: Any) -> None:
            return None

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{port}/v1/metrics"


def serve_grpc(receiver: Receiver) -> tuple[Any, str]:
    """OTLP/gRPC on a free loopback port; returns the server and ``127.0.0.1:port``."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

    class Service(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the proto's name
            receiver.add(request, "grpc")
            return metrics_service_pb2.ExportMetricsServiceResponse()

    port = free_port()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Service(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, f"127.0.0.1:{port}"
