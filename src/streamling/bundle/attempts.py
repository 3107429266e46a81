"""A task attempt the job runner supervises: its driver process, and what the runner has asked of it.

``Attempt`` is shared by the runner and its components (``bundle.swaps``, ``bundle.reaper``,
``bundle.warm_drivers``): each reads it, and asks it to stop through ``Attempt.stop`` only, so the
one SIGTERM a driver gets, and why, are decided in one place.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from streamling.util import process_alive


@dataclass
class Attempt:
    id: int
    run_id: int
    job_key: str
    task_key: str
    number: int
    deployment: int
    pid: int
    log_path: Path
    started: float
    proc: subprocess.Popen[bytes] | None = None
    stopping: str | None = None  # cancel | redeploy | timeout | job_timeout
    term_sent: float | None = None
    stop_note: str | None = None  # why a redeploy restarts the driver rather than swapping in it
    swap_to: int | None = None  # the deployment its driver was asked to swap in, until it answers
    remote: bool = False  # its driver runs on another host (fenced by this runner at takeover)
    committed: bool = False  # its driver has committed an epoch (read from its figures until it has)

    def exit_code(self, heartbeat_age: float | None = None, lease_secs: float = 0.0) -> int | None:
        """The driver's exit code once it ended (None while it runs).

        A driver on another host cannot be waited for or looked up in ``/proc``: it has ended when it
        wrote its exit file or stopped heartbeating for longer than a lease (it fences itself sooner)."""
        if self.remote:
            code = _exit_file_code(self.log_path)
            if code is not None:
                return code
            return -9 if heartbeat_age is None or heartbeat_age > lease_secs else None
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                return None
        elif process_alive(self.pid):
            return None
        code = _exit_file_code(self.log_path)
        if code is not None:
            return code
        return self.proc.returncode if self.proc is not None else -9

    def stop(self, why: str, note: str | None = None) -> None:
        """Ask the driver to stop after its current epoch (``why``: cancel | redeploy | timeout |
        job_timeout); a cancel overrides an earlier reason, and the driver gets one SIGTERM."""
        if self.stopping is None or why == "cancel":
            self.stopping = why
            self.stop_note = note
        if self.term_sent is None and not self.remote:
            self.term_sent = time.time()
            # Only the driver: it finishes its epoch and stops its JVM itself. A SIGTERM to the whole
            # session would kill the JVM under it mid-epoch.
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass


def _exit_file_code(log_path: Path) -> int | None:
    try:
        return int(Path(f"{log_path}.exit").read_text().strip())
    except (OSError, ValueError):
        return None
