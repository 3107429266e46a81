"""``%streamling display NODE``: a live, sortable table of one node's latest rows.

``ResultView`` is an ``EventBus`` subscriber, like the monitor. A source's or transform's rows are
the samples the run takes of it (``EventBus.node_sample_rows`` asks for ``limit`` rows of that
node; which epochs are sampled is the bus's choice): the newest epoch first, older epochs filling
up to the limit. A sink shows what it wrote
when its target can be queried — a Postgres or ClickHouse table, a Delta table — read again after
each committed epoch by a worker thread (never the event thread, never failing the pipeline; a
failed read is shown in the widget); any other sink shows the rows it was given (its upstream's
samples), and its caption says so.

A view outlives runs: created before ``%streamling run`` it waits and follows the next run
(``NotebookPipeline.start`` attaches it); created after a run it shows that run's last rows.
The front end (``widgets/display.js`` + ``display.css``) sorts, charts and downloads the rows;
headless renderers get the rows as a static text and HTML table from ``_repr_mimebundle_``.
``display(df)`` shows any Spark DataFrame in the same view (``notebook.frames``).
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import traitlets

from streamling.errors import StreamlingError
from streamling.notebook import render
from streamling.notebook.widget import SummarizedWidget, front_end
from streamling.runtime import events as ev
from streamling.runtime.nodes import Sink, TargetReader
from streamling.util import did_you_mean, json_safe

if TYPE_CHECKING:
    from streamling.notebook.run import NotebookRun
    from streamling.notebook.session import NotebookPipeline

log = logging.getLogger(__name__)

DEFAULT_ROWS = 100
MAX_ROWS = 10_000
#: how often the worker looks whether the run it follows has ended
_WATCH_SECS = 0.5

Seed = Callable[[str], "ev.RowsSampled | None"]


# --- the widget ---------------------------------------------------------------------------------------


def _rows_json(table: pa.Table) -> list[list[Any]]:
    """Rows as lists in column order (duplicate column names stay apart), values JSON-safe."""
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [[json_safe(v) for v in row] for row in zip(*columns, strict=True)]


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of several epochs as one; if their schemas cannot be unified, only the newest."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowException, ValueError):
        return tables[0]


class ResultView(SummarizedWidget):
    """The latest rows of one node of the notebook's pipeline, live while it runs."""

    push_from_timer = True  # rows are converted to JSON on the timer thread, never in an epoch
    _esm = front_end("display.js")
    _css = front_end("display.css")

    node = traitlets.Unicode("").tag(sync=True)
    kind = traitlets.Unicode("").tag(sync=True)
    #: what the rows are (sampled output, what a sink was given, a query of its table)
    caption = traitlets.Unicode("").tag(sync=True)
    #: waiting | running | stopped | failed: … | a sentence (replaced, not in the run)
    status = traitlets.Unicode("waiting").tag(sync=True)
    columns: traitlets.List[str] = traitlets.List(traitlets.Unicode()).tag(sync=True)
    types: traitlets.List[str] = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: rows as lists in ``columns`` order, newest epoch first
    rows: traitlets.List[list[Any]] = traitlets.List().tag(sync=True)
    limit = traitlets.Int(DEFAULT_ROWS).tag(sync=True)
    #: the newest epoch the rows come from, and the oldest (older epochs fill up to ``limit``)
    epoch = traitlets.Any(None, allow_none=True).tag(sync=True)
    first_epoch = traitlets.Any(None, allow_none=True).tag(sync=True)
    #: the newest epoch the run reported, when it had no rows for this node
    latest_epoch = traitlets.Any(None, allow_none=True).tag(sync=True)
    #: the node's full row count in the newest epoch (when the run counts it)
    count = traitlets.Any(None, allow_none=True).tag(sync=True)
    #: when the rows were sampled or queried (Unix seconds)
    updated_at = traitlets.Any(None, allow_none=True).tag(sync=True)
    #: the last failed read of the sink's target ("" when the last read worked)
    error = traitlets.Unicode("").tag(sync=True)

    def __init__(self, node: str, kind: str, limit: int = DEFAULT_ROWS, **kwargs: Any) -> None:
        super().__init__(node=node, kind=kind, limit=limit, **kwargs)
        self._state: dict[str, Any] = {"status": "waiting", "caption": self._waiting_caption(), "error": "",
                                       "epoch": None, "first_epoch": None, "latest_epoch": None, "count": None,
                                       "updated_at": None}
        self._table: pa.Table | None = None
        self._types: list[str] = []
        self._pushed: pa.Table | None = None  # the table whose rows the front end has
        self._flow: str | None = None
        self._sampled: list[str] = [self.node]
        self._window: dict[tuple[int, str], pa.Table] = {}  # (epoch, node) → sampled rows
        self._counts: dict[tuple[int, str], int] = {}
        self._fresh = False  # the next sample with rows starts the window over (a new run)
        self._finalized: int | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._push()

    def _waiting_caption(self) -> str:
        return f"{self.kind} '{self.node}': its latest rows appear here when `%streamling run` starts"

    # --- following a run ----------------------------------------------------------------------------

    def attach(self, run: NotebookRun, seed: Seed | None = None) -> None:
        """Follow ``run`` (the rows of its next epochs), or show the last rows of a finished one.

        ``seed`` gives the latest sample the run already took of a node (the rows shown at once)."""
        self.detach()
        pipeline = run.run
        plan = pipeline.plan
        if self.node not in plan.nodes:
            self.update_view(status="waiting", caption=f"'{self.node}' is not part of the last run's pipeline; its "
                                                        "rows appear when `%streamling run` starts with it")
            return
        spec = plan.spec.nodes[self.node]
        flow = next(f.name for f in plan.flows if self.node in f.node_names)
        node = plan.nodes[self.node]
        reader = node.read_back(pipeline.spark) if isinstance(node, Sink) else None
        if reader is not None:
            sampled, caption = [], reader.caption
        elif spec.kind == "sink":
            sampled = list(spec.upstream)
            ups = ", ".join(f"'{u}'" for u in sampled)
            caption = (f"rows {spec.type} sink '{self.node}' was given: the latest sampled rows of {ups} "
                       f"(a {spec.type} sink keeps nothing this view can query)")
        else:
            sampled = [self.node]
            caption = (f"latest rows of {spec.kind} '{self.node}' from the epochs the run samples (each slow "
                       f"epoch, fast ones every few seconds): the newest first, older ones up to {self.limit} rows")
        self.follow(flow=flow, sampled=sampled, reader=reader, caption=caption, run=run)
        if run.active:
            bus = pipeline.bus
            for name in sampled:
                bus.node_sample_rows[name] = max(bus.node_sample_rows.get(name, 0), self.limit)
            self._unsubscribe = bus.subscribe(self.handle)
        if seed is not None:
            for name in sampled:
                sample = seed(name)
                if sample is not None:
                    self.handle(sample)

    def follow(self, *, flow: str, sampled: list[str], reader: TargetReader | None, caption: str,
               run: NotebookRun | None = None) -> None:
        """Show the samples of ``sampled`` (nodes of ``flow``), or what ``reader`` reads after each
        committed epoch; with ``run``, the status follows it until it ends."""
        with self._lock:
            self._flow, self._sampled = flow, list(sampled)
            self._fresh = True
            self._finalized = None
            self._stop.set()  # the worker of what the view followed before
            self._wake, self._stop = threading.Event(), threading.Event()
            running = run is None or run.active
            self._state.update(caption=caption, error="",
                               status="running" if running else self._outcome(run))
            self._dirty = True
        self.keep_beating(run is not None and run.active)
        if reader is not None or run is not None:
            threading.Thread(target=self._work, args=(reader, run, self._wake, self._stop),
                             name=f"streamling-display-{self.node}", daemon=True).start()
        self._schedule(immediate=True)

    def detach(self, reason: str | None = None) -> None:
        """Stop following the run (a newer display of the node, or a run that did not start)."""
        with self._lock:
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            self._stop.set()
            if reason:
                self._state["status"] = reason
                self._dirty = True
        if unsubscribe is not None:
            unsubscribe()
        self.keep_beating(False)
        self._schedule(immediate=True)

    @staticmethod
    def _outcome(run: NotebookRun | None) -> str:
        if run is not None and run.error is not None:
            return f"failed: {run.error.headline()}"
        return "stopped"

    # --- events -------------------------------------------------------------------------------------

    def handle(self, event: ev.Event) -> None:
        """Fold one runtime event into the view (any thread); push traits, throttled."""
        with self._lock:
            changed = self._apply(event)
            self._dirty = self._dirty or changed
        if changed:
            self._schedule(immediate=False)

    def _apply(self, event: ev.Event) -> bool:
        if isinstance(event, ev.RowsSampled):
            return event.node in self._sampled and self._sampled_rows(event)
        if event.flow != self._flow:
            return False
        if isinstance(event, ev.EpochFinalized):
            self._finalized = event.epoch
            self._wake.set()
            return False
        if isinstance(event, ev.FlowStarted):
            self._state["status"] = "running"
        elif isinstance(event, ev.FlowStopped):
            self._state["status"] = f"failed: {event.error}" if event.error else f"stopped ({event.reason})"
            self._wake.set()
        elif isinstance(event, ev.PipelineError) and not event.retriable:
            self._state["status"] = f"failed: {event.message}"
        else:
            return False
        return True

    def _sampled_rows(self, event: ev.RowsSampled) -> bool:
        table = event.table
        if table is None:
            return False
        latest = self._state["latest_epoch"]
        self._state["latest_epoch"] = event.epoch if latest is None else max(latest, event.epoch)
        if table.num_rows == 0:  # an idle epoch keeps the rows shown; the headline says it had none
            return True
        if self._fresh:
            self._window.clear()
            self._counts.clear()
            self._fresh = False
        key = (event.epoch, event.node)
        self._window[key] = table
        if event.count is not None:
            self._counts[key] = event.count
        self._trim()
        tables = [self._window[k] for k in sorted(self._window, key=lambda k: -k[0])]
        newest = max(k[0] for k in self._window)
        counts = [c for k, c in self._counts.items() if k[0] == newest]
        self._show(_concat(tables).slice(0, self.limit), [str(f.type) for f in tables[0].schema],
                   epoch=newest, first_epoch=min(k[0] for k in self._window),
                   count=sum(counts) if counts else None, updated_at=event.at)
        return True

    def _trim(self) -> None:
        """Keep the newest epochs that fill ``limit`` rows; forget older ones."""
        rows = 0
        for key in sorted(self._window, key=lambda k: -k[0]):
            if rows >= self.limit:
                del self._window[key]
                self._counts.pop(key, None)
            else:
                rows += self._window[key].num_rows

    def _show(self, table: pa.Table, types: list[str], **state: Any) -> None:
        self._table, self._types = table, types
        self._state.update(state)

    def show_table(self, table: pa.Table, **state: Any) -> None:
        """Show ``table`` (with its exact types) and ``state`` at once, outside any run (``display(df)``)."""
        with self._lock:
            self._show(table, [str(f.type) for f in table.schema], updated_at=time.time())
            self._state.update(state)
            self._dirty = True
        self.flush()

    def update_view(self, **state: Any) -> None:
        """Show ``state`` (status, caption, error…) now: a display of a query outside any run says how it goes."""
        with self._lock:
            self._state.update(state)
            self._dirty = True
        self._schedule(immediate=True)

    # --- the sink's target (worker thread) ----------------------------------------------------------

    def _work(self, reader: TargetReader | None, run: NotebookRun | None, wake: threading.Event,
              stop: threading.Event) -> None:
        """Read the target whenever an epoch committed (coalesced); end with the run or the view."""
        try:
            while not stop.is_set():
                woke = wake.wait(_WATCH_SECS)
                if stop.is_set():
                    return
                ended = run is not None and not run.active
                if woke or ended:
                    wake.clear()
                    if reader is not None:
                        self._read(reader)
                if ended:
                    self.update_view(status=self._outcome(run))
                    self.keep_beating(False)
                    return
        finally:
            if reader is not None:
                try:
                    reader.close()
                except Exception:  # noqa: BLE001 - closing a read-only connection is best effort
                    log.debug("closing the display reader of %s", self.node, exc_info=True)

    def _read(self, reader: TargetReader) -> None:
        try:
            table, types = reader.read(self.limit)
        except Exception as exc:  # noqa: BLE001 - a display never fails the pipeline; it says what went wrong
            self.update_view(error=f"{reader.error_text(exc)} — the pipeline is not affected; the next committed epoch "
                            "reads it again")
            return
        with self._lock:
            self._show(table, types, epoch=self._finalized, first_epoch=self._finalized, count=None,
                       updated_at=time.time(), error="")
            self._dirty = True
        self._schedule(immediate=False)

    # --- pushing traits (at most a few times a second; the last state always goes out) ----------------

    def _push(self) -> None:
        """Send the state to the front end (caller holds the lock)."""
        self._dirty = False
        self._last_push = time.monotonic()
        table = self._table
        try:
            with self.hold_sync():
                for name, value in self._state.items():
                    setattr(self, name, value)
                if table is not self._pushed:
                    self._pushed = table
                    self.columns = table.column_names if table is not None else []
                    self.types, self.rows = list(self._types), _rows_json(table) if table is not None else []
        except Exception:  # noqa: BLE001 - a closed comm must not break the event bus
            log.debug("display update failed", exc_info=True)

    def flush(self) -> None:
        """Push the current state now."""
        self._schedule(immediate=True)

    # --- downloads ----------------------------------------------------------------------------------

    def table(self) -> pa.Table | None:
        """The rows shown (in the order they arrived), as Arrow."""
        with self._lock:
            return self._table

    def parquet_bytes(self) -> bytes:
        """The rows shown as a Parquet file, with their exact types."""
        import pyarrow.parquet as pq

        table = self.table()
        if table is None:
            raise StreamlingError("there are no rows to download yet", node=self.node,
                                  hint="wait for an epoch of `%streamling run`")
        out = pa.BufferOutputStream()
        pq.write_table(table, out)
        return bytes(out.getvalue().to_pybytes())

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """``{"type": "parquet"}`` from the front end: answer with the file as a binary buffer;
        ``{"type": "ping"}``: answer, so the front end knows a kernel is behind it (a notebook
        reopened from its saved widget state has none and shows the rows as a snapshot)."""
        if isinstance(content, dict) and content.get("type") == "ping":
            self.send({"type": "pong"})
            return
        if not isinstance(content, dict) or content.get("type") != "parquet":
            return
        try:
            data = self.parquet_bytes()
        except Exception as exc:  # noqa: BLE001 - the widget shows why there is no file
            text = exc.headline() if isinstance(exc, StreamlingError) else f"writing Parquet failed: {exc}"
            self.send({"type": "parquet", "error": text})
            return
        self.send({"type": "parquet", "filename": f"{self.node}.parquet"}, buffers=[data])

    # --- headless output ----------------------------------------------------------------------------

    def headline(self) -> str:
        """``42 rows · epoch 7 · 12:03:04`` (what the front end shows above the table)."""
        with self._lock:
            s, rows = dict(self._state), self._table.num_rows if self._table is not None else 0
        parts = [f"{rows} row{'s' if rows != 1 else ''}"]
        if s["epoch"] is not None:
            first = s["first_epoch"]
            parts.append(f"epochs {first}–{s['epoch']}" if first is not None and first != s["epoch"]
                         else f"epoch {s['epoch']}")
        if s["count"] is not None:
            parts.append(f"{s['count']:,} rows in epoch {s['epoch']}")
        if s["latest_epoch"] is not None and s["epoch"] is not None and s["latest_epoch"] > s["epoch"]:
            parts.append(f"no rows since (epoch {s['latest_epoch']})")
        if s["updated_at"]:
            parts.append(time.strftime("%H:%M:%S", time.localtime(s["updated_at"])))
        return " · ".join(parts)

    def summary_text(self) -> str:
        with self._lock:
            s, table = dict(self._state), self._table
        lines = [f"streamling display: {self.kind} '{self.node}' · {s['status']}", s["caption"], self.headline()]
        if s["error"]:
            lines.append(f"error: {s['error']}")
        if table is not None:
            lines.append(render.table_text(table, "rows", self.limit))
        return "\n".join(lines)

    def summary_html(self) -> str:
        with self._lock:
            s, table = dict(self._state), self._table
        esc = html.escape
        out = [f'<div class="sl-display-summary"><p><strong>{esc(self.kind)} {esc(self.node)}</strong> &middot; '
               f'<code>{esc(s["status"])}</code></p><p>{esc(s["caption"])}</p>']
        if s["error"]:
            out.append(f"<p><strong>error</strong>: {esc(s['error'])}</p>")
        out.append(render.table_html(table, self.headline(), self.limit) if table is not None
                   else f"<p><i>{esc(self.headline())}</i></p>")
        out.append("</div>")
        return "".join(out)


# --- the magic --------------------------------------------------------------------------------------


def display_node(nb: NotebookPipeline, name: str, rows: int | None = None) -> ResultView:
    """``%streamling display NAME [--rows N]``: a view of the node that follows the current (or
    next) run; a newer display of the same node replaces the older one."""
    limit = DEFAULT_ROWS if rows is None else rows
    if name not in nb.nodes:
        raise StreamlingError(f"there is no node '{name}'{did_you_mean(name, list(nb.nodes))}", node=name,
                              hint=f"nodes: {', '.join(nb.nodes)}" if nb.nodes
                              else "define nodes with %%streamling source/transform/sink cells first")
    if not 1 <= limit <= MAX_ROWS:
        raise StreamlingError(f"--rows {limit} is out of range for a display", node=name,
                              hint=f"give 1 to {MAX_ROWS:,} rows (default {DEFAULT_ROWS})")
    view = ResultView(name, nb.nodes[name][0], limit)
    previous = nb.displays.get(name)
    if previous is not None:
        previous.detach(f"replaced by a newer display of '{name}'")
    nb.displays[name] = view
    if nb.current is not None:
        view.attach(nb.current, seed=nb.latest_sample)
    return view


def is_dataframe(obj: Any) -> bool:
    """A PySpark DataFrame (classic or Connect), told by its class without importing pyspark."""
    cls = type(obj)
    return cls.__name__ == "DataFrame" and cls.__module__.startswith("pyspark.sql")
