"""The end of a task attempt, from the job runner's side: noticing it, forcing it, and recording it.

Each tick ``Reaper.reap`` kills a driver that outlived its stop grace, asks one that ran past its
task's or job's ``timeout_seconds`` to stop, and, for each driver that ended, records the attempt
(its exit code and why it ended) and what comes of its task: done, retried after
``min_retry_interval_millis`` (``max_retries``), failed with the driver's last error, or pending
again when it was stopped to move to a new deployment or fenced. Whether a driver ended is read from
the attempt (``Attempt.exit_code``); the run itself is finished by the runner once no task is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamling.bundle.attempts import Attempt
from streamling.bundle.store import Store
from streamling.bundle.workspace import Workspace
from streamling.errors import StreamlingError

# the end of an attempt is part of the runner's log
log = logging.getLogger("streamling.bundle.runner")

# A driver given SIGTERM finishes its epoch within its shutdown budget (shutdown_budget_secs, 25 s by
# default) or exits 3 by itself; only one that outlives that by a margin is killed.
STOP_GRACE_SECS = 40.0


class Reaper:
    """Ends and records the attempts of the runs in ``store`` under ``ws``: ``host`` is this runner's,
    ``lease_secs`` how long a driver on another host may stay silent before it counts as ended, and
    ``task_record(deployment, job_key, task_key)`` reads what a deployment says of a task."""

    def __init__(self, ws: Workspace, store: Store, host: str, lease_secs: float,
                 task_record: Callable[[int, str, str], dict[str, Any] | None]) -> None:
        self.ws = ws
        self.store = store
        self.host = host
        self.lease_secs = lease_secs
        self.task_record = task_record

    def reap(self, now: float, attempts: dict[int, Attempt], deployment: dict[str, Any] | None,
             version: int | None) -> None:
        """Force what overstays, and take every ended attempt out of ``attempts`` and record it;
        ``deployment`` (version ``version``) is the live one, whose jobs' timeouts hold."""
        for attempt in list(attempts.values()):
            if attempt.term_sent is not None and now - attempt.term_sent > STOP_GRACE_SECS:
                log.warning("run %d task '%s': no exit %.0fs after SIGTERM; killing it", attempt.run_id,
                            attempt.task_key, STOP_GRACE_SECS)
                _signal(attempt.pid, signal.SIGKILL)
                attempt.term_sent = now  # one SIGKILL per grace period
            self._check_timeouts(attempt, now, deployment)
            age = self.store.heartbeat_age(attempt.id) if attempt.remote else None
            code = attempt.exit_code(age, self.lease_secs)
            if code is None:
                continue
            del attempts[attempt.id]
            if code < 0 and not attempt.remote:
                # A killed driver's JVM may outlive it for a moment: it must not write an epoch while the
                # task's next driver (a warm standby, within a second) resumes the same checkpoint.
                with contextlib.suppress(OSError):
                    os.killpg(attempt.pid, signal.SIGKILL)
            self._attempt_ended(attempt, code, now, version)

    def _check_timeouts(self, attempt: Attempt, now: float, deployment: dict[str, Any] | None) -> None:
        if attempt.stopping is not None:
            return
        record = self.task_record(attempt.deployment, attempt.job_key, attempt.task_key) or {}
        limit = int(record.get("timeout_seconds") or 0)
        if limit and now - attempt.started > limit:
            log.warning("run %d task '%s' exceeded timeout_seconds=%d", attempt.run_id, attempt.task_key, limit)
            attempt.stop("timeout")
            return
        job = (deployment or {}).get("jobs", {}).get(attempt.job_key, {})
        job_limit = int(job.get("timeout_seconds") or 0)
        if not job_limit:
            return
        run = self.store.run(attempt.run_id)
        if run is not None and run.started_at and now - run.started_at > job_limit:
            attempt.stop("job_timeout")

    def _attempt_ended(self, attempt: Attempt, code: int, now: float, version: int | None) -> None:
        run_id, key = attempt.run_id, attempt.task_key
        why = attempt.stopping
        if why == "fenced":
            state, message = "fenced", "its runner was lost; the task starts again from its checkpoint on host " \
                f"{self.host}"
        elif why == "redeploy":
            state, message = "redeployed", f"stopped to move to deployment {version}" + (
                f" ({attempt.stop_note})" if attempt.stop_note else "")
        elif why == "cancel":
            state, message = "cancelled", "cancelled"
        elif why in ("timeout", "job_timeout"):
            state, message = "timed_out", "timed out"
        elif code == 0:
            state, message = "succeeded", "finished"
        else:
            state, message = "failed", _failure_line(attempt.log_path, code)
        self.store.set_attempt(attempt.id, state=state, ended_at=now, exit_code=code, reason=message)
        log.info("run %d task '%s' attempt %d %s (exit %d)", run_id, key, attempt.number, state, code)
        if self.ws.remote is not None:
            threading.Thread(target=self._push_log, args=(attempt,), name="push-log", daemon=True).start()
        if state in ("redeployed", "fenced"):
            self.store.set_task(run_id, key, state="pending", message=message)
            self.store.set_run(run_id, message=message)  # replaces what an earlier swap attempt said
            return
        if state == "succeeded":
            values = _task_values(attempt.log_path)
            if values:
                self.store.set_task_values(run_id, key, values)
            output = _notebook_output(attempt.log_path)
            if output is not None:
                message = f"exited: {output if len(output) <= 200 else output[:199] + '…'}"
            self.store.set_task(run_id, key, state="succeeded", ended_at=now, message=message)
            return
        if state == "cancelled" or why == "job_timeout":
            self.store.set_task(run_id, key, state="cancelled" if state == "cancelled" else "timed_out",
                                ended_at=now, message=message)
            return
        record = self.task_record(attempt.deployment, attempt.job_key, key) or {}
        retries = int(record.get("max_retries") or 0)
        retry = (state == "failed" or bool(record.get("retry_on_timeout"))) and \
            (retries < 0 or attempt.number <= retries)
        if retry:
            wait = int(record.get("min_retry_interval_millis") or 0) / 1000
            self.store.set_task(run_id, key, state="waiting_retry", retry_at=now + wait, message=message)
            log.info("run %d task '%s' will be retried in %.1fs (attempt %d of %s)", run_id, key, wait,
                     attempt.number + 1, "unlimited" if retries < 0 else retries + 1)
        else:
            self.store.set_task(run_id, key, state="failed", ended_at=now, message=message)

    def _push_log(self, attempt: Attempt) -> None:
        """An ended attempt's log to the object-store root (off the supervision loop: a slow store
        must not delay it)."""
        try:
            self.ws.push_log(attempt.log_path)
        except (OSError, StreamlingError) as exc:
            log.warning("run %d task '%s': the log of attempt %d stays on this host (%s): %s", attempt.run_id,
                        attempt.task_key, attempt.number, self.ws.where,
                        exc.headline() if isinstance(exc, StreamlingError) else exc)


def _task_values(log_path: Path) -> dict[str, Any]:
    """What the attempt set with ``dbutils.jobs.taskValues.set`` (its driver's values file)."""
    from streamling.notebook.dbutils import values_file

    path = values_file(log_path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("the task values in %s cannot be read (%s): downstream references to them fail", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _notebook_output(log_path: Path) -> str | None:
    """The value a notebook task exited with (``dbutils.notebook.exit``), None when it did not."""
    from streamling.notebook.dbutils import output_file

    try:
        data = json.loads(output_file(log_path).read_text())
    except (OSError, ValueError):
        return None
    return str(data.get("result", "")) if isinstance(data, dict) else None


def _signal(pid: int, sig: int) -> None:
    """Signal the driver's whole session (its JVM and Spark's Python workers included)."""
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _failure_line(log_path: Path, code: int) -> str:
    """The driver's last ERROR line, which is what a user needs from a failed attempt."""
    if code < 0:
        return f"the driver was killed by {signal.Signals(-code).name}"
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    starts = [i for i, line in enumerate(lines) if " ERROR " in line]
    if not starts:  # a Python file's own failure: its last line (an exception, a sys.exit message)
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return f"the driver exited with code {code}" + (f": {last[:500]}" if last else "")
    first = starts[-1]
    # The error line and its continuation (a validation error lists one problem per line).
    body = [lines[first].split(": ", 1)[-1]]
    for line in lines[first + 1:first + 6]:
        if not line.startswith((" ", "\t")):
            break
        body.append(line.strip())
    return " ".join(body)[:1000]
