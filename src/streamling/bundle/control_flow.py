"""The tasks the job runner carries out itself, with no driver process of their own, and what every
task's dynamic value references read.

A condition task compares its two sides and records "true" or "false", which the tasks after it
follow; a run_job task starts a run of another job and ends as that run ends; a for-each task
starts one run of its hidden iteration job per input, at most ``concurrency`` at a time, and ends
once all have ended. Their state lives in the run store (tasks, child runs), so ``ControlFlow``
holds nothing between ticks: the runner decides when a task is due and hands it the live deployment.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from streamling.bundle.store import Store
from streamling.errors import StreamlingError

# what these tasks do is part of the runner's log
log = logging.getLogger("streamling.bundle.runner")

#: the run parameters of a for-each iteration that hold its input and its index (not job parameters)
ITERATION_INPUT = "__input"
ITERATION_INDEX = "__iteration"


class ControlFlow:
    """Condition, run_job and for-each tasks of the runs in ``store``, and the run context of any task
    (``root`` is the workspace its references name)."""

    def __init__(self, store: Store, root: Path) -> None:
        self.store = store
        self.root = root

    def context(self, deployment: dict[str, Any] | None, run_id: int, job_key: str, task_key: str, attempt_id: int,
                number: int) -> dict[str, Any]:
        """What Databricks' dynamic value references ({{job.run_id}}, {{tasks.t.values.k}}…) read."""
        from streamling.bundle.references import task_results

        run = self.store.run(run_id)
        jobs = (deployment or {}).get("jobs", {})
        job = jobs.get(job_key) or {}
        task_record: dict[str, Any] = next((t for t in job.get("tasks") or [] if t.get("task_key") == task_key), {})
        owner, outer = job_key, run  # an iteration of a for-each task is part of the run that started it
        if run is not None and run.parent_run is not None and job.get("iteration_of"):
            owner, outer = str(job["iteration_of"][0]), self.store.run(run.parent_run) or run
        return {"job_key": owner, "job_name": str((jobs.get(owner) or job).get("name") or owner),
                "run_id": outer.id if outer else run_id, "task_key": task_key, "attempt_id": attempt_id,
                "attempt": number, "start_time": (outer.started_at or outer.created_at) if outer else time.time(),
                "trigger": outer.trigger if outer else "manual",
                "notebook_path": str(task_record.get("notebook_path") or ""), "workspace": str(self.root),
                "task_values": self.store.task_values(outer.id if outer else run_id),
                "input": run.params.get(ITERATION_INPUT) if run is not None else None,
                "trigger_time": outer.created_at if outer else 0.0,
                "task_results": task_results(self.store.tasks(outer.id if outer else run_id),
                                             self.store.attempts(outer.id if outer else run_id))}

    def evaluate(self, deployment: dict[str, Any] | None, run_id: int, job_key: str, task_key: str,
                 params: dict[str, str], now: float) -> None:
        """A condition task: no process, the runner compares its two sides (references filled in)
        and records the outcome, "true" or "false", which the tasks after it follow."""
        from streamling.bundle.references import RunContext, compare, job_parameter_values, resolve

        job = (deployment or {}).get("jobs", {}).get(job_key) or {}
        record = next(t for t in job["tasks"] if t["task_key"] == task_key)
        condition = record["condition"]
        try:
            context = RunContext(**self.context(deployment, run_id, job_key, task_key, 0, 1))
            values = job_parameter_values(job, params)
            left, right = (resolve(condition[side], context, values) for side in ("left", "right"))
            outcome = compare(condition["op"], left, right)
        except (ValueError, StreamlingError) as exc:
            message = exc.headline() if isinstance(exc, StreamlingError) else str(exc)
            self.store.set_task(run_id, task_key, state="failed", started_at=now, ended_at=now, message=message)
            log.info("run %d condition task '%s' failed: %s", run_id, task_key, message)
            return
        self.store.set_task(run_id, task_key, state="succeeded", started_at=now, ended_at=now,
                            message="true" if outcome else "false")
        log.info("run %d condition task '%s': %r %s %r is %s", run_id, task_key, left, condition["op"], right,
                 str(outcome).lower())

    def start_child_run(self, deployment: dict[str, Any] | None, version: int | None, run_id: int, job_key: str,
                        task_key: str, params: dict[str, str], now: float) -> None:
        """A run_job_task: a run of the job it names, with its job_parameters (references filled in);
        the task follows that run (``follow_child_run``) and ends as it ends."""
        from streamling.bundle.references import RunContext, job_parameter_values, resolve

        assert deployment is not None and version is not None
        job = deployment["jobs"][job_key]
        spec = next(t for t in job["tasks"] if t["task_key"] == task_key)["run_job"]
        number = int(self.store.query("SELECT attempts FROM tasks WHERE run_id=? AND task_key=?",
                                      (run_id, task_key))[0]["attempts"]) + 1
        child_job = deployment["jobs"].get(spec["job"])
        try:
            if child_job is None:
                raise StreamlingError(f"job '{spec['job']}' is not deployed")
            context = RunContext(**self.context(deployment, run_id, job_key, task_key, 0, number))
            values = job_parameter_values(job, params)
            child_params = {k: resolve(str(v), context, values) for k, v in spec["parameters"].items()}
        except StreamlingError as exc:
            self.store.set_task(run_id, task_key, state="failed", attempts=number, started_at=now, ended_at=now,
                                message=exc.headline())
            return
        child = self.store.create_run(spec["job"], version, "run_job", child_params,
                                      [t["task_key"] for t in child_job["tasks"]], parent=(run_id, task_key))
        self.store.set_task(run_id, task_key, state="running", attempts=number, started_at=now, retry_at=None,
                            message=f"runs job '{spec['job']}' as run {child}")
        log.info("run %d task '%s' runs job '%s' as run %d (parameters %s)", run_id, task_key, spec["job"], child,
                 json.dumps(child_params))

    def start_iterations(self, deployment: dict[str, Any] | None, version: int | None, run_id: int, job_key: str,
                         task_key: str, params: dict[str, str], now: float) -> None:
        """A for-each task: its inputs (references filled in) become the iterations
        ``follow_iterations`` runs, each a run of the task's hidden iteration job."""
        from streamling.bundle.references import RunContext, job_parameter_values, resolve

        assert deployment is not None
        job = deployment["jobs"][job_key]
        spec = next(t for t in job["tasks"] if t["task_key"] == task_key)["for_each"]
        try:
            context = RunContext(**self.context(deployment, run_id, job_key, task_key, 0, 1))
            text = resolve(spec["inputs"], context, job_parameter_values(job, params))
            try:
                inputs = json.loads(text)
            except ValueError:
                inputs = None
            if not isinstance(inputs, list):
                raise StreamlingError(f"the inputs of for-each task '{task_key}' are not a JSON array: "
                                      f"{text if len(text) <= 80 else text[:79] + '…'}",
                                      hint="inputs must be (or refer to) a JSON array such as [\"a\", \"b\"]")
        except StreamlingError as exc:
            self.store.set_task(run_id, task_key, state="failed", attempts=1, started_at=now, ended_at=now,
                                message=exc.headline())
            return
        values = [v if isinstance(v, str) else json.dumps(v) for v in inputs]
        self.store.set_task(run_id, task_key, state="running", attempts=1, started_at=now,
                            iterations=json.dumps(values), message=f"0 of {len(values)} iterations done")
        log.info("run %d for-each task '%s': %d iterations, %d at a time", run_id, task_key, len(values),
                 int(spec["concurrency"]))
        self.follow_iterations(deployment, version, run_id, task_key,
                               next(t for t in job["tasks"] if t["task_key"] == task_key), params, now)

    def follow_iterations(self, deployment: dict[str, Any] | None, version: int | None, run_id: int, task_key: str,
                          record: dict[str, Any], params: dict[str, str], now: float) -> None:
        """Starts iterations while fewer than ``concurrency`` run; the task ends once all have ended,
        failed if any did (the others still run, as on Databricks)."""
        assert deployment is not None and version is not None
        spec = record["for_each"]
        row = self.store.query("SELECT iterations FROM tasks WHERE run_id=? AND task_key=?", (run_id, task_key))[0]
        inputs = json.loads(row["iterations"] or "[]")
        children = list(reversed(self.store.child_runs(run_id, task_key)))  # oldest first: iteration order
        active = sum(1 for c in children if c["state"] in ("pending", "running"))
        iteration_job = deployment["jobs"].get(spec["job"])
        while len(children) < len(inputs) and active < int(spec["concurrency"]) and iteration_job is not None:
            index = len(children)
            child = self.store.create_run(spec["job"], version, "for_each",
                                          {**params, ITERATION_INPUT: inputs[index], ITERATION_INDEX: str(index)},
                                          [t["task_key"] for t in iteration_job["tasks"]], parent=(run_id, task_key))
            children.append({"id": child, "state": "pending", "message": None})
            active += 1
        done = sum(1 for c in children if c["state"] not in ("pending", "running"))
        if active or len(children) < len(inputs):
            self.store.set_task(run_id, task_key, message=f"{done} of {len(inputs)} iterations done")
            return
        failed = [c for c in children if c["state"] != "succeeded"]
        if failed:
            first = failed[0]
            self.store.set_task(run_id, task_key, state="failed", ended_at=now,
                                message=f"{len(failed)} of {len(inputs)} iterations did not succeed; run "
                                        f"{first['id']} {first['state']}" + (f": {first['message']}"
                                                                             if first["message"] else ""))
        else:
            self.store.set_task(run_id, task_key, state="succeeded", ended_at=now,
                                message=f"{len(inputs)} iterations succeeded")

    def follow_child_run(self, run_id: int, task_key: str, record: dict[str, Any], now: float) -> None:
        """A run_job_task ends as the run it started ends (and is retried as any task)."""
        children = self.store.child_runs(run_id, task_key)
        if children and children[0]["state"] in ("pending", "running"):
            return
        child = children[0] if children else None
        if child is not None and child["state"] == "succeeded":
            self.store.set_task(run_id, task_key, state="succeeded", ended_at=now,
                                message=f"run {child['id']} of job '{child['job_key']}' succeeded")
            return
        message = "the run it started is gone" if child is None else \
            f"run {child['id']} of job '{child['job_key']}' {child['state']}" + (
                f": {child['message']}" if child["message"] else "")
        number = int(self.store.query("SELECT attempts FROM tasks WHERE run_id=? AND task_key=?",
                                      (run_id, task_key))[0]["attempts"])
        retries = int(record.get("max_retries") or 0)
        if retries < 0 or number <= retries:
            wait = int(record.get("min_retry_interval_millis") or 0) / 1000
            self.store.set_task(run_id, task_key, state="waiting_retry", retry_at=now + wait, message=message)
        else:
            self.store.set_task(run_id, task_key, state="failed", ended_at=now, message=message)
