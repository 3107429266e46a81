"""Running attempts moved onto a new deployment: the job runner's side of a hot redeploy.

A notebook task whose definition changed is asked to swap it in its running driver (the handshake of
``streamling.bundle.handover``); ``Swaps.poll`` then records what the driver answered: the deployment
it runs now, a new definition it refused (the old one keeps running), or a change that needs a new
JVM. Other changed tasks, and those answers, stop the attempt after its current epoch so that a new
driver resumes from the same checkpoint; an unchanged task is left alone. What a swap stands at lives
in the attempt (``Attempt.swap_to``) and the driver's status file, so ``Swaps`` holds nothing itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from streamling.bundle import handover
from streamling.bundle.attempts import Attempt
from streamling.bundle.store import Store

# a swap is part of the runner's log
log = logging.getLogger("streamling.bundle.runner")

class Swaps:
    """Moves the attempts of the runs in ``store`` onto a new deployment; ``task_record(deployment,
    job_key, task_key)`` reads what a deployment says of a task (the runner's read-once copy of them)."""

    def __init__(self, store: Store, task_record: Callable[[int, str, str], dict[str, Any] | None]) -> None:
        self.store = store
        self.task_record = task_record

    def move(self, attempt: Attempt, new: dict[str, Any], version: int) -> bool:
        """Move a running attempt onto deployment ``version``; True while its driver is asked to swap
        (its run keeps showing the deployment the driver runs until the driver answers)."""
        job = new["jobs"].get(attempt.job_key)
        if job is None:
            attempt.stop("cancel")
            self.store.set_run(attempt.run_id, message=f"job '{attempt.job_key}' was removed by deployment {version}")
            return False
        before = self.task_record(attempt.deployment, attempt.job_key, attempt.task_key)
        after = next((t for t in job["tasks"] if t["task_key"] == attempt.task_key), None)
        if after is None:
            attempt.stop("cancel")
            return False
        if before is not None and before["fingerprint"] == after["fingerprint"] and attempt.swap_to is None:
            return False  # unchanged (a reverted change still supersedes a swap asked for and not answered)
        if attempt.stopping is not None:
            return False  # on its way out already
        status = handover.read(handover.status_file(attempt.log_path))
        if status is not None and status.get("request") == version:
            attempt.swap_to = version  # answered already (to an earlier runner): poll acts on it
            return True
        why_not = _why_no_swap(before, after, status)
        if why_not:
            log.info("run %d task '%s': definition changed in deployment %s; %s, so it stops after the current epoch "
                     "and a new driver resumes from the same checkpoint", attempt.run_id, attempt.task_key, version,
                     why_not)
            attempt.stop("redeploy", note=why_not)
            return False
        handover.write(handover.request_file(attempt.log_path), {"deployment": version, "at": time.time()})
        attempt.swap_to = version
        log.info("run %d task '%s': definition changed in deployment %s; its driver (pid %d) checks it and swaps it in "
                 "after the current epoch, on the same checkpoint (no JVM restart)", attempt.run_id, attempt.task_key,
                 version, attempt.pid)
        return True

    def poll(self, attempts: Iterable[Attempt]) -> None:
        """Record what drivers answered: the deployment each runs now, a swap refused, or a new JVM needed."""
        for attempt in list(attempts):
            if attempt.stopping is not None:
                continue
            status = handover.read(handover.status_file(attempt.log_path))
            if status is None:
                continue
            running = status.get("running")
            if isinstance(running, int) and running != attempt.deployment:
                log.info("run %d task '%s' runs deployment %d in the same driver (pid %d, no JVM restart; was %d)",
                         attempt.run_id, attempt.task_key, running, attempt.pid, attempt.deployment)
                attempt.deployment = running
                self.store.set_attempt(attempt.id, deployment=running)
                self.store.set_run(attempt.run_id, deployment=running,
                                   message=f"moved to deployment {running} in its running driver (no restart)")
            if attempt.swap_to is None or status.get("request") != attempt.swap_to:
                continue
            version, attempt.swap_to = attempt.swap_to, None
            if status.get("state") == handover.FAILED:
                message = (f"deployment {version} was not applied, the run goes on with deployment "
                           f"{attempt.deployment}: {status.get('message')}")
                log.error("run %d task '%s': %s", attempt.run_id, attempt.task_key, message)
                self.store.set_run(attempt.run_id, message=message[:1000])
            elif status.get("state") == handover.NEEDS_RESTART:
                why = f"deployment {version} needs a new driver JVM: {status.get('message')}"
                log.info("run %d task '%s': %s; stopping it after the current epoch, a new driver resumes from the "
                         "same checkpoint", attempt.run_id, attempt.task_key, why)
                attempt.stop("redeploy", note=why)


def _why_no_swap(before: dict[str, Any] | None, after: dict[str, Any], status: dict[str, Any] | None) -> str | None:
    """Why a changed task cannot be swapped in its running driver, or None when it can be asked to."""
    if before is None:
        return "the definition it runs is no longer on record"
    if before["kind"] != "notebook" or after["kind"] != "notebook":
        return "only a notebook task's pipeline can be swapped in a running driver"
    if before.get("executes") or after.get("executes"):
        return "the notebook runs Python or SQL cells, which a running driver cannot swap: it restarts"
    if status is None:
        return "its driver does not take new definitions while it runs (an older streamling started it)"
    return None
