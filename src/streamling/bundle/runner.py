"""The job runner: one supervisor process per target root, owning the lifecycle of every run.

It starts task drivers (``streamling.bundle.driver``) as child processes in their own sessions,
retries failed attempts (``max_retries`` after ``min_retry_interval_millis``), enforces
``timeout_seconds``, fires schedules and periodic triggers, keeps one run of each unpaused
continuous job alive (restarting it from its checkpoint with a growing back-off after failures),
holds ``max_concurrent_runs`` (further runs wait their turn), sends notifications, and moves
running jobs onto a new deployment: a notebook task whose definition changed is swapped in its
running driver (no JVM restart; see ``streamling.bundle.handover``): the driver checks the new
definition in its warm SparkSession, stops the old one after its current epoch and starts the new
one on the same checkpoint, or answers that the change needs a new JVM (Spark settings, plugins),
or that the new definition is broken — then the old one keeps running and the run's message says
why. Other tasks, and changes that need a new JVM, are stopped after their current epoch
(SIGTERM) and restarted on the same checkpoint; an unchanged task is left alone.

The CLI never touches run state: it files requests in the store and reads. With the SQLite store
(one host) the runner holds an OS lock on ``runner.lock`` for its whole life, so there is never a
second one and a dead runner's lock is free at once. With a shared store (``job_runner.store:
postgres``) runners on several hosts may run at once: the one holding the store's lease supervises
and renews it every tick; the others stand by and take the lease once it expires
(``job_runner.lease_secs``). Drivers survive a runner restart and the new runner adopts those on
its own host; a driver on another host is fenced (see ``streamling.bundle.store``): it stops at
once, and its task starts again here from its checkpoint. A runner that cannot renew its lease
stops supervising before the lease can pass to another, so two never act at once.

Drivers warmed ahead of need (a continuous task's standby, the target's pooled warm drivers) are kept
by ``streamling.bundle.warm_drivers``, which the runner calls each tick and whenever it launches an
attempt. Tasks that run no driver (condition, run_job, for-each) are carried out by
``streamling.bundle.control_flow`` when the runner finds them due. Which jobs start a run by
themselves each tick (schedules, periodic triggers, continuous jobs and their back-off) is
``streamling.bundle.triggers``; the notifications of run events, ``streamling.bundle.notifications``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamling.bundle import handover
from streamling.bundle.control_flow import ITERATION_INDEX, ITERATION_INPUT, ControlFlow
from streamling.bundle.notifications import Notifications
from streamling.bundle.store import Store, StoreUnavailable
from streamling.bundle.triggers import Triggers
from streamling.bundle.warm_drivers import WarmDrivers
from streamling.bundle.workspace import Workspace
from streamling.errors import StreamlingError
from streamling.util import process_alive

log = logging.getLogger("streamling.bundle.runner")

TICK_SECS = 0.5
# A driver given SIGTERM finishes its epoch within its shutdown budget (shutdown_budget_secs, 25 s by
# default) or exits 3 by itself; only one that outlives that by a margin is killed.
STOP_GRACE_SECS = 40.0
IDLE_EXIT_SECS = 15.0

#: how often a runner looks for a new version on an object-store root
REMOTE_POLL_SECS = 1.0


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


def _exit_file_code(log_path: Path) -> int | None:
    try:
        return int(Path(f"{log_path}.exit").read_text().strip())
    except (OSError, ValueError):
        return None


def host_name() -> str:
    """This host's name as runs record it (``STREAMLING_HOST`` overrides the OS host name)."""
    return os.environ.get("STREAMLING_HOST") or socket.gethostname()


class LeaseLost(Exception):
    """This runner no longer holds the store's lease: another may supervise now, so it must not."""


class Runner:
    def __init__(self, root: Path) -> None:
        self.ws = Workspace(str(root))
        self.store = self.ws.open_store()
        self.lease_secs = self.ws.store_settings().lease_secs
        self.host = host_name()
        self.holder = f"{self.host}:{os.getpid()}:{int(time.time())}"
        self._renewed = time.monotonic()
        self.attempts: dict[int, Attempt] = {}
        self.deployment: dict[str, Any] | None = None
        self.version: int | None = None
        self._deployments: dict[int, dict[str, Any] | None] = {}  # immutable once written: read each once
        self._stop = threading.Event()
        #: set to end the wait between ticks early: a driver exited (SIGCHLD) or the runner stops
        self._wake = threading.Event()
        #: a continuous job's run ended in this tick (its next one is started before the tick ends)
        self._continuous_ended = False
        self._idle_since: float | None = None
        self._draining = False  #: the target is being destroyed: no run starts any more
        self.warm = WarmDrivers(self.ws)  #: standbys and pooled warm drivers on this host
        self.flow = ControlFlow(self.store, self.ws.root)  #: condition, run_job and for-each tasks
        self.triggers = Triggers(self.store, self._create_run)  #: schedules, periodic and continuous jobs
        self.notifications = Notifications(self.store)  #: email and webhook notifications of run events

    # --- main loop --------------------------------------------------------------------------------

    def serve(self) -> None:
        if self.store.shared and not self._take_lease():
            return
        if self.ws.remote is not None:
            self.ws.current_version()  # the live version before the first tick
            threading.Thread(target=self._follow_remote, name="streamling-follow-root", daemon=True).start()
        try:
            self._adopt()
            while not self._stop.is_set():
                idle = False
                try:
                    self._renew_lease()
                    self.tick()
                    idle = self._idle()
                except LeaseLost as exc:
                    log.error("%s; this runner stops supervising (its drivers are fenced by the runner that took "
                              "over, or adopted by the next runner on this host)", exc)
                    return
                except StoreUnavailable as exc:
                    log.warning("%s; trying again", exc.headline())
                except Exception:  # noqa: BLE001 - the supervisor must outlive one bad tick
                    log.exception("runner tick failed")
                if idle:
                    log.info("nothing to run or schedule; the runner exits (any bundle command starts it again)")
                    if self.store.shared:
                        self.store.release_lease(self.holder)
                    return
                # The next tick comes at once when a driver exits: the task after it starts without
                # waiting out the tick (a chain of short tasks would otherwise lose up to a tick each).
                self._wake.wait(TICK_SECS)
                self._wake.clear()
        finally:
            self.warm.release_all()
            self.store.close()

    def _follow_remote(self) -> None:
        """Fetch what an object-store root publishes into this host's mirror, off the supervision loop:
        a slow or unreachable store delays a new version, never a lease renewal or a driver's restart."""
        while not self._stop.wait(REMOTE_POLL_SECS):
            before = self.ws.current_version(refresh=False)
            if self.ws.current_version() != before:
                self.wake()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # --- the lease (shared stores) ------------------------------------------------------------------

    def _take_lease(self) -> bool:
        """Stand by until the lease is free or expired, then take it; False when stopped meanwhile."""
        announced = False
        while not self._stop.is_set():
            try:
                generation = self.store.acquire_lease(self.holder, self.host, os.getpid(), self.lease_secs)
            except StoreUnavailable as exc:
                log.warning("%s; trying again", exc.headline())
                generation = None
            if generation is not None:
                self._renewed = time.monotonic()
                log.info("runner %s holds the lease of %s (generation %d, %gs, renewed every %gs)", self.holder,
                         self.store.describe, generation, self.lease_secs, TICK_SECS)
                return True
            if not announced:
                try:
                    lease = self.store.lease()
                    log.info("runner %s stands by: runner %s supervises (its lease ends in %.1fs unless renewed)",
                             self.holder, lease.holder, lease.expires_at - lease.now)
                except StoreUnavailable:
                    pass
                announced = True
            self._stop.wait(TICK_SECS)
        return False

    def _renew_lease(self) -> None:
        if not self.store.shared:
            return
        try:
            generation = self.store.acquire_lease(self.holder, self.host, os.getpid(), self.lease_secs)
        except StoreUnavailable:
            # Another runner may take the lease once it expires: stop acting well before that.
            if time.monotonic() - self._renewed > self.lease_secs / 2:
                raise LeaseLost(f"the lease could not be renewed for {time.monotonic() - self._renewed:.1f}s "
                                f"(job_runner.lease_secs={self.lease_secs:g})") from None
            raise
        if generation is None:
            raise LeaseLost("another runner holds the lease now")
        self._renewed = time.monotonic()

    def tick(self) -> None:
        now = time.time()
        self._load_deployment()
        self._handle_requests()
        self._poll_swaps()
        self.triggers.fire(now, self.deployment, self._draining)
        self._reap(now)
        self._continuous_ended = False
        self._advance_runs(now)
        if self._continuous_ended:
            # A continuous job whose driver just died gets its next run in this tick, not the next
            # one: its warm standby takes over half a second sooner.
            self.triggers.fire(time.time(), self.deployment, self._draining)
            self._advance_runs(time.time())
        self.warm.keep_standbys(now, self.deployment, self.version, self.attempts.values(), self._draining)
        self.warm.keep_pool(now, self.deployment, self.version, self.attempts.values(), self._draining)

    def _idle(self) -> bool:
        busy = bool(self.attempts) or bool(self.store.runs(active_only=True, limit=1)) \
            or bool(self.store.pending_requests()) or self.triggers.live(self.deployment)
        if busy:
            self._idle_since = None
            return False
        self._idle_since = self._idle_since or time.time()
        return time.time() - self._idle_since > IDLE_EXIT_SECS

    # --- deployments ------------------------------------------------------------------------------

    def _load_deployment(self) -> None:
        version = self.ws.current_version(refresh=False)  # an object-store root: see _follow_remote
        if version is None or version == self.version:
            return
        new = self._deployment(version)
        if new is None:
            return
        old, self.deployment, self.version = self.deployment, new, version
        if old is not None:
            log.info("deployment %s is live (was %s)", version, old["version"])
        # Attempts adopted from an earlier runner are compared too: a deploy may have happened while
        # no runner was there to move them.
        held = {attempt.run_id for attempt in list(self.attempts.values())
                if attempt.deployment != version and self._move(attempt, new, version)}
        if old is None:
            return
        for run in self.store.runs(active_only=True, limit=1000):
            if run.job_key in new["jobs"] and run.id not in held:
                self.store.set_run(run.id, deployment=version)

    def _move(self, attempt: Attempt, new: dict[str, Any], version: int) -> bool:
        """Move a running attempt onto deployment ``version``; True while its driver is asked to swap
        (its run keeps showing the deployment the driver runs until the driver answers)."""
        job = new["jobs"].get(attempt.job_key)
        if job is None:
            self._stop_attempt(attempt, "cancel")
            self.store.set_run(attempt.run_id, message=f"job '{attempt.job_key}' was removed by deployment {version}")
            return False
        before = self._task_record(attempt.deployment, attempt.job_key, attempt.task_key)
        after = next((t for t in job["tasks"] if t["task_key"] == attempt.task_key), None)
        if after is None:
            self._stop_attempt(attempt, "cancel")
            return False
        if before is not None and before["fingerprint"] == after["fingerprint"] and attempt.swap_to is None:
            return False  # unchanged (a reverted change still supersedes a swap asked for and not answered)
        if attempt.stopping is not None:
            return False  # on its way out already
        status = handover.read(handover.status_file(attempt.log_path))
        if status is not None and status.get("request") == version:
            attempt.swap_to = version  # answered already (to an earlier runner): _poll_swaps acts on it
            return True
        why_not = _why_no_swap(before, after, status)
        if why_not:
            log.info("run %d task '%s': definition changed in deployment %s; %s, so it stops after the current epoch "
                     "and a new driver resumes from the same checkpoint", attempt.run_id, attempt.task_key, version,
                     why_not)
            self._stop_attempt(attempt, "redeploy", note=why_not)
            return False
        handover.write(handover.request_file(attempt.log_path), {"deployment": version, "at": time.time()})
        attempt.swap_to = version
        log.info("run %d task '%s': definition changed in deployment %s; its driver (pid %d) checks it and swaps it in "
                 "after the current epoch, on the same checkpoint (no JVM restart)", attempt.run_id, attempt.task_key,
                 version, attempt.pid)
        return True

    def _poll_swaps(self) -> None:
        """Record what drivers answered: the deployment each runs now, a swap refused, or a new JVM needed."""
        for attempt in list(self.attempts.values()):
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
                self._stop_attempt(attempt, "redeploy", note=why)

    def _deployment(self, version: int) -> dict[str, Any] | None:
        if version not in self._deployments:
            self._deployments[version] = self.ws.deployment(version)
        return self._deployments[version]

    def _task_record(self, version: int, job_key: str, task_key: str) -> dict[str, Any] | None:
        job = (self._deployment(version) or {}).get("jobs", {}).get(job_key)
        return next((t for t in job["tasks"] if t["task_key"] == task_key), None) if job else None

    # --- requests from the CLI --------------------------------------------------------------------

    def _handle_requests(self) -> None:
        for req in self.store.pending_requests():
            kind, job_key = req["kind"], req["job_key"]
            result: dict[str, Any]
            if kind == "shutdown":
                self.store.handled(req["id"], {"ok": True})
                self.stop()
                return
            if kind == "run":
                if self._draining:
                    result = {"error": "the target is being destroyed"}
                elif self.deployment is None or job_key not in self.deployment["jobs"]:
                    result = {"error": f"job '{job_key}' is not deployed"}
                else:
                    run_id = self._create_run(job_key, "manual", json.loads(req["params"]))
                    result = {"run_id": run_id}
            elif kind == "cancel":
                result = {"cancelled": self._cancel_run(int(req["run_id"]), "cancelled by request")}
            elif kind == "drain":
                # ``bundle destroy``: nothing starts from now on (a continuous job would start its next
                # run after the cancel, under a root about to be deleted); every active run is cancelled
                self._draining = True
                ids = [r.id for r in self.store.runs(active_only=True, limit=1000)]
                for run_id in ids:
                    self._cancel_run(run_id, "cancelled: the target is being destroyed")
                self.warm.release_all()
                result = {"cancelled": ids}
            elif kind == "cancel_job":
                ids = [r.id for r in self.store.runs(job_key, active_only=True, limit=1000)]
                for run_id in ids:
                    self._cancel_run(run_id, "cancelled by request")
                result = {"cancelled": ids}
            else:
                result = {"error": f"unknown request '{kind}'"}
            self.store.handled(req["id"], result)

    def _create_run(self, job_key: str, trigger: str, params: dict[str, str]) -> int:
        assert self.deployment is not None and self.version is not None
        job = self.deployment["jobs"][job_key]
        run_id = self.store.create_run(job_key, self.version, trigger, params, [t["task_key"] for t in job["tasks"]])
        log.info("run %d of job '%s' created (%s)", run_id, job_key, trigger)
        return run_id

    def _cancel_run(self, run_id: int, message: str) -> bool:
        run = self.store.run(run_id)
        if run is None or not run.active:
            return False
        running = [a for a in self.attempts.values() if a.run_id == run_id]
        for attempt in running:
            self._stop_attempt(attempt, "cancel")
        for task in self.store.tasks(run_id):
            if task["state"] in ("pending", "waiting_retry"):
                self.store.set_task(run_id, task["task_key"], state="cancelled", ended_at=time.time())
        for child in self.store.child_runs(run_id):  # what its run_job tasks started goes with it
            if child["state"] in ("pending", "running"):
                self._cancel_run(int(child["id"]), f"run {run_id}, which started it, was cancelled")
                self.store.set_task(run_id, str(child["parent_task"]), state="cancelled", ended_at=time.time(),
                                    message="cancelled")
        self.store.set_run(run_id, message=message)
        if not running:
            self._finish_run(run_id, "cancelled", message)
        return True

    # --- attempts ----------------------------------------------------------------------------------

    def _adopt(self) -> None:
        """Drivers started by an earlier runner keep running; follow them to their end."""
        for row in self.store.running_attempts():
            run = self.store.run(row["run_id"])
            remote = self.store.shared and bool(row["host"]) and row["host"] != self.host
            attempt = Attempt(row["id"], row["run_id"], run.job_key if run else "", row["task_key"], row["number"],
                              row["deployment"], row["pid"] or 0, Path(row["log_path"]), row["started_at"],
                              remote=remote)
            self.attempts[row["id"]] = attempt
            if remote:
                # Its runner is gone and this host cannot signal it: fence it, wait for it to end, and
                # start the task again here from its checkpoint (one writer per checkpoint).
                self.store.fence(row["id"], self.holder)
                attempt.stopping = "fenced"
                log.info("run %d task '%s': its driver (pid %s on host %s) was supervised by a runner that is gone; "
                         "it is fenced and starts again on this host from its checkpoint once it has stopped",
                         row["run_id"], row["task_key"], row["pid"], row["host"])
                continue
            log.info("following run %d task '%s' (pid %s) started by an earlier runner", row["run_id"],
                     row["task_key"], row["pid"])

    def _launch(self, run_id: int, job_key: str, task_key: str, params: dict[str, str]) -> None:
        assert self.version is not None
        task = self.store.query("SELECT attempts FROM tasks WHERE run_id=? AND task_key=?", (run_id, task_key))[0]
        number = int(task["attempts"]) + 1
        log_path = self.ws.logs / f"run-{run_id}" / f"{task_key}-{number}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        attempt_id = self.store.start_attempt(run_id, task_key, number, self.version, str(log_path), self.host)
        context = self.flow.context(self.deployment, run_id, job_key, task_key, attempt_id, number)
        params = {k: v for k, v in params.items() if k not in (ITERATION_INPUT, ITERATION_INDEX)}  # in the context
        # a task with libraries runs on its own environment's interpreter (see bundle.environments)
        record = self._task_record(self.version, job_key, task_key) or {}
        python = record.get("python") or sys.executable
        launcher: list[str] = []
        if not Path(python).exists() and record.get("libraries"):
            # deployed from another host (a root on an object store): the task's own process builds
            # the environment here first (see bundle.environments.main)
            from streamling.bundle.environments import on_this_host

            requirements = on_this_host(list(record["libraries"]),
                                        str(((self.deployment or {}).get("resolved") or {}).get("root") or ""),
                                        self.ws.files)
            launcher, python = [sys.executable, "-m", "streamling.bundle.environments", json.dumps(requirements),
                                "--"], "python"
        cmd = [*launcher, python, "-m", "streamling.bundle.driver", "--root", str(self.ws.root),
               "--deployment", str(self.version), "--job", job_key, "--task", task_key,
               "--params", json.dumps(params), "--exit-file", f"{log_path}.exit", "--attempt", str(attempt_id),
               "--context", json.dumps(context)]
        standby = self.warm.take_standby(job_key, task_key, record) if not launcher else None
        if standby is None and not launcher:
            standby = self.warm.take_pooled(record, python, self.deployment)
        if standby is not None:
            # Its log becomes the attempt's (the process keeps writing to the same file), then the go
            # file hands it the attempt: it runs exactly what the command below would.
            standby.log_path.rename(log_path)
            go = {"deployment": self.version, "params": json.dumps(params), "exit_file": f"{log_path}.exit",
                  "attempt": attempt_id, "context": json.dumps(context), "job": job_key, "task": task_key}
            tmp = standby.go_file.with_name(standby.go_file.name + ".tmp")
            tmp.write_text(json.dumps(go))
            tmp.replace(standby.go_file)
            proc = standby.proc
            if proc.stdin is not None:
                proc.stdin.close()  # it is the task's driver now: it outlives this runner, as a cold one would
            log.info("run %d task '%s': %s (pid %d, started %.0fs ago, %s) takes over", run_id, task_key,
                     "a pooled warm driver" if not standby.job_key else "its warm standby driver", proc.pid,
                     time.time() - standby.started, "ready" if standby.ready else "still warming up")
        else:
            with open(log_path, "ab") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=str(self.ws.root))
        self.store.set_attempt(attempt_id, pid=proc.pid)
        self.store.set_task(run_id, task_key, state="running", attempts=number, started_at=time.time(),
                            retry_at=None)
        self.store.set_run(run_id, deployment=self.version)  # the version the run now runs
        self.attempts[attempt_id] = Attempt(attempt_id, run_id, job_key, task_key, number, self.version, proc.pid,
                                            log_path, time.time(), proc)
        log.info("run %d task '%s' attempt %d started (pid %d, deployment %d)", run_id, task_key, number, proc.pid,
                 self.version)

    def _push_log(self, attempt: Attempt) -> None:
        """An ended attempt's log to the object-store root (off the supervision loop: a slow store
        must not delay it)."""
        try:
            self.ws.push_log(attempt.log_path)
        except (OSError, StreamlingError) as exc:
            log.warning("run %d task '%s': the log of attempt %d stays on this host (%s): %s", attempt.run_id,
                        attempt.task_key, attempt.number, self.ws.where,
                        exc.headline() if isinstance(exc, StreamlingError) else exc)

    def _stop_attempt(self, attempt: Attempt, why: str, note: str | None = None) -> None:
        if attempt.stopping is None or why == "cancel":
            attempt.stopping = why
            attempt.stop_note = note
        if attempt.term_sent is None and not attempt.remote:
            attempt.term_sent = time.time()
            # Only the driver: it finishes its epoch and stops its JVM itself. A SIGTERM to the whole
            # session would kill the JVM under it mid-epoch.
            try:
                os.kill(attempt.pid, signal.SIGTERM)
            except OSError:
                pass

    def _reap(self, now: float) -> None:
        for attempt in list(self.attempts.values()):
            if attempt.term_sent is not None and now - attempt.term_sent > STOP_GRACE_SECS:
                log.warning("run %d task '%s': no exit %.0fs after SIGTERM; killing it", attempt.run_id,
                            attempt.task_key, STOP_GRACE_SECS)
                _signal(attempt.pid, signal.SIGKILL)
                attempt.term_sent = now  # one SIGKILL per grace period
            self._check_timeouts(attempt, now)
            age = self.store.heartbeat_age(attempt.id) if attempt.remote else None
            code = attempt.exit_code(age, self.lease_secs)
            if code is None:
                continue
            del self.attempts[attempt.id]
            if code < 0 and not attempt.remote:
                # A killed driver's JVM may outlive it for a moment: it must not write an epoch while the
                # task's next driver (a warm standby, within a second) resumes the same checkpoint.
                with contextlib.suppress(OSError):
                    os.killpg(attempt.pid, signal.SIGKILL)
            self._attempt_ended(attempt, code, now)

    def _check_timeouts(self, attempt: Attempt, now: float) -> None:
        if attempt.stopping is not None:
            return
        record = self._task_record(attempt.deployment, attempt.job_key, attempt.task_key) or {}
        limit = int(record.get("timeout_seconds") or 0)
        if limit and now - attempt.started > limit:
            log.warning("run %d task '%s' exceeded timeout_seconds=%d", attempt.run_id, attempt.task_key, limit)
            self._stop_attempt(attempt, "timeout")
            return
        job = (self.deployment or {}).get("jobs", {}).get(attempt.job_key, {})
        job_limit = int(job.get("timeout_seconds") or 0)
        if not job_limit:
            return
        run = self.store.run(attempt.run_id)
        if run is not None and run.started_at and now - run.started_at > job_limit:
            self._stop_attempt(attempt, "job_timeout")

    def _attempt_ended(self, attempt: Attempt, code: int, now: float) -> None:
        run_id, key = attempt.run_id, attempt.task_key
        why = attempt.stopping
        if why == "fenced":
            state, message = "fenced", "its runner was lost; the task starts again from its checkpoint on host " \
                f"{self.host}"
        elif why == "redeploy":
            state, message = "redeployed", f"stopped to move to deployment {self.version}" + (
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
        record = self._task_record(attempt.deployment, attempt.job_key, key) or {}
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

    # --- runs ----------------------------------------------------------------------------------------

    def _advance_runs(self, now: float) -> None:
        if self.deployment is None:
            return
        active = self.store.runs(active_only=True, limit=1000)
        running_by_job: dict[str, int] = {}
        for run in active:
            if run.state == "running":
                running_by_job[run.job_key] = running_by_job.get(run.job_key, 0) + 1
        for run in sorted(active, key=lambda r: r.id):
            job = self.deployment["jobs"].get(run.job_key)
            if job is None:
                if not any(a.run_id == run.id for a in self.attempts.values()):
                    self._finish_run(run.id, "cancelled", "the job is no longer deployed")
                continue
            if run.state == "pending":
                limit = int(job.get("max_concurrent_runs") or 1)
                if running_by_job.get(run.job_key, 0) >= limit:
                    continue  # waits its turn: max_concurrent_runs holds
                running_by_job[run.job_key] = running_by_job.get(run.job_key, 0) + 1
                self.store.set_run(run.id, state="running", started_at=now)
                self.notifications.notify(run.id, job, "on_start", "running", self.deployment, self.version)
            self._advance_tasks(run.id, run.job_key, job, run.params, now)

    def _advance_tasks(self, run_id: int, job_key: str, job: dict[str, Any], params: dict[str, str],
                       now: float) -> None:
        tasks = {t["task_key"]: t for t in self.store.tasks(run_id)}
        defs = {t["task_key"]: t for t in job["tasks"]}
        busy = {a.task_key for a in self.attempts.values() if a.run_id == run_id}
        for key, task in tasks.items():
            if key in busy:
                continue
            if task["state"] == "pending":
                decision = _readiness(defs.get(key, {}), tasks)
                if decision == "upstream_failed":
                    self.store.set_task(run_id, key, state="upstream_failed", ended_at=now,
                                        message="a task it depends on did not succeed")
                elif decision == "excluded":
                    self.store.set_task(run_id, key, state="excluded", ended_at=now,
                                        message=f"excluded: its dependencies do not meet run_if "
                                                f"{defs.get(key, {}).get('run_if') or 'ALL_SUCCESS'}")
                elif decision == "run" and defs.get(key, {}).get("kind") == "condition":
                    self.flow.evaluate(self.deployment, run_id, job_key, key, params, now)
                    return self._advance_tasks(run_id, job_key, job, params, now)  # its outcome gates others
                elif decision == "run" and defs.get(key, {}).get("kind") == "run_job":
                    self.flow.start_child_run(self.deployment, self.version, run_id, job_key, key, params, now)
                elif decision == "run" and defs.get(key, {}).get("kind") == "for_each":
                    self.flow.start_iterations(self.deployment, self.version, run_id, job_key, key, params, now)
                elif decision == "run":
                    self._launch(run_id, job_key, key, params)
            elif task["state"] == "running" and defs.get(key, {}).get("kind") == "run_job":
                self.flow.follow_child_run(run_id, key, defs[key], now)
            elif task["state"] == "running" and defs.get(key, {}).get("kind") == "for_each":
                self.flow.follow_iterations(self.deployment, self.version, run_id, key, defs[key], params, now)
            elif task["state"] == "waiting_retry" and (task["retry_at"] or 0) <= now:
                if defs.get(key, {}).get("kind") == "run_job":
                    self.flow.start_child_run(self.deployment, self.version, run_id, job_key, key, params, now)
                else:
                    self._launch(run_id, job_key, key, params)
        tasks = {t["task_key"]: t for t in self.store.tasks(run_id)}
        if any(a.run_id == run_id for a in self.attempts.values()):
            return
        states = [t["state"] for t in tasks.values()]
        if any(s in ("pending", "running", "waiting_retry") for s in states):
            return
        if all(s in ("succeeded", "excluded") for s in states):
            self._finish_run(run_id, "succeeded", "all tasks succeeded")
        elif any(s == "cancelled" for s in states):
            self._finish_run(run_id, "cancelled", "cancelled")
        else:
            failed = [f"{k}: {t['message']}" for k, t in tasks.items() if t["state"] in ("failed", "timed_out")]
            self._finish_run(run_id, "failed", "; ".join(failed) or "a task did not succeed")

    def _finish_run(self, run_id: int, state: str, message: str) -> None:
        run = self.store.run(run_id)
        if run is None or not run.active:
            return
        self.store.set_run(run_id, state=state, ended_at=time.time(), message=message)
        log.info("run %d of job '%s' %s: %s", run_id, run.job_key, state, message)
        job = (self.deployment or {}).get("jobs", {}).get(run.job_key)
        if job is None:
            return
        if state in ("succeeded", "failed"):
            self.notifications.notify(run_id, job, "on_success" if state == "succeeded" else "on_failure", state,
                                      self.deployment, self.version)
        if run.trigger == "continuous":
            self._continuous_ended = True
            self.triggers.continuous_run_ended(run.job_key, job, state)


_DONE_FAILED = ("failed", "cancelled", "timed_out", "upstream_failed")


def _readiness(record: dict[str, Any], tasks: dict[str, Any]) -> str:
    """Whether a pending task runs now, given how its dependencies ended and its ``run_if``
    (Databricks' rules): "wait", "run", "excluded" or "upstream_failed". A dependency on a condition
    task's ``outcome`` counts as succeeded only when the condition came out that way."""
    deps = [d for d in record.get("depends_on", []) if d in tasks]
    if any(tasks[d]["state"] in ("pending", "running", "waiting_retry") for d in deps):
        return "wait"
    if not deps:
        return "run"
    outcomes = record.get("outcomes") or {}
    ok = [tasks[d]["state"] == "succeeded" and (d not in outcomes or tasks[d]["message"] == outcomes[d]) for d in deps]
    failed = [tasks[d]["state"] in _DONE_FAILED for d in deps]
    rule = record.get("run_if") or "ALL_SUCCESS"
    if rule == "ALL_DONE":
        return "run"
    if rule == "AT_LEAST_ONE_FAILED":
        return "run" if any(failed) else "excluded"
    if rule == "ALL_FAILED":
        return "run" if all(failed) else "excluded"
    if rule == "AT_LEAST_ONE_SUCCESS":
        return "run" if any(ok) else "upstream_failed" if any(failed) else "excluded"
    if any(failed):  # ALL_SUCCESS, NONE_FAILED
        return "upstream_failed"
    if rule == "NONE_FAILED":
        return "run" if any(ok) else "excluded"
    return "run" if all(ok) else "excluded"


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


# --- starting the runner ----------------------------------------------------------------------------

def runner_running(ws: Workspace, store: Store | None = None) -> bool:
    """True when a runner supervises this root: it holds the shared store's lease (on any host) or,
    with the SQLite store, this root's lock."""
    if ws.store_settings().store != "sqlite":
        if store is not None:
            return store.lease().held
        own = ws.open_store()
        try:
            return own.lease().held
        finally:
            own.close()
    if not ws.runner_lock.exists():
        return False
    with open(ws.runner_lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def ensure_runner(ws: Workspace, timeout_secs: float = 15, store: Store | None = None) -> None:
    """Start this root's runner in the background unless one runs; it outlives the calling command.

    With a shared store, a runner on any host holding the lease counts: none is started here."""
    if runner_running(ws, store):
        return
    ws.root.mkdir(parents=True, exist_ok=True)
    with open(ws.runner_log, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "streamling.bundle.runner", str(ws.root)], stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        if runner_running(ws, store):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the job runner did not start; see {ws.runner_log}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamling-runner", description="Supervise the jobs deployed under ROOT.")
    p.add_argument("root")
    args = p.parse_args(argv)
    from streamling.cli import setup_logging

    # as the CLI's: among others, httpx would log every webhook's URL, credentials included
    setup_logging("text", debug=False)
    ws = Workspace(args.root)
    ws.root.mkdir(parents=True, exist_ok=True)
    if ws.store_settings().store != "sqlite":
        # Several hosts: the store's lease decides who supervises, not a lock on one host's disk.
        runner = Runner(ws.root)
        signal.signal(signal.SIGTERM, lambda *_: runner.stop())
        signal.signal(signal.SIGCHLD, lambda *_: runner.wake())
        log.info("runner %s (pid %d) for %s, run store %s", runner.holder, os.getpid(), ws.root, runner.store.describe)
        runner.serve()
        return 0
    with open(ws.runner_lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("a runner already supervises %s", ws.root)
            return 0
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        runner = Runner(ws.root)
        signal.signal(signal.SIGTERM, lambda *_: runner.stop())
        signal.signal(signal.SIGCHLD, lambda *_: runner.wake())
        log.info("runner %d supervises %s", os.getpid(), ws.root)
        runner.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
