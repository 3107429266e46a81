"""Hot redeploy: a notebook task's driver stays warm across redeploys of its job.

Asked by the runner (the handshake of ``streamling.bundle.handover``), the driver compiles the new
deployment's pipeline and analyses it in its own SparkSession while the old one runs, then swaps it in
after the epoch in flight, on the same checkpoint; a JVM restart is left to the runner.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle import handover
from streamling.bundle.references import RunContext
from streamling.bundle.task_definition import TaskDefinition, load_deployment, task_definition
from streamling.errors import StreamlingError, ValidationError

if TYPE_CHECKING:
    from streamling.config import Settings

#: the driver process logs as one logger, whichever module speaks: its log lines name it
log = logging.getLogger("streamling.bundle.driver")


class Redeploys:
    """Swaps a newer deployment of this task into the warm driver when the runner asks (hot redeploy).

    The new definition is compiled, checked against what the JVM was started with and analysed in
    this driver's SparkSession while the old one keeps running; only then does the old one stop
    after its epoch in flight, and ``execute`` starts the new one on the same checkpoint. A broken
    new definition leaves the old one running, and says why in this log and in the answer the
    runner records (see ``streamling.bundle.handover``).
    """

    POLL_SECS = 0.2

    def __init__(self, ws: Any, job_key: str, task_key: str, params: dict[str, str], first: TaskDefinition,
                 log_path: Path, context: RunContext | None = None) -> None:
        self.ws, self.job_key, self.task_key, self.params, self.context = ws, job_key, task_key, params, context
        self.request_path = handover.request_file(log_path)
        self.status_path = handover.status_file(log_path)
        self.running = first
        self.jvm_settings = first.settings  # the SparkSession was (or will be) built with these
        self._lock = threading.Lock()
        self._pipeline: Any = None
        self._next: TaskDefinition | None = None
        self._answered = first.version  # the newest deployment asked for and answered
        self._swapped = False
        self._report(handover.RUNNING, None)  # tells the runner this driver can swap
        threading.Thread(target=self._loop, name="streamling-redeploys", daemon=True).start()

    # --- called by ``execute`` ----------------------------------------------------------------------

    def watch(self, pipeline: Any) -> None:
        with self._lock:
            self._pipeline = pipeline
        if self._swapped:
            log.info("job task '%s': deployment %d runs in this driver (no JVM restart)", self.task_key,
                     self.running.version)
            self._report(handover.RUNNING, self.running.version)

    def take(self) -> tuple[Any, Settings, float | None] | None:
        with self._lock:
            nxt, self._next, self._pipeline = self._next, None, None
        if nxt is None:
            return None
        self.running, self._swapped = nxt, True
        os.environ["STREAMLING_JOB_PARAMETERS"] = json.dumps(nxt.values)
        os.chdir(nxt.cwd)
        log.info("job task '%s': starting deployment %d (notebook %s, parameters %s) on the same checkpoint",
                 self.task_key, nxt.version, nxt.notebook, json.dumps(nxt.values))
        return nxt.spec, nxt.settings, nxt.seconds

    # --- the watcher ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            time.sleep(self.POLL_SECS)
            try:
                self._poll()
            except Exception:  # noqa: BLE001 - the watcher must outlive one bad look
                log.exception("checking for a redeploy request failed")

    def _poll(self) -> None:
        request = handover.read(self.request_path)
        version = int(request["deployment"]) if request and request.get("deployment") is not None else None
        if version is None or version <= self._answered:
            return
        with self._lock:
            pipeline = self._pipeline
            if pipeline is None or self._next is not None:
                return  # not running yet, or a swap is under way: the request waits
        self._answered = version
        self._check(version, pipeline)

    def _check(self, version: int, pipeline: Any) -> None:
        from streamling.runtime.planner import analyze, build_plan

        old = self.running.version
        log.info("job task '%s': deployment %d changes this task; checking it in this driver's Spark session while "
                 "deployment %d keeps running", self.task_key, version, old)
        try:
            nxt = task_definition(self.ws, version, self.job_key, self.task_key, self.params, self.context)
            changes = self._source_changes(old, version)
            if changes:
                raise StreamlingError(
                    f"{'; '.join(changes)}: the running pipeline's checkpoint records the old sources' offsets, so "
                    "the new definition cannot resume from it", code="bundle_checkpoint_incompatible",
                    hint="deploy it under a new application_id; it then reads its sources from their starting offsets")
            reasons = handover.restart_reasons(self.jvm_settings, nxt.settings)
            if reasons:
                why = "; ".join(reasons)
                log.info("job task '%s': deployment %d needs a new driver JVM (%s); the runner restarts this task "
                         "after its current epoch", self.task_key, version, why)
                self._report(handover.NEEDS_RESTART, version, why)
                return
            analyze(build_plan(nxt.spec, nxt.settings, dry_run=True), pipeline.spark)
        except StreamlingError as exc:
            message = _one_line(exc)
            log.error("deployment %d was not swapped in, deployment %d keeps running: %s", version, old,
                      exc.describe())
            self._report(handover.FAILED, version, message)
            return
        except Exception as exc:  # noqa: BLE001 - a bug in checking must not stop the running pipeline
            log.exception("checking deployment %d failed; deployment %d keeps running", version, old)
            self._report(handover.FAILED, version, f"internal error: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._pipeline is not pipeline:
                return  # the run ended by itself meanwhile; the runner sees the driver exit
            self._next = nxt
        log.info("job task '%s': deployment %d checked; stopping deployment %d after its epoch in flight",
                 self.task_key, version, old)
        pipeline.request_stop(f"deployment {version} takes over")

    def _source_changes(self, old: int, new: int) -> list[str]:
        """How the task's sources differ between two deployments (the deploy's own rule, checked again
        here: a deploy cannot always see the checkpoint, this driver runs on it)."""
        from streamling.bundle.deploy import source_changes

        def sources(version: int) -> dict[str, Any]:
            job = load_deployment(self.ws, self.ws.root, version)["jobs"].get(self.job_key) or {}
            task = next((t for t in job.get("tasks", []) if t["task_key"] == self.task_key), None) or {}
            return dict(task.get("sources") or {})

        return source_changes(sources(old), sources(new))

    def _report(self, state: str, request: int | None, message: str | None = None) -> None:
        handover.write(self.status_path, {"running": self.running.version, "request": request, "state": state,
                                          "message": message, "at": time.time()})


def _one_line(exc: StreamlingError) -> str:
    """The error as the run record shows it: each problem of a validation error, on one line."""
    if isinstance(exc, ValidationError):
        return "; ".join(p.headline() for p in exc.problems)
    return exc.headline()
