"""Running a pipeline in this process, as the ``streamling`` command and a bundle job's driver both do.

``execute`` runs a pipeline to its end and stops it cleanly on a signal (``STOPPED_EXIT_CODE`` when a
stop cut an epoch); ``setup_logging`` is how every Streamling process logs. The CLI and the bundle's
driver and runner share them from here, below both: the bundle layer reaches the CLI only to run the
``streamling`` command itself (a wheel task of Streamling).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamling.config import Settings
from streamling.errors import StreamlingError
from streamling.runtime import events as ev
from streamling.telemetry.stats import RunStats

if TYPE_CHECKING:
    from streamling.runtime.pipeline import PipelineRun

# what a run logs is the command's log
log = logging.getLogger("streamling")
#: a stop request interrupted an epoch (sink retries, or the shutdown budget ran out): not committed
STOPPED_EXIT_CODE = 3


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
                           "message": record.getMessage()})


def setup_logging(fmt: str, debug: bool, capture: io.StringIO | None = None) -> None:
    """Log to stderr (or ``capture``) as text or JSON lines (``fmt``), the same in every Streamling
    process (``debug``: from DEBUG up); chatty libraries (py4j, pyspark, httpx) only from WARNING."""
    handler = logging.StreamHandler(capture or sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if not debug:  # py4j logs its lost connections (a dead JVM) on the root logger, with tracebacks
        handler.addFilter(lambda record: f"{os.sep}py4j{os.sep}" not in record.pathname)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    for noisy in ("py4j", "pyspark", "httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_spark_python_logs(debug)


def quiet_spark_python_logs(debug: bool) -> None:
    """PySpark's own error reports duplicate ours: py4j logs the Python traceback of every failed
    ``foreachBatch`` call, and PySpark logs a JSON line with the whole plan for an analysis error.
    Each failure is reported once, by the node that failed; ``--debug`` shows theirs as well."""
    level = logging.DEBUG if debug else logging.CRITICAL
    for name in ("py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(name).setLevel(level)
    from pyspark.logger import PySparkLogger  # its loggers must be created as PySparkLogger (they take extra kwargs)

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(level)
    if not debug:
        # When the JVM dies, PySpark's accumulator server prints an EOFError traceback to stderr
        # (socketserver's default); the run reports the JVM's death once, with its cause.
        from pyspark import accumulators

        for name in ("AccumulatorTCPServer", "AccumulatorUnixServer"):
            server = getattr(accumulators, name, None)
            if server is not None:
                server.handle_error = _accumulator_connection_lost


def _accumulator_connection_lost(_server: Any, _request: Any, client_address: Any) -> None:
    log.debug("accumulator connection from %s lost", client_address, exc_info=True)


class _Progress:
    """A live one-line status on a terminal; plain log lines otherwise."""

    def __init__(self, tty: bool, stats: RunStats) -> None:
        self.tty = tty
        self.stats = stats  # the numbers the metrics and the admin API show
        self.epochs = 0
        self.started = time.monotonic()

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.EpochFlushed):
            if not self.tty:
                log.info("flow %s: epoch %d flushed %s in %.0f ms", event.flow, event.epoch,
                         json.dumps(event.rows), event.durations_ms.get("total", 0.0))
        elif isinstance(event, ev.EpochFinalized):
            self.epochs += 1
            if self.tty:
                rows = self.stats.rows_to_sinks()
                rate = rows / max(time.monotonic() - self.started, 1e-6)
                sys.stderr.write(f"\r\x1b[2Kflow {event.flow}: epoch {event.epoch} finalized · "
                                 f"{rows:,} rows to sinks · {rate:,.0f} rows/s")
                sys.stderr.flush()
            else:
                log.info("flow %s: epoch %d finalized (%d input rows)", event.flow, event.epoch, event.input_rows)
        elif isinstance(event, ev.PipelineError) and event.retriable:
            # a failure being retried; a terminal one is reported once, as the run's error
            if self.tty:
                sys.stderr.write("\n")
            log.warning("%s%s", f"node '{event.node}': " if event.node else "", event.message)

    def finish(self) -> None:
        if self.tty and self.epochs:
            sys.stderr.write("\n")


#: set by a bundle job's driver: ``execute`` keeps the run's figures (``RunStats``) in this JSON file
STATS_FILE_ENV = "STREAMLING_RUN_STATS_FILE"


def _write_stats_periodically(stats: RunStats, path: Path, ended: threading.Event, every_secs: float = 2.0) -> None:
    def loop() -> None:
        while not ended.wait(every_secs):
            try:
                stats.write(path)
            except OSError:
                log.debug("writing run figures to %s failed", path, exc_info=True)

    threading.Thread(target=loop, name="streamling-run-figures", daemon=True).start()


class Successor(Protocol):
    """Where a warm driver gets the definition that replaces the pipeline it runs (a bundle redeploy)."""

    def watch(self, pipeline: PipelineRun) -> None:
        """``pipeline`` runs now; once a checked successor is ready, ask it to stop (``request_stop``)."""

    def take(self) -> tuple[Any, Settings, float | None] | None:
        """The checked successor (spec, settings, ``stop_after_secs``) the last run stopped for, once."""


def execute(spec: Any, settings: Settings, stop_after_secs: float | None = None,
            successor: Successor | None = None) -> int:
    """Run a pipeline to its end in this process, as the CLI and the bundle's job driver do.

    SIGTERM/SIGINT (and ``stop_after_secs``) finish the current epoch, then return 0: a stop
    request never leaves an epoch half-written, and a supervisor may restart from the checkpoint.
    A stop that cannot wait for the epoch — a sink retrying an outage, or an epoch still running
    when ``shutdown_budget_secs`` runs out — returns (or hard-exits with) ``STOPPED_EXIT_CODE``: the
    epoch was not committed and is replayed on the next start.

    ``successor``: a run it stops is followed by the definition it hands over, in this process and
    SparkSession (no JVM restart), on the same checkpoint — unless a signal asked the process to end.
    """
    ended = threading.Event()
    current: list[Any] = []  # the pipeline running now
    stopping: list[str] = []  # why the process was asked to end (a signal)
    budget = float(settings.shutdown_budget_secs)

    def hard_exit_after_budget(reason: str) -> None:
        if ended.wait(budget):
            return
        if not current:  # still starting (a cold JVM, an environment to unpack): no epoch is in flight
            log.info("stop requested (%s) while the pipeline was still starting: nothing was in flight, exiting",
                     reason)
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(0)
        log.error("stop requested (%s) but the pipeline did not end within shutdown_budget_secs=%g: exiting with "
                  "code %d; the epoch in flight was not committed and is replayed on the next start",
                  reason, budget, STOPPED_EXIT_CODE)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(STOPPED_EXIT_CODE)  # the JVM exits with its parent; nothing else is safe to wait for

    def stop(reason: str) -> None:
        if not stopping:
            stopping.append(reason)
            threading.Thread(target=hard_exit_after_budget, args=(reason,), name="streamling-shutdown-budget",
                             daemon=True).start()
        if current:
            current[0].request_stop(reason)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s: finishing the current epoch, then exiting (a sink that is retrying gives up at once; "
                 "at most shutdown_budget_secs=%g)", signal.Signals(signum).name, budget)
        stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while True:
            code = _execute_one(spec, settings, stop_after_secs, successor, current, stopping, stop)
            handover = successor.take() if successor is not None and not stopping else None
            if handover is None:
                return code
            spec, settings, stop_after_secs = handover
    finally:
        ended.set()


def _execute_one(spec: Any, settings: Settings, stop_after_secs: float | None, successor: Successor | None,
                 current: list[Any], stopping: list[str], stop: Callable[[str], None]) -> int:
    """One definition's run in ``execute``; ``current`` holds its pipeline while it runs."""
    from streamling.runtime.pipeline import PipelineRun
    from streamling.runtime.planner import build_plan
    from streamling.runtime.retry import STOPPED
    from streamling.runtime.session import build_session
    from streamling.telemetry.attach import attach

    log.info("starting pipeline %s (application_id=%s, config=%s)", spec.source, settings.application_id,
             json.dumps(settings.masked().get("postgres_sink", {})))
    plan = build_plan(spec, settings)
    # A job that keeps running gets Spark's UI (its Structured Streaming tab); a bounded one ends first.
    spark = build_session(settings, ui=not plan.bounded)
    bus = ev.EventBus()
    telemetry = attach(plan, settings, bus)
    progress = _Progress(tty=sys.stderr.isatty(), stats=telemetry.stats)
    bus.subscribe(progress)
    if stopping:  # a signal arrived while this definition was starting: no epoch ran, none is owed
        log.info("stop requested (%s) before the first epoch: nothing to finish, exiting", stopping[0])
        return 0
    pipeline = PipelineRun(spec, settings, spark, bus, plan=plan)
    current[:] = [pipeline]
    if stopping:  # the signal came just now: this one stops after its first epoch
        pipeline.request_stop(stopping[0])
    ended = threading.Event()
    stats_file = os.environ.get(STATS_FILE_ENV)
    if stats_file:  # a bundle job's driver: its run view reads these figures
        _write_stats_periodically(telemetry.stats, Path(stats_file), ended)
    timer = None
    if stop_after_secs:
        timer = threading.Timer(stop_after_secs, stop, args=(f"{stop_after_secs:g}s elapsed",))
        timer.daemon = True
        timer.start()
    try:
        pipeline.run(started=successor.watch if successor is not None else None)
    except StreamlingError as exc:
        if exc.code != STOPPED:
            raise
        log.error("%s (exit code %d)", exc.headline(), STOPPED_EXIT_CODE)
        return STOPPED_EXIT_CODE
    finally:
        current.clear()
        ended.set()
        if timer is not None:
            timer.cancel()
        progress.finish()
        telemetry.close()
        if stats_file:
            telemetry.stats.write(Path(stats_file))
    log.info("pipeline finished: %s", json.dumps(pipeline.status()))
    return 0
