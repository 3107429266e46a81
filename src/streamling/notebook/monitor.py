"""The live pipeline monitor: an anywidget fed by the runtime's events.

``Monitor.handle`` is an ``EventBus`` subscriber. Events arrive on Spark's listener thread and on
the ``foreachBatch`` thread, so every event is folded into plain Python state under one lock, and
the synced traits are pushed from that state at most a few times a second (the last state is
always pushed: a trailing timer catches whatever the throttle held back). Trait sets from
background threads are the documented ipywidgets pattern; nothing here prints.

The front end (``widgets/monitor.js`` + ``monitor.css``) draws the DAG, the epoch timeline with
each epoch's breakdown and Spark progress, the sampled rows of one node, and the rate and batch
duration charts; its stop and restart buttons call the controller the magics attach. Headless
renderers (nbval, nbconvert, jobs) cannot run it, so ``_repr_mimebundle_`` also carries a text and
an HTML summary (``notebook.monitor_summary``). A notebook saved with its widget state reopens
showing the saved state, marked as not live: the front end hears neither an answer to its ping nor
the heartbeat (``beat``) a run's widget sends while the kernel may be too busy to answer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import traitlets

from streamling.notebook import monitor_summary
from streamling.notebook.render import dag_depths
from streamling.notebook.widget import SummarizedWidget, front_end
from streamling.runtime import events as ev
from streamling.telemetry.stats import RunStats
from streamling.util import json_safe

log = logging.getLogger(__name__)

MAX_EPOCHS = 50
MAX_RATES = 120
MAX_SAMPLE_ROWS = 20
RATE_WINDOW_SECS = 30.0
_STATE_RANK = {"planned": 0, "flushed": 1, "finalized": 2}


def plan_graph(description: dict[str, Any]) -> dict[str, Any]:
    """Nodes (with their layer in the DAG) and edges from ``Plan.describe()``."""
    nodes: dict[str, dict[str, Any]] = description.get("nodes") or {}
    flow_of = {name: flow["name"] for flow in description.get("flows") or []
               for key in ("sources", "transforms", "sinks") for name in flow.get(key) or []}
    depth = dag_depths(nodes)
    return {
        "nodes": [{"name": name, "kind": info.get("kind", ""), "type": info.get("type", ""),
                   "flow": flow_of.get(name, ""), "depth": depth[name],
                   "primary_key": list(info.get("primary_key") or []),
                   "schema": list(info["schema"]) if info.get("schema") is not None else None}
                  for name, info in nodes.items()],
        "edges": [[up, name] for name, info in nodes.items() for up in info.get("upstream") or [] if up in nodes],
    }


class _NodeRows:
    """Rows a node produced per epoch; the rate is rows over a sliding window of epoch times."""

    def __init__(self) -> None:
        self.per_epoch: OrderedDict[tuple[str, int], tuple[float, int, int]] = OrderedDict()  # at, rows, priority
        self.total = 0

    def record(self, key: tuple[str, int], at: float, rows: int, priority: int) -> None:
        old = self.per_epoch.get(key)
        if old is not None and old[2] > priority:
            return
        self.total += rows - (old[1] if old else 0)
        self.per_epoch[key] = (at, rows, priority)
        while len(self.per_epoch) > MAX_EPOCHS:
            self.per_epoch.popitem(last=False)

    def rate(self, started_at: float | None) -> float | None:
        points = sorted((at, rows) for at, rows, _ in self.per_epoch.values())
        if not points:
            return None
        last = points[-1][0]
        before = [p for p in points if p[0] <= last - RATE_WINDOW_SECS]
        if before:
            ref, counted = before[-1][0], [p for p in points if p[0] > before[-1][0]]
        elif started_at is not None and started_at < points[0][0]:
            ref, counted = started_at, points
        elif len(points) > 1:
            ref, counted = points[0][0], points[1:]
        else:
            return None
        span = last - ref
        return sum(r for _, r in counted) / span if span > 0 else None


class Monitor(SummarizedWidget):
    """Live view of a running pipeline: DAG, epoch timeline, sampled rows, rates."""

    _esm = front_end("monitor.js")
    _css = front_end("monitor.css")

    title = traitlets.Unicode("").tag(sync=True)
    status = traitlets.Unicode("starting").tag(sync=True)
    #: {nodes: [{name, kind, type, flow, depth, primary_key, schema}], edges: [[from, to]]}
    graph = traitlets.Dict().tag(sync=True)
    #: {node: {rows, last_rows, last_epoch, rows_per_sec, expectations: {name: {passed, failed, action}}}}
    node_stats = traitlets.Dict().tag(sync=True)
    #: oldest first: [{flow, epoch, state, planned_at, flushed_at, finalized_at, durations_ms,
    #: spark_ms, rows, input_rows, offsets, input_rate, processing_rate}]
    epochs: traitlets.List[dict[str, Any]] = traitlets.List().tag(sync=True)
    #: {node: {flow, epoch, at, columns, types, rows, count}}
    samples = traitlets.Dict().tag(sync=True)
    #: when the run began (UNIX seconds, its first flow's start): a saved monitor says whose state it shows
    started_at = traitlets.Float(None, allow_none=True).tag(sync=True)
    #: the node whose sampled rows are shown; the front end's selector writes it
    selected_node = traitlets.Unicode("").tag(sync=True)
    #: [{t, flow, input, processing}] from Spark's progress of each finalized epoch
    rates: traitlets.List[dict[str, Any]] = traitlets.List().tag(sync=True)
    #: the last error: {flow, node, message, retriable, attempt, at, resolved} or None; ``resolved``
    #: once a retried flow flushed an epoch again
    error = traitlets.Any(None, allow_none=True).tag(sync=True)
    #: the buttons the front end offers ("stop", "restart"); empty without a controller
    controls: traitlets.List[str] = traitlets.List().tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._status = self.status
        self._epochs: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._rows: dict[str, _NodeRows] = {}
        #: expectation counts come from a ``RunStats``: the monitor's own (fed by ``handle``) until the
        #: run's is attached (``stats = …``), which also gives node totals — the numbers the CLI line,
        #: the metrics and the admin API read
        self._stats_source: RunStats = RunStats()
        self._own_stats = True
        self._samples: dict[str, dict[str, Any]] = {}
        self._rates: list[dict[str, Any]] = []
        self._error: dict[str, Any] | None = None
        self._flows: dict[str, dict[str, Any]] = {}
        #: Spark's progress report per epoch, sent to the front end only when asked for (not synced)
        self._progress: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self._controller: Callable[[str], None] | None = None
        #: the front end's last node choice applied: (view, sequence number)
        self._selected_by: tuple[str, int] = ("", -1)
        #: the ``DisplayHandle`` of the output showing this monitor, updated when the run ends
        self.display_handle: Any = None

    # --- construction -----------------------------------------------------------------------------

    @classmethod
    def for_plan(cls, description: dict[str, Any], title: str) -> Monitor:
        """A monitor showing the DAG of ``Plan.describe()``; feed it with ``bus.subscribe(m.handle)``."""
        graph = plan_graph(description)
        kinds = {n["name"]: n["kind"] for n in graph["nodes"]}
        sampled = [n for n, k in kinds.items() if k != "sink"]
        # The most interesting in-flight batch by default: the last transform (the sinks' input).
        transforms = [n for n in sampled if kinds[n] == "transform"]
        monitor = cls(title=title, graph=graph, selected_node=(transforms or sampled or [""])[-1])
        monitor._set_flows(description)
        return monitor

    def _set_flows(self, description: dict[str, Any]) -> None:
        for flow in description.get("flows") or []:
            self._flows[flow["name"]] = {"sources": list(flow.get("sources") or []),
                                         "sinks": list(flow.get("sinks") or []), "started_at": None, "stopped": None}

    def reset(self, description: dict[str, Any]) -> None:
        """Start over for a new run of a (possibly edited) pipeline: new graph, no epochs or rows."""
        graph = plan_graph(description)
        with self._lock:
            self._epochs.clear()
            self._rows.clear()
            self._samples.clear()
            self._rates.clear()
            self._progress.clear()
            self._flows.clear()
            self._error = None
            self._status = "starting"
            self._stats_source, self._own_stats = RunStats(), True
            self._set_flows(description)
            self.graph = graph
            names = {n["name"] for n in graph["nodes"] if n["kind"] != "sink"}
            if self.selected_node not in names:
                transforms = [n["name"] for n in graph["nodes"] if n["kind"] == "transform"]
                self.selected_node = (transforms or sorted(names) or [""])[-1]
            self._dirty = True
        self._schedule(immediate=True)

    # --- controls ---------------------------------------------------------------------------------

    def set_controller(self, controller: Callable[[str], None] | None,
                       actions: Sequence[str] = ("stop", "restart")) -> None:
        """``controller(action)`` runs when a button is pressed (in a thread of its own, so a stop
        that waits for the epoch in flight never blocks the kernel)."""
        self._controller = controller
        self.controls = list(actions) if controller is not None else []

    def show_error(self, message: str, node: str | None = None) -> None:
        """A failure outside any flow (e.g. a restart whose pipeline no longer validates)."""
        with self._lock:
            self._error = {"flow": None, "node": node, "message": message, "retriable": False, "attempt": 0,
                           "at": time.time(), "resolved": False}
            self._dirty = True
        self._schedule(immediate=True)

    def _on_message(self, _widget: Any, content: Any, _buffers: Sequence[bytes]) -> None:
        """Requests from the front end: ``ping`` (am I live?), ``progress`` of an epoch, a button."""
        if not isinstance(content, dict):
            return
        action = content.get("action")
        if action == "ping":
            self.send({"type": "pong"})
        elif action == "progress":
            key = (str(content.get("flow")), int(content.get("epoch", -1)))
            with self._lock:
                progress = self._progress.get(key)
            self.send({"type": "progress", "flow": key[0], "epoch": key[1],
                       "json": json.dumps(json_safe(progress), indent=2) if progress is not None else None})
        elif action == "select":
            self._select(content)
        elif action in self.controls and self._controller is not None:
            threading.Thread(target=self._control, args=(str(action),), name=f"streamling-monitor-{action}",
                             daemon=True).start()

    def _select(self, request: dict[str, Any]) -> None:
        """The node whose in-flight rows the front end shows. It arrives on the control channel, so
        the kernel knows it while a cell keeps it busy (a Restart then keeps the user's choice); each
        request is handled in a thread of its own, so a view's choices apply in its order only."""
        node, view = str(request.get("node", "")), str(request.get("view", ""))
        try:
            seq = int(request.get("seq", -1))
        except (TypeError, ValueError):
            return
        with self._lock:
            last_view, last_seq = self._selected_by
            stale = view == last_view and seq <= last_seq
            if stale or node not in {n["name"] for n in self.graph.get("nodes", []) if n["kind"] != "sink"}:
                return
            self._selected_by = (view, seq)
            self.selected_node = node
        self.send({"type": "selected", "node": node})

    def _control(self, action: str) -> None:
        controller = self._controller
        if controller is None:
            return
        try:
            controller(action)
        except Exception as exc:  # noqa: BLE001 - shown in the widget: a button has no cell to fail
            from streamling.notebook.magics import one_line

            log.debug("monitor %s failed", action, exc_info=True)
            self.show_error(f"{action} failed: {one_line(exc)}")

    # --- events -----------------------------------------------------------------------------------

    def handle(self, event: ev.Event) -> None:
        """Fold one runtime event into the monitor (any thread); push traits, throttled."""
        with self._lock:
            if self._own_stats:
                self._stats_source(event)
            final = self._apply(event)
            self._dirty = True
        self._schedule(immediate=final)

    def show_state(self, state: str, detail: str | None) -> None:
        """The run's state (``run.STATES``) as the status line: ``failed: <error>``, ``stopped
        (<reason>)``, else the state itself."""
        self.keep_beating(state in ("starting", "running", "stopping"))
        if state == "failed":
            self.set_status(f"failed: {detail}" if detail else "failed")
        elif state == "stopped":
            self.set_status(f"stopped ({detail})" if detail else "stopped")
        else:
            self.set_status(state)
        if state in ("stopped", "failed") and self.display_handle is not None:
            # The output's text and HTML were made when the run started ("running", no rows): a
            # notebook saved now, or opened where the widget cannot run, shows the run's end instead.
            try:
                self.display_handle.update(self)
            except Exception:  # noqa: BLE001 - the cell's output is gone (cleared, kernel restarting)
                log.debug("updating the monitor's output", exc_info=True)

    def set_status(self, text: str) -> None:
        """Set the status line (e.g. "running", "stopped (…)", "failed: …") and show it at once."""
        with self._lock:
            self._status = text
            self._dirty = True
        self._schedule(immediate=True)

    def flush(self) -> None:
        """Push the current state now (e.g. after the run ended)."""
        self._schedule(immediate=True)

    def _flow(self, name: str) -> dict[str, Any]:
        return self._flows.setdefault(name, {"sources": [], "sinks": [], "started_at": None, "stopped": None})

    def _node_rows(self, node: str) -> _NodeRows:
        return self._rows.setdefault(node, _NodeRows())

    def _epoch(self, flow: str, epoch: int) -> dict[str, Any]:
        key = (flow, epoch)
        record = self._epochs.get(key)
        if record is None:
            record = {"flow": flow, "epoch": epoch, "state": "planned", "planned_at": None, "flushed_at": None,
                      "finalized_at": None, "durations_ms": {}, "spark_ms": {}, "rows": {}, "input_rows": None,
                      "offsets": {}, "input_rate": None, "processing_rate": None}
            self._epochs[key] = record
            while len(self._epochs) > MAX_EPOCHS:
                self._epochs.popitem(last=False)
        return record

    @staticmethod
    def _advance(record: dict[str, Any], state: str) -> None:
        if _STATE_RANK[state] > _STATE_RANK[record["state"]]:
            record["state"] = state

    def _apply(self, event: ev.Event) -> bool:
        """Update the state; True when the change should be shown at once (run ended, failure)."""
        if isinstance(event, ev.FlowStarted):
            flow = self._flow(event.flow)
            flow.update(sources=list(event.sources), sinks=list(event.sinks), started_at=event.at, stopped=None)
            self._status = "running"
        elif isinstance(event, ev.EpochPlanned):
            # A (re)run of the epoch starts over: after a restart Spark replays it with the same id.
            self._epochs.pop((event.flow, event.epoch), None)
            record = self._epoch(event.flow, event.epoch)
            record["planned_at"] = event.at
        elif isinstance(event, ev.EpochFlushed):
            record = self._epoch(event.flow, event.epoch)
            self._advance(record, "flushed")
            record.update(flushed_at=event.at, rows=dict(event.rows),
                          durations_ms={k: round(float(v), 1) for k, v in event.durations_ms.items()})
            for sink, rows in event.rows.items():
                self._node_rows(sink).record((event.flow, event.epoch), event.at, int(rows), 1)
            for node, rows in event.node_rows.items():  # counted in the sinks' own jobs: exact
                self._node_rows(node).record((event.flow, event.epoch), event.at, int(rows), 2)
            if self._error and self._error["retriable"] and self._error["flow"] == event.flow:
                self._error["resolved"] = True  # the retry succeeded: the epoch got through
        elif isinstance(event, ev.EpochFinalized):
            self._finalized(event)
        elif isinstance(event, ev.RowsSampled):
            self._sampled(event)
        elif isinstance(event, ev.FlowStopped):
            flow = self._flow(event.flow)
            flow["stopped"] = event.reason
            if event.error:
                self._error = {"flow": event.flow, "node": None, "message": event.error, "retriable": False,
                               "attempt": 0, "at": event.at, "resolved": False}
            if all(f["stopped"] is not None for f in self._flows.values()):
                self._status = ("failed: " + event.error) if event.error else f"stopped ({event.reason})"
            return True
        elif isinstance(event, ev.PipelineError):
            self._error = {"flow": event.flow, "node": event.node, "message": event.message,
                           "retriable": event.retriable, "attempt": event.attempt, "at": event.at,
                           "resolved": False}
            if not event.retriable:
                self._status = "failed"
                return True
        return False

    def _finalized(self, event: ev.EpochFinalized) -> None:
        record = self._epochs.get((event.flow, event.epoch))
        if record is not None and record["state"] == "planned":
            # Spark commits an epoch only after foreachBatch returned; a report for an epoch still
            # in flight is a no-data progress report, not its commit.
            return
        record = self._epoch(event.flow, event.epoch)
        self._advance(record, "finalized")
        record.update(finalized_at=event.at, input_rows=int(event.input_rows),
                      offsets=json_safe(dict(event.offsets)),
                      spark_ms={k: round(float(v), 1) for k, v in event.durations_ms.items()},
                      input_rate=round(float(event.input_rows_per_second), 1),
                      processing_rate=round(float(event.processed_rows_per_second), 1))
        if event.progress:
            self._progress[(event.flow, event.epoch)] = dict(event.progress)
            while len(self._progress) > MAX_EPOCHS:
                self._progress.popitem(last=False)
        sources = self._flow(event.flow)["sources"]
        if len(sources) == 1:  # a multi-source flow's input is split by the sampled counts only
            self._node_rows(sources[0]).record((event.flow, event.epoch), event.at, int(event.input_rows), 1)
        # The chart's input line is the sources' rows/s as the node boxes compute it (rows over a
        # sliding window of epochs), so its last point and the source boxes show the same number.
        # Processing is Spark's: rows per second of batch time, what the flow could sustain.
        rates = [self._node_rows(s).rate(self._started_at()) for s in sources if s in self._rows]
        known = [r for r in rates if r is not None]
        input_rate = sum(known) if known else float(event.input_rows_per_second)
        self._rates.append({"t": event.at, "flow": event.flow, "input": round(input_rate, 1),
                            "processing": round(event.processed_rows_per_second, 1)})
        del self._rates[:-MAX_RATES]

    def _sampled(self, event: ev.RowsSampled) -> None:
        types: list[str] | None = None
        table = event.table
        if table is not None and getattr(table, "schema", None) is not None:
            types = [str(f.type) for f in table.schema]
        self._samples[event.node] = {
            "flow": event.flow, "epoch": event.epoch, "at": event.at, "columns": list(event.columns),
            "types": types, "rows": json_safe(list(event.rows[:MAX_SAMPLE_ROWS])), "count": event.count}
        if event.count is not None:
            self._node_rows(event.node).record((event.flow, event.epoch), event.at, int(event.count), 2)

    # --- pushing traits ---------------------------------------------------------------------------

    def _started_at(self) -> float | None:
        started = [f["started_at"] for f in self._flows.values() if f["started_at"] is not None]
        return min(started) if started else None

    def _stats(self) -> dict[str, dict[str, Any]]:
        since = self._started_at()
        out: dict[str, dict[str, Any]] = {}
        for node, rows in self._rows.items():
            last = next(reversed(rows.per_epoch.items()), None)
            rate = rows.rate(since)
            out[node] = {"rows": rows.total, "last_rows": last[1][1] if last else None,
                         "last_epoch": last[0][1] if last else None,
                         "rows_per_sec": round(rate, 1) if rate is not None else None}
        for node, st in self._stats_source.snapshot()["nodes"].items():
            if st["expectations"]:
                out.setdefault(node, {})["expectations"] = st["expectations"]
            if not self._own_stats and (st["output_rows"] or node in out):  # the run's totals
                entry = out.setdefault(node, {"last_rows": None, "last_epoch": None, "rows_per_sec": None})
                entry["rows"] = st["output_rows"]
        return out

    @property
    def stats(self) -> RunStats:
        return self._stats_source

    @stats.setter
    def stats(self, stats: RunStats) -> None:
        """Attach the run's stats (its bus feeds them)."""
        with self._lock:
            self._stats_source, self._own_stats = stats, False

    def _push(self) -> None:
        """Send the state to the front end (caller holds the lock)."""
        self._dirty = False
        self._last_push = time.monotonic()
        try:
            with self.hold_sync():
                self.status = self._status
                self.started_at = self._started_at()
                self.node_stats = self._stats()
                self.epochs = [dict(r) for r in self._epochs.values()]
                self.samples = {k: dict(v) for k, v in self._samples.items()}
                self.rates = list(self._rates)
                self.error = dict(self._error) if self._error else None
        except Exception:  # noqa: BLE001 - a closed comm must not break the event bus
            log.debug("monitor update failed", exc_info=True)

    # --- headless summaries -----------------------------------------------------------------------

    def _summary(self) -> dict[str, Any]:
        with self._lock:
            return {"status": self._status, "stats": self._stats(), "epochs": [dict(r) for r in self._epochs.values()],
                    "error": dict(self._error) if self._error else None,
                    "flows": len(self._flows) > 1}

    def summary_text(self, last_epochs: int = 5) -> str:
        """A plain-text picture of the run, for renderers that cannot run the widget."""
        return monitor_summary.summary_text(self.title, self.graph, self._summary(), last_epochs)

    def summary_html(self, last_epochs: int = 5) -> str:
        """The same summary as a small HTML table (nbconvert, job output pages)."""
        return monitor_summary.summary_html(self.title, self.graph, self._summary(), last_epochs)
