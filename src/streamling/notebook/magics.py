"""``%%streamling`` cell magics and ``%streamling`` line magics.

One node per cell (re-running a cell replaces the node), line magics to validate, show, preview,
run, debug and export. A failing magic fails its cell with a one-line ``Node 'x': … — …``
message (so "Run all", nbval and jobs stop); ``%config StreamlingMagics.full_traceback = True``
shows the whole traceback instead.
"""

from __future__ import annotations

import argparse
import shlex
import threading
from typing import Any, TextIO, cast

import yaml
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class, no_var_expand
from IPython.display import display
from traitlets import Bool, Int, Unicode

from streamling.errors import StreamlingError, java_message
from streamling.notebook import render
from streamling.notebook.session import DebugResult, NotebookPipeline, Preview, problems_of

USAGE = """\
%%streamling source NAME [--type T]                 body: the node's YAML keys
%%streamling transform NAME [--from A[,B]] [--type sql|script|…] [--language javascript|typescript]
                                                     body: SQL (default), JS/TS for script, YAML otherwise
%%streamling sink NAME --from A [--type T]          body: the node's YAML keys
%%streamling pipeline                               body: a whole pipeline YAML
(any cell: --option KEY=VALUE, VALUE read as YAML, repeatable)
%streamling validate | show | yaml | status | stop | reset
%streamling preview NODE [--rows N]
%streamling run [--rows N | --seconds S] [--wait] [--sample N]
%streamling wait [--timeout S]
%streamling capture NODE | debug NODE | remove NODE | export PATH"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would sys.exit(); a magic must raise
        raise StreamlingError(f"{message}", hint=f"usage:\n{USAGE}")


def _parser() -> _Parser:
    p = _Parser(prog="%streamling", add_help=False)
    p.add_argument("command")
    p.add_argument("name", nargs="?")
    p.add_argument("--from", dest="from_")
    p.add_argument("--type")
    p.add_argument("--language")
    p.add_argument("--option", action="append", default=[])
    p.add_argument("--rows", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--timeout", type=float)
    p.add_argument("--sample", type=int)
    p.add_argument("--wait", action="store_true")
    return p


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


def _yaml_body(text: str, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise StreamlingError(f"the cell body is not valid YAML{where}: {getattr(exc, 'problem', exc)}",
                              hint=f"write the {what}'s keys as in the pipeline YAML") from exc
    if not isinstance(data, dict):
        raise StreamlingError("the cell body must be YAML keys (a mapping)",
                              hint=f"write the {what}'s keys as in the pipeline YAML, e.g. 'type: …'")
    return data


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

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self._pipeline: NotebookPipeline | None = None

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
            args = _parser().parse_args(shlex.split(line))
            if cell is None:
                return self._line(args)
            return self._cell(args, cell)
        except StreamlingError as exc:
            if self.full_traceback:
                raise
            raise UsageError(one_line(exc)) from None
        except UsageError:
            raise
        except Exception as exc:
            if self.full_traceback:
                raise
            raise UsageError(f"{java_message(exc)} — `%config StreamlingMagics.full_traceback = True` "
                             "shows the full traceback") from None

    # --- cells ----------------------------------------------------------------------------------

    def _options(self, args: argparse.Namespace) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for item in args.option:
            key, sep, value = item.partition("=")
            if not sep:
                raise StreamlingError(f"--option '{item}' is not KEY=VALUE", hint="e.g. --option primary_key=id")
            out[key.strip()] = yaml.safe_load(value)
        return out

    def _cell(self, args: argparse.Namespace, body: str) -> Any:
        kind = args.command
        if kind == "pipeline":
            self.pipeline.load_document(yaml.safe_load(body) if body.strip() else None)
            return self._validated()
        if kind not in ("source", "transform", "sink"):
            raise StreamlingError(f"unknown cell kind '{kind}'", hint=f"usage:\n{USAGE}")
        if not args.name:
            raise StreamlingError(f"the {kind} needs a name", hint=f"%%streamling {kind} NAME …")
        name = args.name
        head: dict[str, Any] = {}
        if kind == "transform" and (args.type or "sql") == "sql":
            head = {"type": "sql"}
            rest: dict[str, Any] = {"sql": body.strip()}
        elif kind == "transform" and args.type == "script":
            head = {"type": "script", "language": args.language or "javascript"}
            rest = {"script": body.strip("\n") + "\n"}
        else:
            rest = _yaml_body(body, kind)
            if args.type:
                head["type"] = args.type
            elif "type" in rest:
                head["type"] = rest.pop("type")
        if args.from_:
            head["from"] = [s.strip() for s in args.from_.split(",") if s.strip()]
        elif kind == "sink" and "from" not in rest:
            raise StreamlingError("a sink reads one node: add --from UPSTREAM", node=name,
                                  hint=f"%%streamling sink {name} --from <transform or source>")
        definition = {**head, **rest, **self._options(args)}
        try:
            self.pipeline.define(kind, name, definition)
        except StreamlingError as exc:
            exc.node = exc.node or name
            raise
        if kind == "transform" and name in self.pipeline.captures:
            return self._debug_view(self.pipeline.debug(name))
        return None

    def _validated(self) -> render.Rendered:
        spec = self.pipeline.spec()
        counts = {k: len(spec.of_kind(k)) for k in ("source", "transform", "sink")}
        return render.Rendered(f"pipeline is valid: {counts['source']} sources, {counts['transform']} transforms, "
                               f"{counts['sink']} sinks")

    # --- lines ----------------------------------------------------------------------------------

    def _line(self, args: argparse.Namespace) -> Any:
        command = args.command
        nb = self.pipeline
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
        nb.start(rows=args.rows, seconds=args.seconds, sample_rows=args.sample or self.sample_rows, monitor=monitor,
                 print_out=cast(TextIO, _WidgetStream(printed)) if printed is not None else None)
        if monitor is not None:
            monitor.set_status("running")
            if not args.wait:
                display(monitor)
                if printed is not None and any(body.get("type") == "print"
                                               for kind, body in nb.nodes.values() if kind == "sink"):
                    bundle = printed._repr_mimebundle_()
                    bundle = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
                    # What headless renderers show instead of the live area (a --wait run prints in its cell).
                    bundle["text/plain"] = "print sink rows appear here while the pipeline runs"
                    display(bundle, raw=True)
        if args.wait:
            return self._wait(args.timeout)
        return None

    def _wait(self, timeout: float | None) -> Any:
        nb = self.pipeline
        run = nb.current
        if run is None:
            raise StreamlingError("no pipeline has been started", hint="start one with `%streamling run`")
        if not run.wait(timeout):
            raise StreamlingError(f"the pipeline is still running after {timeout:g}s",
                                  hint="wait longer, or `%streamling stop`")
        if nb.monitor is not None:
            nb.monitor.set_status("failed" if run.error else "finished")
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
        panels = [(f"input: {name}", table) for name, table in result.capture.inputs.items()]
        if result.before is not None and result.before is not result.after:
            panels.append(("output before the edit", result.before))
        panels.append(("output now", result.after))
        text = summary + "\n\n" + "\n\n".join(render.table_text(t, title, 10) for title, t in panels)
        return render.Rendered(text, html_text=f"<p>{summary}</p>" + render.side_by_side(panels, 10))
