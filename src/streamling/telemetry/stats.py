"""What a run has done so far, folded from its events: the one set of numbers behind the
OpenTelemetry metrics, the admin API and the CLI's progress line.

Pure Python (no OpenTelemetry, no Spark): subscribed to the run's ``EventBus``, read from any thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.runtime import events as ev

if TYPE_CHECKING:
    from streamling.runtime.planner import Plan

RECENT_EPOCHS = 50


@dataclass
class NodeStats:
    name: str
    kind: str  #: source | transform | sink
    type: str  #: the node's ``type`` (kafka, sql, postgres, a plugin id)
    upstream: list[str]
    labels: dict[str, str]
    output_rows: int = 0
    last_rows: int = 0
    last_rate: float = 0.0  #: rows/s over the last epoch that counted this node
    last_at: float | None = None
    #: ``topic/partition`` → messages behind (Kafka sources)
    lag: dict[str, int] = field(default_factory=dict)
    #: the watermark: the largest event time (epoch ms) the node has seen in the run
    event_time_ms: float | None = None
    #: expectation → {"passed": n, "failed": n, "action": warn|drop|fail}
    expectations: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class EpochRecord:
    flow: str
    epoch: int
    state: str = "planned"  #: planned → flushed → finalized | failed
    planned_at: float | None = None
    flushed_at: float | None = None
    finalized_at: float | None = None
    rows: dict[str, int] = field(default_factory=dict)
    input_rows: int | None = None
    durations_ms: dict[str, float] = field(default_factory=dict)
    offsets: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class RunStats:
    """Totals, rates, lag and the recent epochs of one run, updated from its events."""

    def __init__(self, plan: Plan | None = None, application_id: str = "") -> None:
        self.application_id = application_id or (plan.settings.application_id if plan else "")
        self.lock = threading.Lock()
        self.nodes: dict[str, NodeStats] = {}
        self.flows: dict[str, dict[str, Any]] = {}
        self.epochs: deque[EpochRecord] = deque(maxlen=RECENT_EPOCHS)
        self.started_at = time.time()
        self.status = "starting"
        self.error: str | None = None
        self.counters = {"markers_sent": 0, "acks_received": 0, "epochs_succeeded": 0, "epochs_failed": 0,
                         "finalizers_sent": 0}
        #: (at, node, rows) of recent epochs, for rows-per-interval figures
        self.recent_rows: deque[tuple[float, str, int]] = deque(maxlen=10_000)
        self.samples: dict[str, dict[str, Any]] = {}
        #: where this run's admin API answers, once it does
        self.admin_api: str | None = None
        if plan is not None:
            for name, spec in plan.spec.nodes.items():
                telemetry = spec.options.telemetry
                self.nodes[name] = NodeStats(name, spec.kind, spec.type, list(spec.upstream),
                                             dict(telemetry.labels) if telemetry else {})

    def _node(self, name: str) -> NodeStats:
        found = self.nodes.get(name)
        if found is None:
            found = self.nodes[name] = NodeStats(name, "", "", [], {})
        return found

    def _epoch(self, flow: str, epoch: int) -> EpochRecord:
        for record in reversed(self.epochs):
            if record.flow == flow and record.epoch == epoch:
                return record
        record = EpochRecord(flow, epoch)
        self.epochs.append(record)
        return record

    def rows_to_sinks(self) -> int:
        """Rows the busiest sink received so far (what the progress line shows)."""
        with self.lock:
            return max((n.output_rows for n in self.nodes.values() if n.kind == "sink"), default=0)

    def in_flight(self) -> int:
        with self.lock:
            return sum(1 for e in self.epochs if e.state in ("planned", "flushed"))

    def __call__(self, event: ev.Event) -> None:
        with self.lock:
            self._apply(event)

    def _apply(self, event: ev.Event) -> None:
        if isinstance(event, ev.FlowStarted):
            self.flows[event.flow] = {"sources": list(event.sources), "sinks": list(event.sinks),
                                      "bounded": event.bounded, "started_at": event.at, "stopped": None,
                                      "input_rows_per_second": 0.0, "processed_rows_per_second": 0.0}
            self.status = "running"
        elif isinstance(event, ev.EpochPlanned):
            record = self._epoch(event.flow, event.epoch)
            record.state, record.planned_at, record.error = "planned", event.at, None
            self.counters["markers_sent"] += 1
        elif isinstance(event, ev.EpochFlushed):
            self._flushed(event)
        elif isinstance(event, ev.EpochFinalized):
            self._finalized(event)
        elif isinstance(event, ev.RowsSampled):
            self.samples[event.node] = {"flow": event.flow, "epoch": event.epoch, "at": event.at,
                                        "columns": list(event.columns), "rows": list(event.rows)}
        elif isinstance(event, ev.PipelineError) and event.retriable:
            self.status, self.error = "retrying", event.message  # ready again once an epoch gets through
        elif isinstance(event, ev.PipelineError):
            self.counters["epochs_failed"] += 1
            for record in self.epochs:
                if record.flow == event.flow and record.state in ("planned", "flushed"):
                    record.state, record.error = "failed", event.message
            self.status, self.error = "failed", event.message
        elif isinstance(event, ev.FlowStopped):
            flow = self.flows.setdefault(event.flow, {})
            flow["stopped"] = event.reason
            if event.error:
                self.status, self.error = "failed", event.error
            elif all(f.get("stopped") for f in self.flows.values()) and self.status != "failed":
                self.status = "stopped"

    def _flushed(self, event: ev.EpochFlushed) -> None:
        record = self._epoch(event.flow, event.epoch)
        record.state, record.flushed_at = "flushed", event.at
        if self.status == "retrying":
            self.status, self.error = "running", None
        record.rows, record.durations_ms = dict(event.rows), dict(event.durations_ms)
        self.counters["acks_received"] += len(event.rows)
        for sink in event.rows:
            self._node(sink).kind = self._node(sink).kind or "sink"
        counted = {**event.node_rows, **event.rows}  # sinks: what they received
        for name, rows in counted.items():
            node = self._node(name)
            node.output_rows += int(rows)
            span = event.at - (node.last_at if node.last_at is not None else (record.planned_at or event.at))
            node.last_rows, node.last_rate, node.last_at = int(rows), rows / span if span > 0 else 0.0, event.at
            self.recent_rows.append((event.at, name, int(rows)))
        for name, value in event.event_time_ms.items():  # a watermark never goes back
            node = self._node(name)
            node.event_time_ms = value if node.event_time_ms is None else max(node.event_time_ms, value)
        for name, results in event.expectations.items():
            node = self._node(name)
            for expectation, result in results.items():
                totals = node.expectations.setdefault(expectation, {"passed": 0, "failed": 0,
                                                                    "action": result.get("action")})
                totals["passed"] += int(result.get("passed", 0))
                totals["failed"] += int(result.get("failed", 0))

    def _finalized(self, event: ev.EpochFinalized) -> None:
        record = self._epoch(event.flow, event.epoch)
        if record.state == "planned":
            return  # a no-data progress report for an epoch still running, not its commit
        record.state, record.finalized_at = "finalized", event.at
        record.input_rows, record.offsets = event.input_rows, dict(event.offsets)
        self.counters["epochs_succeeded"] += 1
        self.counters["finalizers_sent"] += 1
        flow = self.flows.setdefault(event.flow, {})
        flow.update(input_rows_per_second=event.input_rows_per_second,
                    processed_rows_per_second=event.processed_rows_per_second)
        for name, lag in event.lag.items():
            self._node(name).lag = dict(lag)

    def rows_since(self, seconds: float) -> dict[str, int]:
        """Output rows per node in the last ``seconds`` (the per-interval ``output_rows_delta``)."""
        cutoff = time.time() - seconds
        out: dict[str, int] = {}
        with self.lock:
            for at, name, rows in self.recent_rows:
                if at >= cutoff:
                    out[name] = out.get(name, 0) + rows
        return out

    def snapshot(self) -> dict[str, Any]:
        """A JSON-able picture (admin API)."""
        rows_to_sinks = self.rows_to_sinks()
        with self.lock:
            return {
                "application_id": self.application_id, "status": self.status, "error": self.error,
                "rows_to_sinks": rows_to_sinks, "admin_api": self.admin_api,
                "started_at": self.started_at, "checkpoint": dict(self.counters),
                "flows": {k: dict(v) for k, v in self.flows.items()},
                "nodes": {n.name: {"kind": n.kind, "type": n.type, "upstream": n.upstream, "labels": n.labels,
                                   "output_rows": n.output_rows, "last_epoch_rows": n.last_rows,
                                   "rows_per_second": round(n.last_rate, 1), "lag": dict(n.lag),
                                   "event_time_ms": n.event_time_ms,
                                   "expectations": {k: dict(v) for k, v in n.expectations.items()}}
                          for n in self.nodes.values()},
            }

    def write(self, path: Path) -> None:
        """The snapshot as JSON at ``path``, replaced atomically (read by ``streamling bundle runs``)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.snapshot(), default=str))
        os.replace(tmp, path)

    def recent_epochs(self, limit: int = 20) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(vars(e)) for e in list(self.epochs)[-limit:]]
