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

The CLI never touches run state: it files requests in the store and reads, and starts a runner
when none supervises (``streamling.bundle.runner_start``). With the SQLite store (one host) the
runner holds an OS lock on ``runner.lock`` for its whole life, so there is never a second one and a
dead runner's lock is free at once. With a shared store (``job_runner.store: postgres``) runners on
several hosts may run at once: the one holding the store's lease supervises and renews it every
tick; the others stand by and take the lease once it expires (``job_runner.lease_secs``). Drivers
survive a runner restart and the new runner adopts those on its own host; a driver on another host
is fenced (see ``streamling.bundle.store``): it stops at once, and its task starts again here from
its checkpoint. A runner that cannot renew its lease stops supervising before the lease can pass to
another, so two never act at once.

Drivers warmed ahead of need (a continuous task's standby, the target's pooled warm drivers) are kept
by ``streamling.bundle.warm_drivers``, which the runner calls each tick and whenever it launches an
attempt. Tasks that run no driver (condition, run_job, for-each) are carried out by
``streamling.bundle.control_flow`` when the runner finds them due. Which jobs start a run by
themselves each tick (schedules, periodic triggers, continuous jobs and their back-off) is
``streamling.bundle.triggers``; the notifications of run events, ``streamling.bundle.notifications``.
Moving running attempts onto a new deployment (a swap in the driver, or a stop and restart) is
``streamling.bundle.swaps``; noticing, forcing and recording an attempt's end (timeouts, retries) is
``streamling.bundle.reaper``; the shared store's lease, ``streamling.bundle.lease``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from streamling.bundle.attempts import Attempt
from streamling.bundle.control_flow import ITERATION_INDEX, ITERATION_INPUT, ControlFlow
from streamling.bundle.lease import LeaseHolder, LeaseLost
from streamling.bundle.notifications import Notifications
from streamling.bundle.reaper import Reaper
from streamling.bundle.runner_start import runner_lock
from streamling.bundle.store import StoreUnavailable
from streamling.bundle.swaps import Swaps
from streamling.bundle.triggers import Triggers
from streamling.bundle.warm_drivers import WarmDrivers
from streamling.bundle.workspace import Workspace

log = logging.getLogger("streamling.bundle.runner")

TICK_SECS = 0.5
IDLE_EXIT_SECS = 15.0

#: how often a runner looks for a new version on an object-store root
REMOTE_POLL_SECS = 1.0


def host_name() -> str:
    """This host's name as runs record it (``STREAMLING_HOST`` overrides the OS host name)."""
    return os.environ.get("STREAMLING_HOST") or socket.gethostname()


class Runner:
    def __init__(self, root: Path) -> None:
        self.ws = Workspace(str(root))
        self.store = self.ws.open_store()
        self.host = host_name()
        self.attempts: dict[int, Attempt] = {}
        self.deployment: dict[str, Any] | None = None
        self.version: int | None = None
        self._deployments: dict[int, dict[str, Any] | None] = {}  # immutable once written: read each once
        self._stop = threading.Event()
        #: with a shared store, only the runner holding its lease supervises
        self.lease = LeaseHolder(self.store, self.host, self.ws.store_settings().lease_secs, TICK_SECS, self._stop)
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
        self.swaps = Swaps(self.store, self._task_record)  #: running attempts moved onto a new deployment
        #: ended attempts recorded, overstaying ones stopped
        self.reaper = Reaper(self.ws, self.store, self.host, self.lease.secs, self._task_record)

    # --- main loop --------------------------------------------------------------------------------

    def serve(self) -> None:
        if self.store.shared and not self.lease.take():
            return
        if self.ws.remote is not None:
            self.ws.current_version()  # the live version before the first tick
            threading.Thread(target=self._follow_remote, name="streamling-follow-root", daemon=True).start()
        try:
            self._adopt()
            while not self._stop.is_set():
                idle = False
                try:
                    self.lease.renew()
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
                        self.store.release_lease(self.lease.holder)
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

    def tick(self) -> None:
        now = time.time()
        self.load_deployment()
        self._handle_requests()
        self.swaps.poll(self.attempts.values())
        self.triggers.fire(now, self.deployment, self._draining)
        self.reaper.reap(now, self.attempts, self.deployment, self.version)
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

    def load_deployment(self) -> None:
        """Make the root's current version the live deployment, moving the running attempts onto it."""
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
                if attempt.deployment != version and self.swaps.move(attempt, new, version)}
        if old is None:
            return
        for run in self.store.runs(active_only=True, limit=1000):
            if run.job_key in new["jobs"] and run.id not in held:
                self.store.set_run(run.id, deployment=version)

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
            attempt.stop("cancel")
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
                self.store.fence(row["id"], self.lease.holder)
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
            # it runs exactly what the command above would
            standby.hand_over(log_path, {
                "deployment": self.version, "params": json.dumps(params), "exit_file": f"{log_path}.exit",
                "attempt": attempt_id, "context": json.dumps(context), "job": job_key, "task": task_key})
            proc = standby.proc
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


def main(argv: list[str] | None = None) -> int:
    """``python -m streamling.bundle.runner ROOT``: supervise ROOT until idle or stopped (``runner_start``
    starts it; a second one on the same root leaves at once)."""
    p = argparse.ArgumentParser(prog="streamling-runner", description="Supervise the jobs deployed under ROOT.")
    p.add_argument("root")
    args = p.parse_args(argv)
    from streamling.execution import setup_logging

    # as the CLI's: among others, httpx would log every webhook's URL, credentials included
    setup_logging("text", debug=False)
    ws = Workspace(args.root)
    ws.root.mkdir(parents=True, exist_ok=True)
    if ws.store_settings().store != "sqlite":
        # Several hosts: the store's lease decides who supervises, not a lock on one host's disk.
        runner = Runner(ws.root)
        signal.signal(signal.SIGTERM, lambda *_: runner.stop())
        signal.signal(signal.SIGCHLD, lambda *_: runner.wake())
        log.info("runner %s (pid %d) for %s, run store %s", runner.lease.holder, os.getpid(), ws.root,
                 runner.store.describe)
        runner.serve()
        return 0
    with runner_lock(ws) as held:
        if not held:
            log.info("a runner already supervises %s", ws.root)
            return 0
        runner = Runner(ws.root)
        signal.signal(signal.SIGTERM, lambda *_: runner.stop())
        signal.signal(signal.SIGCHLD, lambda *_: runner.wake())
        log.info("runner %d supervises %s", os.getpid(), ws.root)
        runner.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
