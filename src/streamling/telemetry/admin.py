"""The admin API of a run (``admin_api_port``): health, topology with rates, recent epochs, sampled
rows and the Prometheus scrape, as JSON over HTTP (Starlette on uvicorn, in a background thread).

Every number comes from the run's ``RunStats`` and ``PipelineMetrics`` (what the CLI progress line
and the exported metrics show); node options and settings go out with their secrets masked.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import TYPE_CHECKING

from streamling.config.settings import mask_secrets
from streamling.util import json_safe

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from streamling.config import Settings
    from streamling.runtime.planner import Plan
    from streamling.telemetry.metrics import PipelineMetrics
    from streamling.telemetry.stats import RunStats

log = logging.getLogger(__name__)


def build_app(stats: RunStats, plan: Plan | None, settings: Settings, metrics: PipelineMetrics | None) -> Starlette:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    options = ({name: mask_secrets(spec.options.model_dump(by_alias=True, exclude_none=True))
                for name, spec in plan.spec.nodes.items()} if plan is not None else {})

    async def live(_: Request) -> Response:
        return JSONResponse({"status": "live", "application_id": settings.application_id})

    async def ready(_: Request) -> Response:
        status = stats.status
        body = {"status": status, "error": stats.error}
        return JSONResponse(body, status_code=200 if status == "running" else 503)

    async def topology(_: Request) -> Response:
        snap = stats.snapshot()
        for name, node in snap["nodes"].items():
            node["options"] = options.get(name, {})
        return JSONResponse(snap)

    async def epochs(request: Request) -> Response:
        try:
            limit = max(1, min(200, int(request.query_params.get("limit", "20"))))
        except ValueError:
            return JSONResponse({"error": "limit must be a number"}, status_code=400)
        return JSONResponse({"epochs": stats.recent_epochs(limit)})

    async def inspect(_: Request) -> Response:
        with stats.lock:
            samples = {k: dict(v) for k, v in stats.samples.items()}
        return JSONResponse({"enabled": settings.live_data_inspect_enabled,
                             "records_per_topology_node": settings.live_data_inspect.records_per_topology_node,
                             "refresh_in_secs": settings.live_data_inspect.refresh_in_secs,
                             "nodes": json_safe(samples)})

    async def config(_: Request) -> Response:
        return JSONResponse(settings.masked())

    async def prometheus(_: Request) -> Response:
        text = metrics.prometheus_text() if metrics is not None else b""
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(routes=[
        Route("/health/live", live), Route("/health/ready", ready), Route("/topology", topology),
        Route("/epochs", epochs), Route("/inspect", inspect), Route("/config", config), Route("/metrics", prometheus),
    ])


class AdminServer:
    """uvicorn serving the app on a daemon thread; ``stop`` ends it."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        import uvicorn

        self.host, self.port = host, port
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, name="streamling-admin-api", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def start_admin_api(stats: RunStats, plan: Plan | None, settings: Settings,
                    metrics: PipelineMetrics | None) -> AdminServer | None:
    """Serve the admin API on ``admin_api_port`` (0: off); a port in use is a warning, not a failure."""
    port = settings.admin_api_port
    if not port:
        return None
    host = settings.admin_api_host
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            log.warning("admin API not served: %s:%d is not free (%s); set admin_api_port to another port, "
                        "or 0 to turn it off", host, port, exc.strerror or exc)
            return None
    server = AdminServer(build_app(stats, plan, settings, metrics), host, port)
    server.start()
    stats.admin_api = f"http://{host}:{port}"
    log.info("admin API on http://%s:%d (/health/live, /health/ready, /topology, /epochs, /inspect, /metrics)",
             host, port)
    return server
