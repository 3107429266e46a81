"""Fencing of a task's driver by a shared run store (runners on several hosts).

The driver heartbeats its attempt there every second and stops at once, without committing another
epoch, when it is fenced (a runner on another host took over) or when it could not reach the store
for half a lease: by the time the lease lets another runner start this task again from the
checkpoint, this driver is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

#: the driver process logs as one logger, whichever module speaks: its log lines name it
log = logging.getLogger("streamling.bundle.driver")


class Fence:
    """Heartbeats this attempt in a shared run store; stops the driver's process group when fenced.

    A watchdog apart from the heartbeat measures the silence: a heartbeat hanging on a cut network
    cannot delay the stop past half a lease after the last one that got through, while a runner
    taking over waits for a whole lease of silence before it starts the task elsewhere."""

    EVERY_SECS = 1.0
    WATCH_SECS = 0.2

    def __init__(self, root: Path, attempt_id: int, exit_file: Path | None) -> None:
        from streamling.bundle.workspace import Workspace

        ws = Workspace(str(root))
        self.attempt_id, self.exit_file = attempt_id, exit_file
        self.lease_secs = ws.store_settings().lease_secs
        self.store = ws.open_store()
        self._ok = time.monotonic()
        self._last_error = "no answer"
        threading.Thread(target=self._beat, name="streamling-fence", daemon=True).start()
        threading.Thread(target=self._watch, name="streamling-fence-watchdog", daemon=True).start()

    def _beat(self) -> None:
        from streamling.bundle.store import StoreUnavailable

        while True:
            try:
                row = self.store.heartbeat(self.attempt_id)
                self._ok = time.monotonic()
                if row is None:
                    self._stop(f"its attempt {self.attempt_id} is no longer in the run store")
                elif row["fenced_at"] is not None:
                    self._stop(f"runner {row['fenced_by']} took over supervision and runs this task on its host")
            except StoreUnavailable as exc:
                self._last_error = exc.headline()
            except Exception:  # noqa: BLE001 - the heartbeat must outlive one bad look
                log.exception("heartbeat to the run store failed")
            time.sleep(self.EVERY_SECS)

    def _watch(self) -> None:
        while True:
            time.sleep(self.WATCH_SECS)
            silent = time.monotonic() - self._ok
            if silent > self.lease_secs / 2:
                self._stop(f"the run store has not answered for {silent:.1f}s ({self._last_error}), so another "
                           "runner may start this task elsewhere")

    def _stop(self, why: str) -> None:
        log.error("this driver stops now: %s. The epoch in flight is not committed; the task resumes from its "
                  "checkpoint where it runs next", why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        if self.exit_file is not None:
            try:
                self.exit_file.write_text("75")
            except OSError:
                pass
        # The driver JVM (in a session of its own) first, then this process and Spark's Python workers.
        from streamling.runtime.session import jvm_process_group

        jvm = jvm_process_group()
        if jvm is not None:
            try:
                os.killpg(jvm, signal.SIGKILL)
            except OSError:
                pass
        os.killpg(os.getpgrp(), signal.SIGKILL)
