"""A notebook task whose cells run: the whole notebook in the job's driver, as Databricks runs one.

Every cell runs in order in one IPython shell of the driver process: Python cells as IPython runs
them (its magics included), ``%sql`` cells as Spark SQL statements (split and bound by
``streamling.bundle.sql_statements``; the last result shown in the log and kept as ``_sqldf``),
``%sh`` cells as shell scripts, ``%run`` cells as the included notebook's cells in the same
namespace; ``%md`` cells and cells tagged ``interactive`` do not run.
``spark``, ``sc``, ``dbutils``, ``display`` and ``displayHTML`` are defined, and ``from
databricks.sdk.runtime import …`` gets the same objects unless the Databricks SDK is installed.

``%%streamling`` cells build the pipeline with the same magics as in a notebook, on this task's
checkpoint; ``%streamling run`` starts it where the notebook runs it, and a notebook that only
defines nodes has it run after its last cell. The task ends once the last cell has run and the
pipeline and every streaming query the notebook started have ended, or at
``dbutils.notebook.exit(value)`` (its value is the task's output; the pipeline stops after its
epoch in flight and the notebook's streaming queries stop).

A failing cell fails the task: the log gets the traceback, the run the cell and the error's first
line (a cell tagged ``raises-exception`` is expected to fail: the notebook goes on). SIGTERM or
SIGINT (a cancelled run, a redeploy, a group-wide stop) stops the pipeline after its epoch in
flight, then the notebook's own streaming queries, interrupts the cell that runs and exits 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.notebook_reader import INTERACTIVE, RAISES, Cell, read_notebook, run_arguments, run_target
from streamling.bundle.sql_statements import bind_parameters, split_sql
from streamling.errors import StreamlingError, first_line, java_message
from streamling.notebook.dbutils import NotebookExit

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from streamling.config import Settings
    from streamling.notebook.session import NotebookPipeline

log = logging.getLogger("streamling.bundle.notebook")

#: rows of a DataFrame a job's ``display`` (and a ``%sql`` cell's result) writes to the log
SHOWN_ROWS = 20
#: how deep ``%run`` may nest (a notebook that includes itself would never end)
MAX_INCLUDE_DEPTH = 16


class _Stopped(BaseException):  # noqa: N818 - not an error: the task was asked to stop
    """Raised in the running cell when a stop signal arrives."""


class CellFailed(StreamlingError):
    """A cell of the notebook raised: the task fails with the cell and the error's first line."""


class NotebookJob:
    """Runs one notebook's cells in this process (see the module's docstring)."""

    def __init__(self, path: Path, name: str, folder: Path, settings: Settings, config_name: str | None = None,
                 output_path: Path | None = None, app_name: str = "streamling-job",
                 cells: list[Cell] | None = None) -> None:
        self.path = path  # the deployed snapshot
        self.cells = cells  # given: not read from ``path`` (a SQL task's file is one SQL cell)
        self.name = name  # as the bundle names it
        self.folder = folder  # its folder of the synced files: relative paths and %run resolve there
        self.settings = settings
        self.config_name = config_name
        self.output_path = output_path
        self.app_name = app_name
        self.stopping: str | None = None
        self._in_cell = False
        self._ended = threading.Event()
        self.shell: Any = None
        self.spark: SparkSession | None = None
        self.pipeline: NotebookPipeline | None = None
        #: ``dbutils.notebook.run`` children run one at a time: they take turns with this driver's shell
        self._child_lock = threading.RLock()
        #: the sessions of the children run so far: the task waits for, and stops, their streaming
        #: queries as it does its own
        self._child_sessions: list[SparkSession] = []

    # --- the run ----------------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            return self._run()
        finally:
            self._ended.set()

    def _run(self) -> int:
        cells = self.cells if self.cells is not None else read_notebook(self.path)
        self._start_shell()
        log.info("notebook %s: running %d cells", self.name, sum(1 for c in cells if c.kind == "code"))
        try:
            self._cells(cells, self.name, self.folder, depth=0)
            self._finish()
        except NotebookExit as done:
            # The notebook ends here: its pipeline stops after the epoch in flight, its queries stop.
            log.info("notebook %s exited with %r (dbutils.notebook.exit)", self.name, done.value)
            self._record_output(done.value)
            self._stop_all()
            self._drain()
        except _Stopped:
            pass
        except BaseException:
            # A failing cell ends the notebook: a pipeline it started stops after its epoch in flight
            # (within the shutdown budget) rather than with the process.
            self._stop_all()
            self._drain()
            raise
        if self.stopping:
            self._drain()
            log.info("notebook %s stopped (%s)", self.name, self.stopping)
        return 0

    def _start_shell(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        from streamling.notebook.cells import PipelineError
        from streamling.notebook.dbutils import dbutils, provide_databricks_runtime
        from streamling.notebook.magics import show_pipeline_error
        from streamling.notebook.session import NotebookPipeline
        from streamling.runtime.session import build_session

        os.chdir(self.folder)
        self.spark = build_session(self.settings, app_name=self.app_name)
        self.pipeline = NotebookPipeline(config=self.config_name, cwd=self.folder, spark=self.spark)
        shell = InteractiveShell.instance(colors="nocolor")
        self.shell = shell
        namespace = {"spark": self.spark, "sc": self.spark.sparkContext, "dbutils": dbutils,
                     "display": self.display, "displayHTML": self.display_html}
        shell.user_ns.update(namespace)
        shell.run_line_magic("load_ext", "streamling")
        # the notebook's own %load_ext loads it again without a word (it keeps these magics)
        assert shell.extension_manager is not None
        shell.extension_manager.loaded.discard("streamling")
        magics = shell.magics_manager.registry["StreamlingMagics"]
        magics._pipeline = self.pipeline
        magics.monitor = False  # the log, not a widget, shows the run
        magics.sample_rows = 0  # nothing shows samples in a job
        magics.in_job = True

        def quiet(shell_: Any, etype: type[BaseException], value: BaseException, tb: Any,
                  tb_offset: int | None = None) -> list[str]:
            if isinstance(value, PipelineError):
                return show_pipeline_error(shell_, etype, value, tb, tb_offset)
            return []  # an exit or a stop: not a failure, nothing to print

        shell.set_custom_exc((PipelineError, NotebookExit, _Stopped), quiet)
        dbutils.notebook.runner = self.run_notebook
        provide_databricks_runtime(namespace)

    def _cells(self, cells: list[Cell], name: str, folder: Path, depth: int) -> None:
        for cell in cells:
            if cell.kind != "code" or INTERACTIVE in cell.tags:
                continue
            if self.stopping:
                raise _Stopped()
            where = f"{name}: cell {cell.index}" + (f" (line {cell.lines[0]})" if cell.lines else "")
            try:
                self._cell(cell, folder, depth, where)
            except (NotebookExit, _Stopped, CellFailed):
                raise
            except BaseException as exc:  # noqa: BLE001 - the cell's failure, reported with where it was
                self._failed(cell, where, exc)

    def _cell(self, cell: Cell, folder: Path, depth: int, where: str) -> None:
        language, body, _ = cell.language()
        if language == "markdown" or not body.strip():
            return
        log.info("%s: running (%s)", where, language)
        if language == "sql":
            self._guarded(lambda: self._sql(body))
        elif language == "shell":
            self._guarded(lambda: self._shell_script(body, folder))
        elif language == "run":
            if depth >= MAX_INCLUDE_DEPTH:
                raise StreamlingError(f"%run nests more than {MAX_INCLUDE_DEPTH} notebooks deep",
                                      hint="a notebook includes itself, directly or through others")
            target = run_target(folder, body)
            _, arguments = run_arguments(body)
            with _widget_values(arguments):
                self._cells(read_notebook(target), target.name, target.parent, depth + 1)
        elif language == "python":
            self._python(cell, body, where)
        else:  # validation refuses these before a deploy
            raise StreamlingError(f"a `{language}` cell cannot run here")

    def _guarded(self, work: Callable[[], object]) -> None:
        """Runs a cell's work with a stop signal able to interrupt it."""
        self._in_cell = True
        try:
            work()
        finally:
            self._in_cell = False

    def _python(self, cell: Cell, body: str, where: str) -> None:
        self._in_cell = True
        try:
            result = self.shell.run_cell(body, store_history=True)
        finally:
            self._in_cell = False
        error = result.error_before_exec or result.error_in_exec
        if error is None:
            return
        if isinstance(error, (NotebookExit, _Stopped)):
            raise error
        if RAISES in cell.tags:
            log.warning("%s (tagged %s) failed as expected: %s", where, RAISES, _describe(error))
            return
        raise CellFailed(f"notebook {where} failed: {_describe(error)}", code="notebook_cell_failed",
                         hint="the driver log above has the traceback") from None

    def _failed(self, cell: Cell, where: str, exc: BaseException) -> None:
        if RAISES in cell.tags:
            log.warning("%s (tagged %s) failed as expected: %s", where, RAISES, _describe(exc))
            return
        log.error("%s failed", where, exc_info=(type(exc), exc, exc.__traceback__))
        raise CellFailed(f"notebook {where} failed: {_describe(exc)}", code="notebook_cell_failed",
                         hint="the driver log above has the traceback") from None

    # --- cells of other languages ---------------------------------------------------------------

    def _sql(self, body: str) -> None:
        from streamling.notebook.dbutils import dbutils

        assert self.spark is not None
        # a child notebook's (dbutils.notebook.run) own widget values, else the job's
        values = self.shell.user_ns.get("dbutils", dbutils).widgets.getAll()
        result: DataFrame | None = None
        for statement in split_sql(body):
            result = self.spark.sql(bind_parameters(statement, values))
        if result is not None:
            self.shell.user_ns["_sqldf"] = result
            if result.columns and not result.isStreaming:
                self.display(result)

    @staticmethod
    def _shell_script(body: str, folder: Path) -> None:
        sys.stdout.flush()
        done = subprocess.run(["bash", "-e", "-c", body], cwd=folder, check=False)
        if done.returncode != 0:
            raise StreamlingError(f"the %sh script exited with status {done.returncode}",
                                  hint="its output is in the log above")

    # --- what the notebook's code calls ---------------------------------------------------------

    def display(self, *objs: Any, **kwargs: Any) -> None:
        """Databricks' ``display`` in a job: a DataFrame's first rows go to the log; a streaming
        DataFrame runs a query printing each micro-batch until it ends (the task waits for it)."""
        from streamling.notebook.display import is_dataframe

        for obj in objs:
            if not is_dataframe(obj):
                print(repr(obj))
            elif obj.isStreaming:
                name = kwargs.get("streamName")
                writer = obj.writeStream.foreachBatch(lambda batch, epoch: _show(batch, f"micro-batch {epoch}"))
                if kwargs.get("processingTime"):
                    writer = writer.trigger(processingTime=kwargs["processingTime"])
                (writer.queryName(name) if name else writer).start()
            else:
                _show(obj, None, int(kwargs.get("rows") or SHOWN_ROWS))

    @staticmethod
    def display_html(html: str) -> None:
        """``displayHTML`` in a job: the HTML goes to the log as text."""
        print(html)

    def run_notebook(self, path: str, timeout_seconds: int, arguments: dict[str, Any]) -> str:
        """``dbutils.notebook.run``: the notebook at ``path`` (relative to this one) runs as a notebook
        of its own, as on Databricks: its own namespace (a module of its own: the caller's globals are
        never touched, so the caller's threads and functions keep theirs), its own SparkSession
        (``newSession``: the same Spark context, its own temporary views and SQL settings) and
        ``arguments`` as its widgets' values; its exit value is returned. Called from several threads
        (Databricks' way to run notebooks in parallel), the children take turns with this driver's
        shell; each gets the same result it would get alone."""
        from streamling.notebook.dbutils import PARAMETERS_ENV, DBUtils

        target = run_target(self.folder, path)
        environ = {**os.environ, PARAMETERS_ENV: json.dumps({k: str(v) for k, v in arguments.items()})}
        with self._child_lock:
            parent_module, parent_ns, parent_spark = self.shell.user_module, self.shell.user_ns, self.spark
            child = DBUtils(environ)
            child.notebook = parent_ns["dbutils"].notebook
            module = types.ModuleType("__main__")
            module.__dict__.update({k: parent_ns[k] for k in ("display", "displayHTML") if k in parent_ns},
                                   dbutils=child, __builtins__=parent_ns.get("__builtins__"))
            if parent_spark is not None:
                self.spark = parent_spark.newSession()
                self._child_sessions.append(self.spark)
                module.__dict__.update(spark=self.spark, sc=self.spark.sparkContext)
            self.shell.user_module, self.shell.user_ns = module, module.__dict__
            timer = _deadline(timeout_seconds, target.name)
            try:
                self._cells(read_notebook(target), target.name, target.parent, depth=1)
                return ""
            except NotebookExit as done:
                return done.value
            finally:
                if timer is not None:
                    timer.cancel()
                self.shell.user_module, self.shell.user_ns, self.spark = parent_module, parent_ns, parent_spark

    # --- the end ----------------------------------------------------------------------------------

    def _finish(self) -> None:
        """After the last cell: run the pipeline if the notebook defined one and never ran it, then
        wait for it and for every streaming query the notebook started."""
        nb = self.pipeline
        assert nb is not None and self.spark is not None
        if nb.nodes and nb.current is None and nb.start_error is None and not self.stopping:
            log.info("notebook %s defines a pipeline it does not run: running it now", self.name)
            self._guarded(lambda: nb.start(sample_rows=0))
        self._in_cell = False
        while nb.current is not None and not nb.current.wait(0.5):
            pass
        if nb.current is not None and nb.current.error is not None and not self.stopping:
            raise nb.current.error
        while not self.stopping:
            active = self._streaming_queries()
            if not active:
                break
            query = active[0]
            while query.isActive and not self.stopping:
                query.awaitTermination(1)
            failure = query.exception()
            if failure is not None and not self.stopping:
                raise StreamlingError(f"the streaming query {query.name or query.id} the notebook started failed: "
                                      f"{first_line(java_message(failure))}", code="notebook_query_failed")

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stopping:
            return
        self.stopping = signal.Signals(signum).name
        budget = float(self.settings.shutdown_budget_secs)
        log.info("received %s: stopping the notebook's pipeline after its epoch in flight and its streaming "
                 "queries, then exiting (at most shutdown_budget_secs=%g)", self.stopping, budget)
        threading.Thread(target=self._stop_all, name="streamling-notebook-stop", daemon=True).start()
        threading.Thread(target=self._exit_after, args=(budget,), name="streamling-shutdown-budget",
                         daemon=True).start()
        if self._in_cell:
            raise _Stopped()

    def _stop_all(self) -> None:
        nb = self.pipeline
        if nb is not None and nb.current is not None and nb.current.active:
            nb.current.stop(reason=f"received {self.stopping}" if self.stopping else "the notebook ended")
        if self.spark is not None:
            for query in self._streaming_queries():
                try:
                    query.stop()
                except Exception:  # noqa: BLE001 - stopping anyway
                    log.debug("stopping a streaming query", exc_info=True)

    def _streaming_queries(self) -> list[Any]:
        """The active streaming queries of the notebook's session and of its children's."""
        assert self.spark is not None
        return [q for session in (self.spark, *self._child_sessions) for q in session.streams.active]

    def _drain(self) -> None:
        nb = self.pipeline
        if nb is not None and nb.current is not None:
            nb.current.wait(float(self.settings.shutdown_budget_secs))

    def _exit_after(self, budget: float) -> None:
        from streamling.execution import STOPPED_EXIT_CODE

        if self._ended.wait(budget):
            return
        log.error("stop requested but the notebook did not end within shutdown_budget_secs=%g: exiting with code %d; "
                  "the epoch in flight was not committed and is replayed on the next start", budget, STOPPED_EXIT_CODE)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(STOPPED_EXIT_CODE)

    def _record_output(self, value: str) -> None:
        if self.output_path is not None:
            self.output_path.write_text(json.dumps({"result": value}))


@contextlib.contextmanager
def _widget_values(arguments: Mapping[str, str]) -> Iterator[None]:
    """``%run``'s arguments as the included notebook's widget values (over the job's parameters)."""
    from streamling.notebook.dbutils import PARAMETERS_ENV, job_parameters

    if not arguments:
        yield
        return
    before = os.environ.get(PARAMETERS_ENV)
    os.environ[PARAMETERS_ENV] = json.dumps({**job_parameters(), **arguments})
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARAMETERS_ENV, None)
        else:
            os.environ[PARAMETERS_ENV] = before


def _describe(exc: BaseException) -> str:
    """The error's first line as a person reads it: ``ZeroDivisionError: division by zero``."""
    from streamling.notebook.cells import PipelineError

    if isinstance(exc, (StreamlingError, PipelineError)):
        return first_line(str(exc) if isinstance(exc, PipelineError) else exc.headline())
    text = first_line(java_message(exc))
    return text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"


def _show(frame: DataFrame, title: str | None, rows: int = SHOWN_ROWS) -> None:
    if title:
        print(title)
    frame.show(rows, truncate=False)


class _Deadline(threading.Timer):
    """``dbutils.notebook.run``'s timeout in a thread other than the main one (no signals there): the
    thread gets a ``TimeoutError`` raised asynchronously when it passes, at its next Python line.
    ``cancel`` also withdraws one raised too late to be caught inside the child."""

    def __init__(self, seconds: float, what: str) -> None:
        self.target = threading.get_ident()
        self.fired = False
        super().__init__(seconds, self._expire, args=(what, seconds))
        self.daemon = True

    def _expire(self, what: str, seconds: float) -> None:
        import ctypes

        log.error("dbutils.notebook.run(%s) did not finish within %ss", what, seconds)
        self.fired = True
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.target), ctypes.py_object(TimeoutError))

    def cancel(self) -> None:
        import ctypes

        super().cancel()
        self.join()  # an expiry already under way has raised, or will not
        if self.fired and threading.get_ident() == self.target:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.target), None)


def _deadline(timeout_seconds: float, what: str) -> threading.Timer | None:
    """``dbutils.notebook.run``'s timeout: the calling thread gets a ``TimeoutError`` when it passes
    (the main thread through SIGALRM, which also interrupts a blocking call; another through
    ``_Deadline``)."""
    if not timeout_seconds or timeout_seconds <= 0:
        return None
    if threading.current_thread() is not threading.main_thread():
        deadline = _Deadline(timeout_seconds, what)
        deadline.start()
        return deadline
    import _thread

    def expire() -> None:
        log.error("dbutils.notebook.run(%s) did not finish within %ss", what, timeout_seconds)
        _thread.interrupt_main(signal.SIGALRM)

    previous = signal.getsignal(signal.SIGALRM)

    def on_alarm(_signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGALRM, previous)
        raise TimeoutError(f"dbutils.notebook.run({what!r}) timed out after {timeout_seconds}s")

    signal.signal(signal.SIGALRM, on_alarm)
    timer = threading.Timer(timeout_seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


__all__ = ["CellFailed", "NotebookJob", "bind_parameters", "split_sql"]
