"""A pipeline authored cell by cell, run on the very spec, planner and runtime the YAML uses.

``NotebookPipeline`` keeps one node definition per cell, in cell order, as the same mapping the
pipeline YAML would hold. Every operation (validate, show, preview, run, export) first turns the
cells into a YAML document and parses it with ``streamling.spec.parse_pipeline``, so a notebook
and its exported YAML cannot drift apart. A started run is a ``notebook.run.NotebookRun``; what
preview, capture and debug return is ``notebook.batches``'.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from streamling import storage
from streamling.config import Settings, load_settings
from streamling.errors import StreamlingError, ValidationError, java_message
from streamling.notebook.batches import Capture, DebugResult, Preview
from streamling.notebook.run import NotebookRun
from streamling.runtime import events as ev
from streamling.spec import PipelineSpec, parse_pipeline
from streamling.spec.pipeline import SECTIONS, Kind
from streamling.spec.writer import pipeline_yaml

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from streamling.notebook.checks import NodeSchema
    from streamling.notebook.display import ResultView
    from streamling.runtime.planner import Flow, Plan

KIND_SECTION: dict[Kind, str] = {kind: section for section, kind in SECTIONS.items()}


class _Samples:
    """Keeps the latest sampled batch of every node (an EventBus subscriber); an empty epoch of an
    idle stream does not replace a batch that had rows, since there is nothing to debug in it."""

    def __init__(self) -> None:
        self.latest: dict[str, ev.RowsSampled] = {}
        self._lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.RowsSampled) and event.table is not None:
            with self._lock:
                if event.rows or event.node not in self.latest:
                    self.latest[event.node] = event

    def get(self, node: str) -> ev.RowsSampled | None:
        with self._lock:
            return self.latest.get(node)


class NotebookPipeline:
    """The notebook's pipeline: node definitions in cell order plus what running it needs."""

    def __init__(self, application_id: str | None = None, config: str | None = None,
                 cwd: Path | None = None, spark: SparkSession | None = None) -> None:
        self.cwd = cwd or Path.cwd()
        self.config = config
        self.application_id = application_id
        self.nodes: dict[str, tuple[Kind, dict[str, Any]]] = {}
        self.extra: dict[str, Any] = {}
        self.captures: dict[str, Capture] = {}
        self.current: NotebookRun | None = None
        #: why the last ``start`` failed before its run existed (planning, connecting)
        self.start_error: StreamlingError | None = None
        self.monitor: Any = None
        self._spark = spark
        self._samples = _Samples()
        #: ``%streamling display`` views by node: each follows every run started after it
        self.displays: dict[str, ResultView] = {}
        #: source rows a preview reads (and a debug capture keeps) before showing ``--rows`` of each node.
        self.preview_input_rows = 1000
        #: the share of a run's time its samples (monitor, displays, captures) may take: the first
        #: epoch is sampled, later ones as often as that allows (``EventBus.sample_share``).
        self.sample_share = 0.05

    # --- authoring ----------------------------------------------------------------------------

    def define(self, kind: Kind, name: str, body: dict[str, Any]) -> None:
        """Add or replace a node; a re-run cell keeps its place in the pipeline."""
        previous = self.nodes.get(name)
        if previous is not None and previous[0] != kind:
            raise StreamlingError(f"'{name}' is already a {previous[0]}", node=name,
                                  hint=f"use another name, or `%streamling remove {name}` first")
        self.nodes[name] = (kind, body)

    @contextlib.contextmanager
    def edit(self) -> Iterator[None]:
        """A cell's change to the definitions: kept only if the cell succeeds. A cell that fails
        (bad YAML, a check, a SQL error, a script that throws on the captured batch) leaves every
        node as it was, so ``yaml``, ``validate``, Restart and ``run`` go on using what worked."""
        nodes, extra = dict(self.nodes), dict(self.extra)
        try:
            yield
        except BaseException:
            self.nodes, self.extra = nodes, extra
            raise

    def remove(self, name: str) -> None:
        if name not in self.nodes:
            raise StreamlingError(f"there is no node '{name}'", node=name,
                                  hint=f"nodes: {', '.join(self.nodes) or 'none yet'}")
        del self.nodes[name]
        self.captures.pop(name, None)

    def load_document(self, data: Any) -> None:
        """``%%streamling pipeline``: replace every node with a whole pipeline document."""
        if isinstance(data, dict) and "definition" in data and not (set(data) & set(SECTIONS)):
            data = data["definition"]
        if not isinstance(data, dict):
            raise StreamlingError("a pipeline must be a mapping with 'sources', 'transforms' and 'sinks'",
                                  hint="paste the pipeline YAML into the cell")
        nodes: dict[str, tuple[Kind, dict[str, Any]]] = {}
        for section, kind in SECTIONS.items():
            entries = data.get(section) or {}
            if not isinstance(entries, dict):
                raise StreamlingError(f"'{section}' must be a mapping from node name to definition")
            for name, body in entries.items():
                nodes[str(name)] = (kind, body)
        self.nodes = nodes
        self.extra = {k: v for k, v in data.items() if k not in SECTIONS}

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = dict(self.extra)
        for section, kind in SECTIONS.items():
            doc[section] = {name: body for name, (k, body) in self.nodes.items() if k == kind}
        return doc

    def to_yaml(self) -> str:
        return pipeline_yaml(self.document())

    def spec(self) -> PipelineSpec:
        if not self.nodes:
            raise StreamlingError("the notebook has no pipeline yet",
                                  hint="add nodes with %%streamling source/transform/sink cells")
        return parse_pipeline(self.to_yaml(), source="<notebook>")

    def export(self, path: str | Path) -> Path:
        """Write the pipeline YAML; ``streamling PATH`` runs it unchanged."""
        self.spec()  # never export something that does not validate
        target = Path(path)
        if not target.is_absolute():
            target = self.cwd / target
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_yaml())
        return target

    # --- settings, Spark, plan ----------------------------------------------------------------

    def settings(self, **overrides: Any) -> Settings:
        """Settings as the CLI would load them in the notebook's folder; a relative ``state_dir``
        is anchored there, so checkpoints do not move when the kernel's working directory does."""
        if self.application_id:
            overrides.setdefault("application_id", self.application_id)
        settings = load_settings(self.config, cwd=self.cwd, overrides=overrides or None)
        state = settings.state_dir
        if not storage.is_local(state) or storage.local_path(state).is_absolute():
            return settings  # a URI of shared storage, or an absolute folder
        return settings.model_copy(update={"state_dir": str((self.cwd / storage.local_path(state)).resolve())})

    def spark(self) -> SparkSession:
        if self._spark is None:
            from streamling.runtime.session import build_session

            self._spark = build_session(self.settings(), app_name="streamling-notebook")
        return self._spark

    def node_schema(self, name: str) -> NodeSchema | None:
        """Node ``name``'s resolved schema when this pipeline already has a Spark session; ``None``
        without one, since a definition cell must stay instant: the node is then only built, which
        raises its own problems (see ``checks.resolved_schema``)."""
        from streamling.notebook.checks import resolved_schema

        return resolved_schema(self.document(), name, self.settings(), self._spark)

    def plan(self, analyze: bool | None = False, **overrides: Any) -> Plan:
        """The pipeline built as ``--validate`` builds it; analysed on Spark when ``analyze`` (``None``:
        only when the kernel already has a session, so a check never starts a JVM)."""
        from streamling.runtime.planner import analyze as analyze_plan
        from streamling.runtime.planner import build_plan

        plan = build_plan(self.spec(), self.settings(**overrides), dry_run=True)
        if analyze or (analyze is None and self._spark is not None):
            analyze_plan(plan, self.spark())
        return plan

    def relative(self, path: Path | str) -> str:
        """``path`` as the user would type it from the notebook's folder (a URI as it is)."""
        if isinstance(path, str):
            if not storage.is_local(path):
                return path
            path = storage.local_path(path)
        try:
            return str(path.resolve().relative_to(self.cwd.resolve()))
        except ValueError:
            return str(path)

    def checkpoint_root(self) -> str:
        """The application's checkpoints: a local folder or a URI of shared storage."""
        settings = self.settings()
        return storage.join(settings.state_dir, settings.application_id)

    def reset(self) -> str:
        """Forget where every flow stopped: the next run starts from the sources' beginnings."""
        if self.current is not None and self.current.active:
            raise StreamlingError("the pipeline is running", hint="run `%streamling stop` first")
        from streamling.state import create_state_backend

        root = self.checkpoint_root()
        storage.storage_for(root, None if storage.is_local(root) else self.spark()).delete(root)
        # The sources' positions copied to the state backend would place the next checkpoint.
        state = create_state_backend(self.settings())
        try:
            state.clear()
        finally:
            state.close()
        return root

    # --- preview ------------------------------------------------------------------------------

    def _flow_of(self, plan: Plan, node: str) -> Flow:
        for flow in plan.flows:
            if node in flow.node_names:
                return flow
        raise StreamlingError(f"there is no node '{node}'", node=node,
                              hint=f"nodes: {', '.join(plan.spec.nodes)}")

    def preview(self, node: str, rows: int = 10, timeout_secs: float = 120) -> Preview:
        """Pull a bounded sample from the node's sources and run the DAG up to ``node`` on it."""
        from streamling.runtime.epoch_dag import evaluate

        spark = self.spark()
        plan = self.plan(analyze=True)
        flow = self._flow_of(plan, node)
        # Read more input than is shown, so a selective filter still has rows to show.
        raw = {s.name: sample_source(spark, s, max(rows, self.preview_input_rows), timeout_secs)
               for s in plan.sources(flow)}
        frames_raw = {name: _frame(spark, table) for name, table in raw.items()}
        spec = plan.spec.nodes[node]
        target = spec.upstream[0] if spec.kind == "sink" and len(spec.upstream) == 1 else node
        try:
            frames = evaluate(plan, flow, spark, frames_raw, None, upto=None if spec.kind == "sink" else target)
            tables = {name: df.limit(self.preview_input_rows).toArrow() for name, df in frames.items()
                      if name in spec.upstream or name == node}
        except StreamlingError:
            raise
        except Exception as exc:
            raise StreamlingError(f"previewing failed: {java_message(exc)}", node=node, user=False,
                                  cause=exc) from exc
        inputs = {u: tables[u] for u in spec.upstream if u in tables}
        if spec.kind == "source":
            inputs = {}
        if spec.kind == "transform":
            self.captures[node] = Capture(node, None, inputs, self.nodes[node][1], origin="preview")
        return Preview(node, inputs, tables.get(node) if spec.kind != "sink" else None)

    # --- running ------------------------------------------------------------------------------

    def start(self, rows: int | None = None, seconds: float | None = None, sample_rows: int = 20,
              monitor: Any = None, print_out: TextIO | None = None, replace: bool = False) -> NotebookRun:
        """Start in the background. ``print_out`` receives the print sinks' lines (e.g. an output
        widget under the monitor), so rows printed later never land in whatever cell runs then.

        ``replace``: a running pipeline is swapped for the cells' current definitions in this warm
        session (no JVM restart): the new pipeline is validated and analysed first — a broken edit
        leaves the old one running — then the old one stops after its epoch in flight and the new
        one starts on the same checkpoint, where the old one's last committed epoch ended."""
        from streamling.runtime.pipeline import PipelineRun
        from streamling.sinks.print import PrintSink

        if self.current is not None and self.current.active:
            if not replace:
                raise StreamlingError("the pipeline is already running", hint="run `%streamling stop` first")
            self.plan(analyze=True)
            self.current.stop(reason="replaced by the cells' current definitions")
        overrides: dict[str, Any] = {}
        if rows is not None:
            overrides["num_records_before_stop"] = rows
        settings = self.settings(**overrides)
        bus = ev.EventBus()
        bus.sample_rows = sample_rows
        bus.sample_share = self.sample_share
        self._samples = _Samples()
        bus.subscribe(self._samples)
        if monitor is not None:
            bus.subscribe(monitor.handle)
        self.current, self.monitor, self.start_error = None, monitor, None
        try:
            pipeline = PipelineRun(self.spec(), settings, self.spark(), bus)
            # The run's numbers and its metrics (exported when open_telemetry_metrics says where), as a
            # CLI run has them; a kernel's runs come and go, so no admin API. The monitor reads them too.
            from streamling.telemetry.attach import attach

            telemetry = attach(pipeline.plan, settings, bus, admin_api=False)
        except BaseException as exc:  # the run never existed: it failed while starting
            self.start_error = exc if isinstance(exc, StreamlingError) else StreamlingError(
                f"the pipeline did not start: {java_message(exc)}", user=False, cause=exc)
            if monitor is not None:
                monitor.show_state("failed", self.start_error.headline())
            raise
        if monitor is not None:
            monitor.stats = telemetry.stats
        if print_out is not None:
            for node in pipeline.plan.nodes.values():
                if isinstance(node, PrintSink):
                    node.out = print_out
        run = NotebookRun(pipeline, seconds, telemetry, on_state=monitor.show_state if monitor is not None else None)
        for view in self.displays.values():  # before the first epoch: it samples the rows they show
            view.attach(run)
        self.current = run
        try:
            run.start()
        except BaseException:
            for view in self.displays.values():
                view.detach("the run did not start")
            raise
        return run

    def latest_sample(self, node: str) -> ev.RowsSampled | None:
        """The last batch of ``node`` with rows that the current (or last) run sampled."""
        return self._samples.get(node)

    def stop(self, timeout_secs: float = 120) -> None:
        """Stop after the epoch in flight; nothing to do from ``stopped``, ``failed`` or before a run."""
        if self.current is not None:
            self.current.stop(timeout_secs)

    def status(self) -> dict[str, Any]:
        run = self.current
        if run is None:
            error = self.start_error.headline() if self.start_error is not None else None
            return {"state": "failed" if error else "defined", "error": error, "flows": {}}
        return {"state": run.state, "error": run.error.headline() if run.error else None,
                "stop_reason": run.stop_reason,
                "seconds": round(time.time() - run.started_at, 1), "flows": run.run.status()}

    # --- interactive debugging ----------------------------------------------------------------

    def capture(self, node: str) -> Capture:
        """Keep the batch ``node`` processed most recently in the running (or last) pipeline."""
        kind, body = self._node(node)
        if kind != "transform":
            raise StreamlingError("only transforms can be debugged on a captured batch", node=node,
                                  hint="capture the transform that reads this node")
        spec = self.spec().nodes[node]
        inputs: dict[str, pa.Table] = {}
        epoch: int | None = None
        for upstream in spec.upstream:
            sample = self._samples.get(upstream)
            if sample is None or not sample.rows:
                raise StreamlingError(f"no batch of '{upstream}' with rows has been seen yet", node=node,
                                      hint="wait for an epoch of `%streamling run`, or use "
                                           f"`%streamling preview {node}`")
            inputs[upstream] = sample.table
            epoch = sample.epoch if epoch is None else max(epoch, sample.epoch)
        self.captures[node] = Capture(node, epoch, inputs, body, origin="run")
        return self.captures[node]

    def debug(self, node: str) -> DebugResult:
        """Re-run the node's current definition on its captured batch, next to the captured one's."""
        capture = self.captures.get(node)
        if capture is None:
            raise StreamlingError("no captured batch yet", node=node,
                                  hint=f"run `%streamling capture {node}` while the pipeline runs, or "
                                       f"`%streamling preview {node}`")
        spark = self.spark()
        after, key = self._apply(spark, node, self.nodes[node][1], capture)
        before = None
        if capture.definition != self.nodes[node][1]:
            try:
                before, _ = self._apply(spark, node, capture.definition, capture)
            except StreamlingError:
                before = None
        else:
            before = after
        return DebugResult(node, capture, before, after, key)

    def _apply(self, spark: SparkSession, node: str, definition: dict[str, Any],
               capture: Capture) -> tuple[pa.Table, list[str]]:
        from streamling.runtime.planner import build_plan

        saved = self.nodes[node]
        self.nodes[node] = (saved[0], definition)
        try:
            plan = build_plan(self.spec(), self.settings(), dry_run=True)
        finally:
            self.nodes[node] = saved
        transform = plan.nodes[node]
        frames = {name: _frame(spark, table) for name, table in capture.inputs.items()}
        try:
            out = transform.apply(spark, frames, None).toArrow()  # type: ignore[attr-defined]
        except StreamlingError:
            raise
        except Exception as exc:
            from streamling.errors import node_failure_from_text

            failure = node_failure_from_text(str(exc))
            if failure is not None:
                raise failure from exc
            raise StreamlingError(f"running the transform on the captured batch failed: {java_message(exc)}",
                                  node=node, hint="fix the cell and run it again", cause=exc) from exc
        return out, plan.keys.get(node, [])

    def _node(self, name: str) -> tuple[Kind, dict[str, Any]]:
        if name not in self.nodes:
            raise StreamlingError(f"there is no node '{name}'", node=name,
                                  hint=f"nodes: {', '.join(self.nodes) or 'none yet'}")
        return self.nodes[name]


def _frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    return spark.createDataFrame(table)


def sample_source(spark: SparkSession, source: Any, rows: int, timeout_secs: float) -> pa.Table:
    """The first ``rows`` rows a source yields, read by a throwaway streaming query."""
    got: dict[str, pa.Table] = {}
    done = threading.Event()

    def take(batch: DataFrame, _batch_id: int) -> None:
        if done.is_set():
            return
        table = batch.limit(rows).toArrow()
        if table.num_rows or source.bounded:
            got["table"] = table
            done.set()

    checkpoint = tempfile.mkdtemp(prefix="streamling-preview-")
    try:
        stream = source.read_sample(spark, rows)
        writer = stream.writeStream.foreachBatch(take).option("checkpointLocation", checkpoint)
        writer = (writer.trigger(availableNow=True) if source.bounded
                  else writer.trigger(processingTime="500 milliseconds"))
        query = writer.start()
        deadline = time.monotonic() + timeout_secs
        while not done.is_set() and query.isActive and time.monotonic() < deadline:
            done.wait(0.2)
        query.stop()
        error = query.exception()
        if error is not None and "table" not in got:
            raise source.ctx.error(f"reading a sample failed: {java_message(error)}", code="preview_failed")
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if "table" not in got:
        raise source.ctx.error(f"no rows arrived within {timeout_secs:.0f}s",
                               hint="check that the source has data (e.g. starting_offsets: earliest)",
                               code="preview_empty")
    return got["table"]


def problems_of(exc: StreamlingError) -> list[StreamlingError]:
    return exc.problems if isinstance(exc, ValidationError) else [exc]
