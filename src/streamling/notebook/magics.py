"""``%%streamling`` cell magics and ``%streamling`` line magics.

One node per cell (re-running a cell replaces the node), line magics to validate, show, preview,
run, debug and export. What a cell means is decided in ``streamling.notebook.cells``, which the
bundle compiler shares, so a notebook deployed as a job builds the pipeline its cells build here.

A failing magic raises ``PipelineError`` with one ``Node 'x': … — …`` line per problem; the
extension's exception handler (``show_pipeline_error``) shows just that as the cell's error, so
"Run all", nbconvert, papermill, nbval and jobs stop there. ``%config
StreamlingMagics.full_traceback = True`` raises the original exception with its whole traceback.
"""

from __future__ import annotations

import argparse
import html
import logging
import threading
from collections.abc import Mapping
from typing import Any, TextIO, cast

from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.display import display
from traitlets import Bool, Int, Unicode, observe

from streamling.errors import StreamlingError, ValidationError, java_message
from streamling.notebook import render
from streamling.notebook.batches import DebugResult, Preview
from streamling.notebook.cells import DISPLAY_COMMANDS, USAGE, PipelineError, cell_node, has_references, parse_line
from streamling.notebook.checks import CellCheck, check_node
from streamling.notebook.session import NotebookPipeline, problems_of
from streamling.sinks.print import PrintSink
from streamling.spec.pipeline import Kind

log = logging.getLogger("streamling.notebook")

__all__ = ["USAGE", "PipelineError", "StreamlingMagics", "one_line", "show_pipeline_error"]


def one_line(exc: BaseException) -> str:
    """``Node 'x': what went wrong — what to do`` for each problem; no Java stack trace."""
    if not isinstance(exc, StreamlingError):
        return java_message(exc)
    lines = []
    for problem in problems_of(exc):
        where = f" (at {problem.location.path})" if problem.location and problem.node is None else ""
        head = f"Node '{problem.node}': " if problem.node else ""
        hint = f" — {problem.hint}" if problem.hint else ""
        lines.append(f"{head}{problem.message}{where}{hint}")
    return "\n".join(lines)


def show_pipeline_error(shell: Any, etype: type[BaseException], value: BaseException, tb: Any,
                        tb_offset: int | None = None) -> list[str]:
    """IPython's custom exception handler for ``PipelineError``: one error output, the message only.

    The kernel sends it as the cell's error (ename ``PipelineError``, evalue the message, a traceback
    of just ``PipelineError: <message>``), so the cell fails for every runner and nothing else is
    printed. With ``%config StreamlingMagics.full_traceback = True`` the usual traceback is shown.
    """
    magics = shell.magics_manager.registry.get("StreamlingMagics")
    if magics is not None and magics.full_traceback:
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    else:
        stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)  # sends the error output (ipykernel) or prints it (terminal)
    return cast(list[str], stb)


class _WidgetStream:
    """A text stream appending to an ``ipywidgets.Output`` from any thread (the documented way)."""

    def __init__(self, output: Any) -> None:
        self.output = output
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:  # append_stdout rebuilds the outputs tuple: serialise writers
            self.output.append_stdout(text)
        return len(text)

    def flush(self) -> None:
        return None


@magics_class
class StreamlingMagics(Magics):
    """The notebook front of streamling; one pipeline per kernel."""

    full_traceback = Bool(False, help="show the full Python traceback when a magic fails").tag(config=True)
    application_id = Unicode("", help="application_id of the notebook's pipeline (default: config)").tag(
        config=True)
    config_name = Unicode("", help="config file name (default: config.yaml in the working directory)").tag(
        config=True)
    monitor = Bool(True, help="show the live monitor widget when a pipeline starts").tag(config=True)
    sample_rows = Int(20, help="rows sampled per node per epoch for the monitor and debugging").tag(config=True)
    in_job = Bool(False, help="the notebook runs as a job task: display-only commands and reset are skipped")

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._pipeline: NotebookPipeline | None = None

    @observe("full_traceback")
    def _full_traceback_changed(self, change: Mapping[str, Any]) -> None:
        """Spark's and py4j's own failure logs are part of the full picture: shown only with it."""
        from streamling.execution import quiet_spark_python_logs

        quiet_spark_python_logs(debug=bool(change["new"]))

    @property
    def pipeline(self) -> NotebookPipeline:
        if self._pipeline is None:
            self._pipeline = NotebookPipeline(application_id=self.application_id or None,
                                              config=self.config_name or None)
        return self._pipeline

    @no_var_expand
    @line_cell_magic
    def streamling(self, line: str, cell: str | None = None) -> Any:
        try:
            args = parse_line(line, self._parameters(line))
            if cell is None:
                return self._line(args)
            return self._cell(args, cell)
        except StreamlingError as exc:
            if self.full_traceback:
                raise
            raise PipelineError(one_line(exc)) from None
        except PipelineError:
            raise
        except Exception as exc:
            if self.full_traceback:
                raise
            raise PipelineError(f"{java_message(exc)} — `%config StreamlingMagics.full_traceback = True` "
                                "shows the full traceback") from None

    # --- cells ----------------------------------------------------------------------------------

    def _parameters(self, text: str) -> Mapping[str, str] | None:
        """The values ``{{name}}`` / ``${name}`` refer to: the kernel's ``dbutils`` widgets (job
        parameters over declared defaults). ``None`` when ``text`` refers to none."""
        if not has_references(text):
            return None
        from streamling.notebook.dbutils import dbutils as local

        user = self.shell.user_ns.get("dbutils") if self.shell is not None else None
        get_all = getattr(getattr(user, "widgets", None), "getAll", None)
        if user is not None and user is not local and callable(get_all):
            try:  # Databricks' own dbutils: its widgets hold the job's parameters
                return {str(k): str(v) for k, v in dict(get_all()).items()}
            except Exception:  # noqa: BLE001 - an older dbutils without getAll: the local widgets
                pass
        return local.widgets.getAll()

    def _cell(self, args: argparse.Namespace, body: str) -> Any:
        with self.pipeline.edit():  # a cell that fails changes nothing
            return self._define(args, body)

    def _define(self, args: argparse.Namespace, body: str) -> Any:
        try:
            node = cell_node(args, body, self._parameters(body))
        except StreamlingError as exc:  # a body that does not parse is its node's problem
            exc.node = exc.node or args.name
            raise
        if node.kind == "pipeline":
            self.pipeline.load_document(node.definition)
            return self._validated()
        name = str(node.name)
        kind = cast(Kind, node.kind)
        try:
            self.pipeline.define(kind, name, node.definition)
        except StreamlingError as exc:
            exc.node = exc.node or name
            raise
        check = check_node(self.pipeline.to_yaml(), kind, name)
        if check.errors:
            raise ValidationError(check.errors)
        if check.undefined:
            display(self._undefined_view(check))
        if node.kind == "transform" and name in self.pipeline.captures:
            return self._debug_view(self.pipeline.debug(name))
        schema = None if check.undefined else self.pipeline.node_schema(name)
        return render.schema_view(schema.node, schema.columns, schema.primary_key) if schema else None

    @staticmethod
    def _undefined_view(check: CellCheck) -> render.Rendered:
        """A note, not an error: the names may be defined by later cells."""
        lines = one_line(ValidationError(check.undefined)).splitlines()
        text = "\n".join(f"note: {line} — fine if a later cell defines it, else fix the name "
                         "(`%streamling validate` and `run` fail while it is missing)" for line in lines)
        html_lines = "<br>".join(html.escape(line) for line in text.splitlines())
        return render.Rendered(text, html_text=f'<div style="border-left:3px solid #d9a400;padding-left:6px">'
                                               f"{html_lines}</div>")

    def _validated(self) -> render.Rendered:
        spec = self.pipeline.plan(analyze=None).spec
        counts = {k: len(spec.of_kind(k)) for k in ("source", "transform", "sink")}
        return render.Rendered(f"pipeline is valid: {counts['source']} sources, {counts['transform']} transforms, "
                               f"{counts['sink']} sinks")

    # --- lines ----------------------------------------------------------------------------------

    def _line(self, args: argparse.Namespace) -> Any:
        command = args.command
        nb = self.pipeline
        if self.in_job and (command in DISPLAY_COMMANDS or command == "reset"):
            # as in a job whose notebook is compiled: only the notebook shows these, and a job never
            # deletes its checkpoints
            (log.warning if command == "reset" else log.info)(
                "`%%streamling %s` is skipped in a job%s", command,
                ": a job never deletes its checkpoints (start over with a new application_id)" if command == "reset"
                else " (it only shows something in the notebook)")
            return None
        if command == "validate":
            return self._validated()
        if command == "yaml":
            return render.Rendered(nb.to_yaml())
        if command == "show":
            description = nb.plan(analyze=True).describe()
            return render.Rendered(render.dag_text(description), svg=render.dag_svg(description))
        if command == "preview":
            rows = args.rows or 10
            return self._preview_view(nb.preview(self._name(args), rows=rows), rows)
        if command == "display":
            from streamling.notebook.display import display_node

            return display_node(nb, self._name(args), rows=args.rows)
        if command == "run":
            return self._run(args)
        if command == "wait":
            return self._wait(args.timeout)
        if command == "stop":
            nb.stop()
            return self._status()
        if command == "status":
            return self._status()
        if command == "export":
            path = nb.relative(nb.export(self._name(args, "PATH")))
            return render.Rendered(f"wrote {path} — run it with: streamling {path}")
        if command == "reset":
            root = nb.relative(nb.reset())
            return render.Rendered(f"checkpoints cleared: {root}")
        if command == "remove":
            nb.remove(self._name(args))
            return None
        if command == "capture":
            capture = nb.capture(self._name(args))
            rows = ", ".join(f"{k}: {t.num_rows} rows" for k, t in capture.inputs.items())
            return render.Rendered(f"captured the batch of '{capture.node}' from epoch {capture.epoch} ({rows}); "
                                   f"edit its cell and run it, or `%streamling debug {capture.node}`")
        if command == "debug":
            return self._debug_view(nb.debug(self._name(args)))
        raise StreamlingError(f"unknown command '{command}'", hint=f"usage:\n{USAGE}")

    @staticmethod
    def _name(args: argparse.Namespace, what: str = "NODE") -> str:
        if not args.name:
            raise StreamlingError(f"`%streamling {args.command}` needs {what}",
                                  hint=f"%streamling {args.command} {what}")
        return str(args.name)

    def _run(self, args: argparse.Namespace) -> Any:
        if args.rows is not None and args.seconds is not None:
            raise StreamlingError("give --rows or --seconds, not both")
        nb = self.pipeline
        monitor = None
        if self.monitor:
            from streamling.notebook.monitor import Monitor

            monitor = Monitor.for_plan(nb.plan().describe(), title=nb.settings().application_id)
        # In the background, print-sink rows go to an output area under the monitor: a thread's
        # print would land in whichever cell runs at that moment. A blocking run keeps its cell.
        printed = None
        if monitor is not None and not args.wait:
            from ipywidgets import Output

            printed = Output(layout={"max_height": "240px", "overflow": "auto"})
        print_out = cast(TextIO, _WidgetStream(printed)) if printed is not None else None
        # Run again while running: the cells' current definitions replace the running pipeline in this
        # warm session, from its last committed epoch (checked first: a broken edit keeps the old one).
        nb.start(rows=args.rows, seconds=args.seconds, sample_rows=args.sample or self.sample_rows, monitor=monitor,
                 print_out=print_out, replace=True)
        if monitor is not None:
            monitor.set_controller(lambda action: self._control(action, args, print_out))
            if not args.wait:
                monitor.display_handle = display(monitor, display_id=True)
                if printed is not None and nb.current is not None and any(
                        isinstance(node, PrintSink) for node in nb.current.run.plan.nodes.values()):
                    bundle = printed._repr_mimebundle_()
                    bundle = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
                    # What headless renderers show instead of the live area (a --wait run prints in its cell).
                    bundle["text/plain"] = "print sink rows appear here while the pipeline runs"
                    display(bundle, raw=True)
        if args.wait:
            return self._wait(args.timeout)
        return None

    def _control(self, action: str, args: argparse.Namespace, print_out: TextIO | None) -> None:
        """The monitor's buttons: stop the run, or stop it and start the cells' current definitions
        again on the same checkpoints (an edited transform takes over where the last epoch ended)."""
        nb = self.pipeline
        monitor = nb.monitor
        current = nb.current if nb.current is not None and nb.current.active else None
        if action == "stop":
            if current is not None:
                current.stop()
            return
        if action != "restart" or monitor is None:
            return
        description = nb.plan(analyze=True).describe()  # a broken edit fails here and keeps the run going
        if current is not None:
            monitor.set_status("restarting: waiting for the epoch in flight")
            current.stop(reason="restarted from the monitor")
        monitor.reset(description)
        nb.start(rows=args.rows, seconds=args.seconds, sample_rows=args.sample or self.sample_rows, monitor=monitor,
                 print_out=print_out)

    def _wait(self, timeout: float | None) -> Any:
        nb = self.pipeline
        run = nb.current
        if run is None:
            raise StreamlingError("no pipeline has been started", hint="start one with `%streamling run`")
        if not run.wait(timeout):
            raise StreamlingError(f"the pipeline is still running after {timeout:g}s",
                                  hint="wait longer, or `%streamling stop`")
        if run.error is not None:
            raise run.error
        return self._status()

    def _status(self) -> render.Rendered:
        monitor = self.pipeline.monitor
        if monitor is not None:  # the monitor's summary says all the plain status does, and more
            return render.Rendered(monitor.summary_text(), html_text=monitor.summary_html())
        status = self.pipeline.status()
        lines = [f"pipeline {status['state']}" + (f" after {status['seconds']}s" if "seconds" in status else "")]
        for flow, info in status["flows"].items():
            lines.append(f"  flow {flow}: last epoch {info['last_epoch']}, {info['rows_to_sinks']} rows to sinks"
                         + (f", stopped: {info['stop_reason']}" if info.get("stop_reason") else ""))
        if status.get("error"):
            lines.append(f"  error: {status['error']}")
        return render.Rendered("\n".join(lines))

    def _preview_view(self, preview: Preview, rows: int) -> render.Rendered:
        panels = [(f"input: {name}", table) for name, table in preview.inputs.items()]
        if preview.output is not None:
            panels.append((f"output: {preview.node}", preview.output))
        text = "\n\n".join(render.table_text(t, title, rows) for title, t in panels)
        return render.Rendered(text, html_text=render.side_by_side(panels, rows))

    def _debug_view(self, result: DebugResult) -> render.Rendered:
        changes = result.changes()
        origin = (f"epoch {result.capture.epoch} of the running pipeline" if result.capture.origin == "run"
                  else "the last preview")
        summary = (f"'{result.node}' re-run on the batch captured from {origin}: "
                   f"{changes['rows_before']} → {changes['rows_after']} rows; "
                   f"+{changes['rows_added']} / -{changes['rows_removed']} / ~{changes['rows_changed']} rows")
        if changes["columns_added"] or changes["columns_removed"]:
            summary += (f"; columns +[{', '.join(changes['columns_added'])}] "
                        f"-[{', '.join(changes['columns_removed'])}]")
        running = self.pipeline.current
        if running is not None and running.active:
            summary += " (the running pipeline keeps its definition until `%streamling stop` and `run`)"
        return render.debug_view(summary, result.capture.inputs, result.before, result.after, result.key)
