"""A notebook pipeline's run in the background: its state from ``starting`` to ``stopped`` or
``failed``, its time limit, and the telemetry it closes when it ends, while the kernel stays free.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from streamling.errors import StreamlingError, java_message

if TYPE_CHECKING:
    from streamling.runtime.pipeline import PipelineRun
    from streamling.telemetry.attach import RunTelemetry

#: the notebook session's logger: its runs were part of it
log = logging.getLogger("streamling.notebook.session")


#: the states of a notebook pipeline, in order; ``stopped`` and ``failed`` end a run
STATES = ("defined", "starting", "running", "stopping", "stopped", "failed")


class NotebookRun:
    """A pipeline running in the background of a notebook; the kernel stays free.

    It owns the run's state (``STATES``): ``starting`` while Spark plans, ``running``, ``stopping``
    once a stop was asked for, then ``stopped`` or ``failed`` (with ``error``). A run that fails to
    start ends ``failed`` at once, never stays ``starting``. ``on_state`` hears every change (the
    monitor shows it), from whichever thread makes it."""

    def __init__(self, run: PipelineRun, seconds: float | None, telemetry: RunTelemetry | None = None,
                 on_state: Callable[[str, str | None], None] | None = None) -> None:
        self.run = run
        self.telemetry = telemetry
        self.error: StreamlingError | None = None
        self.finished = threading.Event()
        self.started_at = time.time()
        self.stop_reason: str | None = None
        self._state = "starting"
        self._on_state = on_state
        self._timer: threading.Timer | None = None
        if seconds:
            self._timer = threading.Timer(seconds, self.request_stop, args=(f"--seconds {seconds:g} elapsed",))
            self._timer.daemon = True
        self._thread = threading.Thread(target=self._watch, name="streamling-notebook-run", daemon=True)

    @property
    def state(self) -> str:
        return self._state

    def _set_state(self, state: str) -> None:
        if self._state in ("stopped", "failed") or (state == "running" and self._state == "stopping"):
            return
        self._state = state
        if self._on_state is not None:
            try:
                self._on_state(state, self.error.headline() if self.error is not None else self.stop_reason)
            except Exception:  # noqa: BLE001 - a view must not break the run
                log.debug("showing the run's state", exc_info=True)

    def start(self) -> None:
        try:
            self.run.start()  # in the caller's thread: plan-time errors fail the cell
        except BaseException as exc:
            self._end(exc)
            raise
        self._set_state("running")
        if self._timer is not None:
            self._timer.start()
        self._thread.start()

    def _watch(self) -> None:
        error: BaseException | None = None
        try:
            self.run.wait()
        except BaseException as exc:  # noqa: BLE001 - reported through status/the monitor
            error = exc
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        if isinstance(error, StreamlingError):
            self.error = error
        elif error is not None:
            self.error = StreamlingError(f"the pipeline stopped: {java_message(error)}", user=False, cause=error)
        try:
            self.run.stop("finished")
        except Exception:  # noqa: BLE001
            log.debug("stopping the notebook run", exc_info=True)
        if self._timer is not None:
            self._timer.cancel()
        if self.telemetry is not None:
            self.telemetry.close()
        self._set_state("failed" if self.error is not None else "stopped")
        self.finished.set()

    @property
    def active(self) -> bool:
        return not self.finished.is_set()

    def request_stop(self, reason: str = "stopped from the notebook") -> None:
        if self.active:
            self.stop_reason = self.stop_reason or reason
            self._set_state("stopping")
            self.run.request_stop(reason)

    def stop(self, timeout_secs: float = 120, reason: str = "stopped from the notebook") -> None:
        self.request_stop(reason)
        self.finished.wait(timeout_secs)

    def wait(self, timeout_secs: float | None = None) -> bool:
        return self.finished.wait(timeout_secs)
