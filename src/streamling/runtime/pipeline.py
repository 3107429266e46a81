"""Run a whole pipeline: plan it, start one query per flow, watch, stop cleanly."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from streamling import storage
from streamling.config import Settings
from streamling.errors import StreamlingError, chain_text, java_message, node_failure_from_text
from streamling.runtime import events as ev
from streamling.runtime.environment import worker_failure
from streamling.runtime.flow import FlowRunner
from streamling.runtime.jvm_death import jvm_failure
from streamling.runtime.nodes import Transform
from streamling.runtime.planner import Plan, analyze, build_plan
from streamling.runtime.retry import STOPPED, backoff_delay, backoff_wait, clear_stop
from streamling.runtime.retry import request_stop as stop_retries
from streamling.spec.pipeline import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamling.state import StateBackend

log = logging.getLogger(__name__)


class _ProgressListener:
    """Forwards Spark's per-epoch progress (written after ``commits/N``) to the flow runners.

    A py4j callback behind Spark's own wrapper for Python listeners, rather than a PySpark
    ``StreamingQueryListener``: PySpark builds every event field by field (some 60 calls back into
    the JVM per progress event, ~35 ms of CPU an epoch on the listener bus and in Python, taken from
    the next epoch on a small machine); here a progress event is one call for its JSON, and the
    other events are not read at all."""

    def __init__(self, runners: dict[str, FlowRunner]) -> None:
        self.runners = runners
        self._jlistener: Any = None

    def add(self, spark: SparkSession) -> None:
        from pyspark.java_gateway import ensure_callback_server_started

        sc = spark.sparkContext
        ensure_callback_server_started(sc._gateway)
        jvm = sc._jvm
        assert jvm is not None
        self._jlistener = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(self)
        spark._jsparkSession.streams().addListener(self._jlistener)

    def remove(self, spark: SparkSession) -> None:
        if self._jlistener is not None:
            spark._jsparkSession.streams().removeListener(self._jlistener)
            self._jlistener = None

    # --- org.apache.spark.sql.streaming.PythonStreamingQueryListener, called by the JVM ------------

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - the Java interface's names
        return None

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        try:
            progress = json.loads(jevent.progress().json())
            runner = self.runners.get(str(progress.get("id")))
            if runner is not None:
                runner.on_progress(progress)
        except Exception:  # noqa: BLE001 - listener errors must not kill Spark's bus
            log.exception("progress handling failed")

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        return None

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        return None

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class PipelineRun:
    """A running (or finished) pipeline. ``run()`` blocks; ``start()`` + ``wait()`` do not."""

    def __init__(self, spec: PipelineSpec, settings: Settings, spark: SparkSession,
                 bus: ev.EventBus | None = None, plan: Plan | None = None) -> None:
        self.spec = spec
        self.settings = settings
        self.spark = spark
        self.bus = bus or ev.EventBus()
        #: ``plan``: one already built from ``spec`` and ``settings`` (the CLI plans before its session)
        self.plan: Plan = plan if plan is not None else build_plan(spec, settings)
        self.runners: list[FlowRunner] = []
        self._by_query: dict[str, FlowRunner] = {}
        self._listener: _ProgressListener | None = None
        self._stop = threading.Event()
        #: held while a flow moves to its next phase, so no stop or wait sees it between two queries
        self._phase_lock = threading.Lock()
        self.state: StateBackend | None = None
        #: the first external stop request (SIGTERM, a timer, the notebook): reason and monotonic time
        self.stop_requested: tuple[str, float] | None = None
        clear_stop()  # a new run: stop requests made to earlier runs in this process no longer apply

    def analyze(self) -> Plan:
        analyze(self.plan, self.spark)
        return self.plan

    def start(self) -> None:
        from streamling.state import create_state_backend

        self.state = create_state_backend(self.settings)
        for node in self.plan.nodes.values():
            node.ctx.state = self.state
        self.analyze()
        self._listener = _ProgressListener(self._by_query)
        self._listener.add(self.spark)
        try:
            for flow in self.plan.flows:
                runner = FlowRunner(self.plan, flow, self.spark, self.bus, self.state)
                self.runners.append(runner)
                if self.stop_requested is not None:  # asked to stop while starting: stop after the first epoch
                    runner.request_stop(self.stop_requested[0])
                runner.start()
                assert runner.query is not None
                self._by_query[str(runner.query.id)] = runner
        except Exception:
            self.stop("start failed")
            raise
        if any(source.phase() for runner in self.runners for source in runner.sources):
            threading.Thread(target=self._watch_phases, name="streamling-phases", daemon=True).start()

    def _watch_phases(self) -> None:
        """Moves phased flows on even when nobody is blocked in ``wait`` (a notebook's run)."""
        while not self._stop.wait(0.2):
            try:
                self._advance_phases()
            except Exception as exc:  # noqa: BLE001 - the failed start is the flow's failure
                for runner in self.runners:
                    if runner.query is None and runner.failure is None:
                        runner.failure = exc if isinstance(exc, StreamlingError) else StreamlingError(
                            f"flow '{runner.flow.name}': starting its next phase failed: {exc}", user=False,
                            code="flow_failed")
                return

    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop after the epoch in flight; a sink retrying an outage gives up at once (epoch left
        uncommitted, ``stopped`` error), and an epoch still running when ``shutdown_budget_secs`` is
        nearly spent is cut short the same way."""
        if self.stop_requested is None:
            self.stop_requested = (reason, time.monotonic())
        stop_retries()
        for runner in self.runners:
            runner.request_stop(reason)

    def _idle_timeout(self, default: float) -> float:
        """How long a flow may finish its epoch once it is asked to stop.

        After an external stop request, ``shutdown_budget_secs`` counted from the request less a
        reserve (2 s, at most half the budget) for stopping the query and closing the sinks.
        """
        if self.stop_requested is None:
            return default
        budget = float(self.settings.shutdown_budget_secs)
        left = budget - min(2.0, budget / 2) - (time.monotonic() - self.stop_requested[1])
        return min(default, max(0.5, left))

    def wait(self, timeout_secs: float | None = None) -> None:
        """Block until every flow ended (bounded drained, stop requested, or a failure)."""
        deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
        try:
            while True:
                self._advance_phases()
                active = [r for r in self.runners if r.query is not None and r.query.isActive]
                failed = [r for r in self.runners if r.failure is not None or
                          (r.query is not None and not r.query.isActive and r.query.exception() is not None
                           # refused while stopping, or interrupted by our stop: a clean stop
                           and r.refused_epoch is None and not r.interrupted_by_stop())]
                restarted = [r for r in failed if self._restarted_after_outage(r)]
                if restarted:
                    continue  # their new queries are the active ones now
                if failed:
                    self.stop("a flow failed")
                    raise self._failure(failed[0])
                if not active:
                    return
                for runner in active:
                    if runner.stop_reason is not None:
                        runner.stop_when_idle(self._idle_timeout(60.0))
                        self.bus.publish(ev.FlowStopped(runner.flow.name, reason=runner.stop_reason))
                if deadline is not None and time.monotonic() > deadline:
                    return
                time.sleep(0.1)
        except KeyboardInterrupt:
            self.request_stop("interrupted")
            self.wait(timeout_secs=120)

    def _advance_phases(self) -> None:
        """Start the next phase of flows whose bounded phase drained (a hybrid source going live).

        Only after the query ended cleanly, so every epoch of the phase is committed before the
        source records the switch: a crash in between replays nothing and switches again."""
        with self._phase_lock:
            if self.stop_requested is not None or self._stop.is_set():
                return
            for runner in self.runners:
                query = runner.query
                if (query is None or query.isActive or query.exception() is not None or runner.failure is not None
                        or runner.stop_reason is not None or not runner.next_phase()):
                    continue
                runner.start()
                assert runner.query is not None
                self._by_query[str(runner.query.id)] = runner

    def _restarted_after_outage(self, runner: FlowRunner) -> bool:
        """A query that Spark ended with a transient failure outside the epoch's ``foreachBatch`` —
        its checkpoint's storage unreachable, a source's server away while Spark planned the epoch —
        starts again from its checkpoint after the flow's backoff (``retry.*``), as a restarted
        process would: the epoch in flight was not committed and is replayed. True once restarted;
        False when the failure is not transient, a stop was requested, or the attempts ran out
        (then ``runner.failure`` says why, classified)."""
        exc = runner.query.exception() if runner.query is not None and runner.failure is None else None
        if exc is None or runner.refused_epoch is not None or self.stop_requested is not None or self._stop.is_set():
            return False
        err = _query_failure(runner, exc)
        if not err.retriable:
            if err.code == "storage_refused":
                runner.failure = err.add_context(f"running flow '{runner.flow.name}'")
            return False
        policy = self.settings.retry
        if runner.finalized_epoch != runner.outage_epoch:  # epochs committed since the last outage
            runner.outage_epoch, runner.outage_attempts = runner.finalized_epoch, 0
        while True:
            runner.outage_attempts += 1
            if runner.outage_attempts >= policy.max_attempts:
                runner.failure = err.add_context(f"flow '{runner.flow.name}' (gave up after {policy.max_attempts} "
                                                 "attempts; the epoch in flight was not committed and is replayed "
                                                 "on the next start)")
                return False
            delay = backoff_delay(policy, runner.outage_attempts)
            # the CLI logs it; widgets show it
            message = (f"flow '{runner.flow.name}': {err.headline()} (attempt {runner.outage_attempts}/"
                       f"{policy.max_attempts}); restarting it from its checkpoint in {delay:.1f}s")
            self.bus.publish(ev.PipelineError(runner.flow.name, node=err.node, message=message, retriable=True,
                                              attempt=runner.outage_attempts))
            try:
                backoff_wait(delay, f"restarting flow '{runner.flow.name}'")
                runner.start()
            except StreamlingError as again:
                if again.code == STOPPED or not again.retriable:
                    runner.failure = again
                    return False
                err = again
                continue
            assert runner.query is not None
            self._by_query[str(runner.query.id)] = runner
            return True

    def _failure(self, runner: FlowRunner) -> StreamlingError:
        if runner.failure is not None:
            return runner.failure
        exc = runner.query.exception() if runner.query is not None else None
        jvm = jvm_failure(exc) if exc is not None else None
        if jvm is not None:
            return StreamlingError(f"flow '{runner.flow.name}' stopped: {jvm.what}", hint=jvm.hint, user=False,
                                   code="jvm_failed")
        if exc is not None and not (classified := _query_failure(runner, exc)).code.startswith("flow_"):
            # a node's own words (a plugin source failing while Spark plans), the storage, a worker
            return classified if classified.node else classified.add_context(f"running flow '{runner.flow.name}'")
        return StreamlingError(f"flow '{runner.flow.name}' stopped: {java_message(exc) if exc else 'unknown error'}",
                               user=False, code="flow_failed")

    def stop(self, reason: str = "stopped") -> None:
        """Stop every flow between epochs and release sinks and state."""
        with self._phase_lock:
            self._stop.set()
        for runner in self.runners:
            runner.request_stop(reason)
            try:
                runner.stop_when_idle(timeout_secs=self._idle_timeout(30.0))
            except Exception:  # noqa: BLE001
                log.debug("stopping flow %s", runner.flow.name, exc_info=True)
            runner.await_finalized()
            runner.close()
        for node in self.plan.nodes.values():
            if isinstance(node, Transform):
                try:
                    node.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing transform '%s' failed", node.name)
        if self._listener is not None:
            try:
                self._listener.remove(self.spark)
            except Exception:  # noqa: BLE001
                pass
            self._listener = None
        if self.state is not None:
            self.state.close()
            self.state = None
        if self.stop_requested is not None:
            clear_stop()  # this run is over: sinks used outside a run retry normally again

    def run(self, started: Callable[[PipelineRun], None] | None = None) -> None:
        """Start, wait for the end, stop. ``started`` is called once every flow's query runs (a warm
        driver then watches for a successor that would replace this run)."""
        self.start()
        try:
            if started is not None:
                started(self)
            self.wait()
        finally:
            self.stop("finished")
        for runner in self.runners:
            if runner.failure is not None and runner.failure.code == STOPPED:
                raise runner.failure  # stopped mid-epoch: the caller must not report success
            if runner.query is not None and runner.query.exception() is not None and runner.failure is None \
                    and runner.stop_reason is None:
                raise self._failure(runner)

    def status(self) -> dict[str, Any]:
        return {
            r.flow.name: {
                "active": bool(r.query and r.query.isActive),
                "last_epoch": r.last_epoch,
                "rows_to_sinks": r.rows_to_sinks,
                "stop_reason": r.stop_reason,
                "error": r.failure.headline() if r.failure else None,
            }
            for r in self.runners
        }


def _query_failure(runner: FlowRunner, exc: BaseException) -> StreamlingError:
    """What ended ``runner``'s query outside its epochs, classified: a node's own words, the
    checkpoint's storage (when the failure names its host), or Spark's message; transient when the
    chain shows a connection that failed (``storage.storage_error``'s rules)."""
    text = chain_text(exc)
    named = node_failure_from_text(text) or worker_failure(text)  # a node's words; a worker without Python
    if named is not None:
        return named
    where = runner.checkpoint_dir
    host = urlparse(where).hostname if not storage.is_local(where) else None
    if host and host in text:
        return storage.storage_error(exc, "write the checkpoint at", where)
    classified = storage.storage_error(exc, "run flow", f"'{runner.flow.name}'")
    return StreamlingError(f"flow '{runner.flow.name}' stopped: {java_message(exc)}", user=False,
                           code="flow_transient" if classified.retriable else "flow_failed",
                           retriable=classified.retriable, cause=exc)
