"""Everything a long-running job exposes about itself, attached to one run's event bus."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamling.telemetry.stats import RunStats

if TYPE_CHECKING:
    from streamling.config import Settings
    from streamling.runtime import events as ev
    from streamling.runtime.planner import Plan
    from streamling.telemetry.admin import AdminServer
    from streamling.telemetry.metrics import PipelineMetrics


@dataclass
class RunTelemetry:
    stats: RunStats
    metrics: PipelineMetrics | None = None
    admin: AdminServer | None = None

    def close(self) -> None:
        """Stop the admin API and export what is left."""
        if self.admin is not None:
            self.admin.stop()
        if self.metrics is not None:
            self.metrics.shutdown()


def attach(plan: Plan, settings: Settings, bus: ev.EventBus, admin_api: bool = True) -> RunTelemetry:
    """Stats, metrics (OpenTelemetry, Prometheus) and, with ``admin_api``, the admin API for a run;
    ``live_data_inspect_enabled`` turns on sampling rows of every node every ``refresh_in_secs``."""
    from streamling.telemetry.metrics import start_metrics

    stats = RunStats(plan)
    bus.subscribe(stats)
    if settings.live_data_inspect_enabled:
        inspect = settings.live_data_inspect
        bus.sample_rows = max(bus.sample_rows, inspect.records_per_topology_node)
        bus.sample_every_secs = inspect.refresh_in_secs
    metrics = start_metrics(settings, stats, bus)
    server = None
    if admin_api:
        from streamling.telemetry.admin import start_admin_api

        server = start_admin_api(stats, plan, settings, metrics)
    return RunTelemetry(stats, metrics, server)
