"""The ``streamling bundle`` commands that only read: ``summary`` (what is deployed, what runs, what
differs from the working copy), ``runs`` (recent runs with their tasks, attempts and figures) and
``logs`` (a run's driver logs, followed while it runs). They read the workspace and the run store and
never file a request, so no runner is started for them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.cli_context import out, target_bundle
from streamling.errors import StreamlingError

if TYPE_CHECKING:
    from streamling.bundle.workspace import Workspace


def cmd_summary(args: argparse.Namespace) -> int:
    from streamling.bundle.task_build import build
    from streamling.bundle.warm_drivers import pool_state, standby_state
    from streamling.bundle.workspace import Workspace

    bundle = target_bundle(args)
    ws = Workspace.for_target(bundle.target)
    deployment = ws.deployment()
    store = ws.open_store() if deployment is not None else None
    local = {key: {t.key: tb.record(bundle)["fingerprint"] for t, tb in ((tb.task, tb) for tb in tasks.values())}
             for key, tasks in build(bundle).items()}
    jobs: dict[str, Any] = {}
    for key, job in (deployment or {}).get("jobs", {}).items():
        if job.get("iteration_of"):  # one iteration of a for-each task: shown with its job
            continue
        deployed = {t["task_key"]: t["fingerprint"] for t in job["tasks"]}
        runs = store.runs(key, limit=1) if store is not None else []
        figures = _latest_figures([{"figures": run_figures(a["log_path"], ws)} for a in store.attempts(runs[0].id)]) \
            if runs and store is not None else None
        jobs[key] = {"name": job.get("name"),
                     "trigger": "continuous" if job.get("continuous") else "schedule" if job.get("schedule") else
                     "periodic" if job.get("periodic") else "manual",
                     "pause_status": _pause_status(job),
                     "last_run": {"id": runs[0].id, "state": runs[0].state, **({"figures": {
                         k: figures.get(k) for k in ("status", "rows_to_sinks", "checkpoint", "admin_api", "error")}}
                         if figures else {})} if runs else None,
                     # what a redeploy does to a running task: a notebook of %%streamling cells swaps its
                     # pipeline in the warm driver; any other task (a notebook whose cells run) restarts
                     "on_redeploy": {t["task_key"]: "swaps in its driver" if t["kind"] == "notebook" and
                                     not t.get("executes") else "restarts its driver" for t in job["tasks"]
                                     if t["kind"] not in ("condition", "run_job", "for_each")},
                     # a continuous job's warm standby drivers on this host (job_runner.standby)
                     "standby": {t["task_key"]: state for t in job["tasks"]
                                 if (state := standby_state(ws, key, t["task_key"])) is not None},
                     "working_copy": "not in the working copy" if key not in local else
                     "up to date" if local[key] == deployed else
                     "differs (" + ", ".join(sorted(t for t in set(local[key]) | set(deployed)
                                                   if local[key].get(t) != deployed.get(t))) + ")"}
    for key in set(local) - set(jobs):
        if "[" not in key:  # iteration jobs are named <job>[<task>]
            jobs[key] = {"working_copy": "not deployed yet"}
    summary = {"name": bundle.name, "target": bundle.target.name, "root_path": ws.where,
               "deployment": None if deployment is None else {
                   "version": deployment["version"], "user": deployment.get("user"), "git": deployment.get("git"),
                   "deployed_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(deployment["created_at"]))},
               "runner": _runner_state(ws, store),
               # drivers kept warm for the target's next task on this host (job_runner.warm_drivers)
               "warm_drivers": pool_state(ws), "jobs": jobs}
    if args.output == "json":
        out(json.dumps(summary, indent=2, default=str))
        return 0
    dep = summary["deployment"]
    out(f"Name: {bundle.name}\nTarget: {bundle.target.name}\nRoot: {ws.where}\n"
         + (f"Deployment: version {dep['version']} by {dep['user']} at {dep['deployed_at']}"
            + (f" (git {str(dep['git'].get('commit', ''))[:10]})" if dep.get("git") else "") if dep else
            "Deployment: none") + f"\nRunner: {summary['runner']}"
         + (f"\nWarm drivers: {', '.join(summary['warm_drivers'])}" if summary["warm_drivers"] else "") + "\nJobs:")
    for key, info in jobs.items():
        if "name" not in info:
            out(f"  {key}: {info['working_copy']}")
            continue
        last = info.get("last_run")
        figures = (last or {}).get("figures")
        shown = (f" ({figures['rows_to_sinks']:,} rows to sinks, {figures['checkpoint']['epochs_succeeded']} epochs"
                 + (f", {figures['admin_api']}" if figures.get("admin_api") else "") + ")") if figures else ""
        out(f"  {key}: {info.get('name', '')} · {info.get('trigger', '-')} {info.get('pause_status') or ''} · "
             f"last run {str(last['id']) + ' ' + last['state'] + shown if last else '-'} · {info['working_copy']}")
        if info.get("on_redeploy"):
            out("    on redeploy: " + ", ".join(f"{task} {what}" for task, what in info["on_redeploy"].items()))
        if info.get("standby"):
            out("    warm standby: " + ", ".join(f"{task} {state}" for task, state in info["standby"].items()))
    return 0


def _runner_state(ws: Any, store: Any) -> str:
    """'running'/'stopped'; with a shared store, where the supervising runner is."""
    from streamling.bundle.runner_start import runner_running

    if store is None or not store.shared:
        return "running" if runner_running(ws, store) else "stopped"
    lease = store.lease()
    return f"running on host {lease.host} (pid {lease.pid})" if lease.held else "stopped"


def _pause_status(job: dict[str, Any]) -> str | None:
    for section in (job.get("continuous"), job.get("schedule"), job.get("periodic")):
        if isinstance(section, str):
            return section
        if isinstance(section, dict) and section.get("pause_status"):
            return str(section["pause_status"])
    return None


def cmd_runs(args: argparse.Namespace) -> int:
    from streamling.bundle.workspace import Workspace

    bundle = target_bundle(args)
    ws = Workspace.for_target(bundle.target)
    store = ws.open_store()
    runs = store.runs(args.job, limit=args.limit)
    if not args.job:  # a for-each iteration is listed under its task, as Databricks nests it
        runs = [r for r in runs if not (r.parent_run is not None and r.trigger == "for_each")]
    rows: list[dict[str, Any]] = []
    for run in runs:
        attempts = [{**dict(a), "figures": run_figures(a["log_path"], ws)} for a in store.attempts(run.id)]
        tasks = []
        for t in store.tasks(run.id):
            task: dict[str, Any] = {"task_key": t["task_key"], "state": t["state"], "message": t["message"]}
            if t["iterations"]:
                task["iterations"] = _iterations(store, run.id, t["task_key"])
            tasks.append(task)
        rows.append({"run_id": run.id, "job": run.job_key, "state": run.state, "trigger": run.trigger,
                     "deployment": run.deployment, "params": run.params, "created_at": run.created_at,
                     "started_at": run.started_at, "ended_at": run.ended_at, "message": run.message,
                     "tasks": tasks, "attempts": attempts})
    if args.output == "json":
        out(json.dumps(rows, indent=2, default=str))
        return 0
    # DEPLOYMENT: what the run runs now (a hot redeploy moves it without a new attempt).
    out(f"{'RUN':>5}  {'JOB':<24} {'STATE':<10} {'TRIGGER':<10} {'DEPLOYMENT':>10} {'ATTEMPTS':>8}  {'ROWS':>10}  "
         f"{'EPOCHS':>6}  {'STARTED':<19}  MESSAGE")
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started_at"])) if row["started_at"] else "-"
        figures = _latest_figures(row["attempts"])
        rows_out = f"{figures['rows_to_sinks']:,}" if figures else "-"
        epochs = str(figures["checkpoint"]["epochs_succeeded"]) if figures else "-"
        out(f"{row['run_id']:>5}  {row['job']:<24} {row['state']:<10} {row['trigger']:<10} {row['deployment']:>10} "
             f"{len(row['attempts']):>8}  {rows_out:>10}  {epochs:>6}  {started:<19}  {row['message'] or ''}")
        for task in row["tasks"]:
            for it in task.get("iterations", []):
                name = f"{task['task_key']}[{it['index']}]"
                out(f"{it['run_id']:>5}    └ {name:<20} {it['state']:<10} input {it['input']}"
                     + (f": {it['message']}" if it["message"] and it["state"] != "succeeded" else ""))
    return 0


def _iterations(store: Any, run_id: int, task_key: str) -> list[dict[str, Any]]:
    """A for-each task's iterations in input order: each ran as a run of the task's hidden job."""
    from streamling.bundle.control_flow import ITERATION_INDEX, ITERATION_INPUT

    found: list[dict[str, Any]] = []
    for child in reversed(store.child_runs(run_id, task_key)):  # oldest first: the order they started
        run = store.run(child["id"])
        if run is None or run.trigger != "for_each":
            continue
        found.append({"run_id": run.id, "index": int(run.params.get(ITERATION_INDEX, len(found))),
                      "input": run.params.get(ITERATION_INPUT), "state": run.state, "message": run.message})
    return sorted(found, key=lambda it: it["index"])


def run_figures(log_path: str, ws: Workspace) -> dict[str, Any] | None:
    """What a task attempt's driver reported about its run (the same ``RunStats`` its admin API serves)."""
    try:
        data = json.loads(ws.read_log(log_path, ".stats.json") or "")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _latest_figures(attempts: list[dict[str, Any]]) -> dict[str, Any] | None:
    for attempt in reversed(attempts):
        if attempt.get("figures"):
            return attempt["figures"]  # type: ignore[no-any-return]
    return None


def cmd_logs(args: argparse.Namespace) -> int:
    from streamling.bundle.workspace import Workspace

    bundle = target_bundle(args)
    ws = Workspace.for_target(bundle.target)
    store = ws.open_store()
    attempts = [a for a in store.attempts(args.run_id) if (not args.task or a["task_key"] == args.task)
                and (not args.attempt or a["number"] == args.attempt)]
    if not attempts:
        raise StreamlingError(f"run {args.run_id} has no attempt{' of task ' + args.task if args.task else ''} yet",
                              code="bundle_no_logs", hint="list runs with `streamling bundle runs`")
    for attempt in attempts:
        out(f"=== run {args.run_id} · task {attempt['task_key']} · attempt {attempt['number']} · {attempt['state']}")
        text = ws.read_log(attempt["log_path"])
        out("(no log)" if text is None else text)
    if args.follow:
        path, offset = Path(attempts[-1]["log_path"]), Path(attempts[-1]["log_path"]).stat().st_size
        while True:
            run = store.run(args.run_id)
            with open(path, errors="replace") as handle:
                handle.seek(offset)
                chunk = handle.read()
                offset = handle.tell()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
            if run is None or not run.active:
                return 0
            time.sleep(0.5)
    return 0
