"""``streamling bundle validate|deploy|run|summary|destroy|runs|logs|cancel|runner`` — the Databricks CLI's verbs.

The bundle is found from the working directory upwards (or ``STREAMLING_BUNDLE_ROOT``). Errors
go to stderr, one line per problem with file and line; results go to stdout (``-o json`` where
Databricks has it). Exit codes: 0 success, 1 invalid bundle / failed run, 2 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.errors import StreamlingError, ValidationError

if TYPE_CHECKING:
    from streamling.bundle.workspace import Workspace


def _kv(items: Sequence[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StreamlingError(f"{what} '{item}' is not NAME=VALUE", code="bundle_usage",
                                  hint=f"e.g. {what} threshold=900")
        out[key.strip()] = value
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamling bundle", description="Deploy notebooks and pipelines as jobs.")
    sub = p.add_subparsers(dest="verb", required=True)

    def common(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument("-t", "--target", help="target name (default: the target marked default)")
        q.add_argument("--var", action="append", default=[], help="set a bundle variable: NAME=VALUE")
        return q

    v = common(sub.add_parser("validate", help="check the bundle, every notebook and pipeline"))
    v.add_argument("-o", "--output", choices=["text", "json"], default="text")
    v.add_argument("--strict", action="store_true", help="fail on warnings too")
    d = common(sub.add_parser("deploy", help="validate, then deploy a new version and move running jobs onto it"))
    d.add_argument("--force", action="store_true", help="production: deploy even with uncommitted changes")
    d.add_argument("--force-lock", action="store_true", help="wait for another deploy's lock instead of failing")
    r = common(sub.add_parser("run", help="run a deployed job"))
    r.add_argument("job")
    r.add_argument("--param", action="append", default=[], help="job parameter for this run: NAME=VALUE")
    r.add_argument("--no-wait", action="store_true", help="return once the run is created")
    r.add_argument("--restart", action="store_true", help="cancel the job's active runs first")
    r.add_argument("--timeout", type=float, default=None, help="stop waiting after SECONDS (the run goes on)")
    s = common(sub.add_parser("summary", help="what is deployed, what runs, what differs from the working copy"))
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    x = common(sub.add_parser("destroy", help="cancel every run and delete the target's deployments and state"))
    x.add_argument("--auto-approve", action="store_true")
    lr = common(sub.add_parser("runs", help="recent runs"))
    lr.add_argument("job", nargs="?")
    lr.add_argument("-o", "--output", choices=["text", "json"], default="text")
    lr.add_argument("--limit", type=int, default=20)
    lg = common(sub.add_parser("logs", help="a run's driver log"))
    lg.add_argument("run_id", type=int)
    lg.add_argument("--task")
    lg.add_argument("--attempt", type=int)
    lg.add_argument("-f", "--follow", action="store_true")
    c = common(sub.add_parser("cancel", help="cancel a run (or every active run of --job)"))
    c.add_argument("run_id", type=int, nargs="?")
    c.add_argument("--job")
    common(sub.add_parser("runner", help="run the job runner in the foreground (e.g. under systemd)"))
    sc = common(sub.add_parser("secrets", help="the target's secret scopes, as `databricks secrets` manages them"))
    sc.add_argument("action", choices=["put-secret", "list-secrets", "delete-secret", "list-scopes", "create-scope",
                                       "delete-scope"])
    sc.add_argument("scope", nargs="?")
    sc.add_argument("key", nargs="?")
    sc.add_argument("--string-value", help="the value (default: read from stdin)")
    sc.add_argument("--bytes-value", help="the value as base64")
    return p


def _bundle(args: argparse.Namespace) -> Any:
    from streamling.bundle.loading import load_bundle
    from streamling.bundle.model import find_bundle_root

    if not os.environ.get("STREAMLING_BUNDLE_ROOT"):
        try:
            here = Path.cwd()
        except FileNotFoundError:
            raise StreamlingError(
                "bundle: the current folder no longer exists (deleted or moved)", code="bundle_missing",
                hint="cd into the bundle's folder again (the one with bundle.yml or databricks.yml)") from None
    root = Path(os.environ.get("STREAMLING_BUNDLE_ROOT") or find_bundle_root(here))
    return load_bundle(root, target=args.target, variables=_kv(args.var, "--var"))


def _out(text: str) -> None:
    sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    sys.stdout.flush()


def cmd_validate(args: argparse.Namespace) -> int:
    from streamling.bundle.deploy import build

    bundle = _bundle(args)
    builds = build(bundle)
    warnings = list(bundle.warnings) + [w for tasks in builds.values() for tb in tasks.values()
                                        if tb.compiled is not None for w in tb.compiled.warnings]
    if args.output == "json":
        _out(json.dumps({**bundle.to_json(), "warnings": warnings}, indent=2, default=str))
    else:
        for w in warnings:
            sys.stderr.write(f"Warning: {w}\n")
        tasks = sum(len(t) for t in builds.values())
        _out(f"Name: {bundle.name}\nTarget: {bundle.target.name}\nRoot: {bundle.target.root_path}\n"
             f"Validation OK: {len(builds)} jobs, {tasks} tasks")
    return 1 if args.strict and warnings else 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from streamling.bundle.deploy import deploy
    from streamling.bundle.runner_start import ensure_runner
    from streamling.bundle.workspace import Workspace

    bundle = _bundle(args)
    started = time.monotonic()
    try:
        result = deploy(bundle, force=args.force, force_lock=args.force_lock)
    finally:  # the bundle's and its tasks' (added while they are built), whether or not it deployed
        for w in bundle.warnings:
            sys.stderr.write(f"Warning: {w}\n")
    ws = Workspace.for_target(bundle.target)
    store = ws.open_store()
    active = {r.job_key: r.id for r in store.runs(active_only=True, limit=1000)}
    if result.skipped:
        _out(f"Deployment {result.version} is up to date: nothing changed, running jobs left untouched.")
    else:
        _out(f"Deployed version {result.version} of '{bundle.name}' to target '{bundle.target.name}' "
             f"({ws.where}) in {time.monotonic() - started:.1f}s")
        for key in result.added:
            _out(f"  + {key}")
        for key, tasks in result.changed.items():
            note = f"; run {active[key]} moves to it after its current epoch" if key in active else ""
            _out(f"  ~ {key} (changed: {', '.join(tasks)}{note})")
        for key in result.unchanged:
            _out(f"  = {key} (unchanged{'; run ' + str(active[key]) + ' keeps running' if key in active else ''})")
        for key in result.removed:
            _out(f"  - {key}{' (its run is cancelled)' if key in active else ''}")
    ensure_runner(ws, store=store)
    store.close()
    return 0


def _wait_request(ws: Any, store: Any, request_id: int, timeout: float = 60) -> dict[str, Any]:
    """The runner's answer to a request; a runner that exited idle just before it was filed is restarted."""
    from streamling.bundle.runner_start import ensure_runner, runner_running

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = store.request_result(request_id)
        if result is not None:
            return dict(result)
        if not runner_running(ws, store):
            ensure_runner(ws, store=store)
        time.sleep(0.1)
    raise StreamlingError("the job runner did not answer", code="bundle_runner", user=False,
                          hint="see runner.log under the target root")


def cmd_run(args: argparse.Namespace) -> int:
    from streamling.bundle.deploy import deploy
    from streamling.bundle.runner_start import ensure_runner
    from streamling.bundle.workspace import Workspace

    bundle = _bundle(args)
    ws = Workspace.for_target(bundle.target)
    if ws.current_version() is None:
        raise StreamlingError(f"target '{bundle.target.name}' has no deployment yet", code="bundle_not_deployed",
                              hint="run `streamling bundle deploy` first")
    if args.var:  # run-time variables apply to this run: deploy what they resolve to (a no-op when equal)
        deploy(bundle)
    deployment = ws.deployment() or {}
    if args.job not in deployment.get("jobs", {}):
        from streamling.util import did_you_mean

        jobs = list(deployment.get("jobs", {}))
        raise StreamlingError(f"job '{args.job}' is not deployed to target '{bundle.target.name}'"
                              f"{did_you_mean(args.job, jobs)}", code="bundle_unknown_job",
                              hint=f"deployed jobs: {', '.join(jobs) or 'none'}")
    params = _kv(args.param, "--param")
    store = ws.open_store()
    ensure_runner(ws, store=store)
    if args.restart:
        _wait_request(ws, store, store.request("cancel_job", job_key=args.job))
        cancel_deadline = time.monotonic() + 60
        while store.runs(args.job, active_only=True, limit=1) and time.monotonic() < cancel_deadline:
            time.sleep(0.2)
    result = _wait_request(ws, store, store.request("run", job_key=args.job, params=params))
    if "error" in result:
        raise StreamlingError(str(result["error"]), code="bundle_run")
    run_id = int(result["run_id"])
    _out(f"Run {run_id} of job '{args.job}' created (logs: streamling bundle logs {run_id})")
    if args.no_wait:
        return 0
    continuous = bool(deployment["jobs"][args.job].get("continuous"))
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    last = None
    while True:
        run = store.run(run_id)
        assert run is not None
        if run.state != last:
            _out(f"Run {run_id}: {run.state}")
            last = run.state
        if not run.active:
            break
        if continuous and run.state == "running":
            _out(f"Run {run_id} is a continuous job: it keeps running (cancel with `streamling bundle cancel "
                 f"{run_id}`)")
            return 0
        if deadline is not None and time.monotonic() > deadline:
            _out(f"Run {run_id} still {run.state} after {args.timeout:g}s; it goes on")
            return 0
        time.sleep(0.5)
    if run.state != "succeeded":
        sys.stderr.write(f"Error: run {run_id} {run.state}: {run.message}\n")
        return 1
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from streamling.bundle.deploy import build
    from streamling.bundle.warm_drivers import pool_state, standby_state
    from streamling.bundle.workspace import Workspace

    bundle = _bundle(args)
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
        _out(json.dumps(summary, indent=2, default=str))
        return 0
    dep = summary["deployment"]
    _out(f"Name: {bundle.name}\nTarget: {bundle.target.name}\nRoot: {ws.where}\n"
         + (f"Deployment: version {dep['version']} by {dep['user']} at {dep['deployed_at']}"
            + (f" (git {str(dep['git'].get('commit', ''))[:10]})" if dep.get("git") else "") if dep else
            "Deployment: none") + f"\nRunner: {summary['runner']}"
         + (f"\nWarm drivers: {', '.join(summary['warm_drivers'])}" if summary["warm_drivers"] else "") + "\nJobs:")
    for key, info in jobs.items():
        if "name" not in info:
            _out(f"  {key}: {info['working_copy']}")
            continue
        last = info.get("last_run")
        figures = (last or {}).get("figures")
        shown = (f" ({figures['rows_to_sinks']:,} rows to sinks, {figures['checkpoint']['epochs_succeeded']} epochs"
                 + (f", {figures['admin_api']}" if figures.get("admin_api") else "") + ")") if figures else ""
        _out(f"  {key}: {info.get('name', '')} · {info.get('trigger', '-')} {info.get('pause_status') or ''} · "
             f"last run {str(last['id']) + ' ' + last['state'] + shown if last else '-'} · {info['working_copy']}")
        if info.get("on_redeploy"):
            _out("    on redeploy: " + ", ".join(f"{task} {what}" for task, what in info["on_redeploy"].items()))
        if info.get("standby"):
            _out("    warm standby: " + ", ".join(f"{task} {state}" for task, state in info["standby"].items()))
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


def cmd_destroy(args: argparse.Namespace) -> int:
    from streamling.bundle.runner_start import ensure_runner, runner_running
    from streamling.bundle.workspace import Workspace

    bundle = _bundle(args)
    ws = Workspace.for_target(bundle.target)
    if not ws.root.exists() or (ws.uri and ws.deployment() is None):
        _out(f"Nothing to destroy at {ws.where}")
        return 0
    if not args.auto_approve:
        if not sys.stdin.isatty():
            raise StreamlingError("destroy deletes every deployment, checkpoint and run log of target "
                                  f"'{bundle.target.name}' ({ws.where})", code="bundle_confirm",
                                  hint="pass --auto-approve to confirm")
        answer = input(f"Delete everything under {ws.where} (deployments, checkpoints, run logs)? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    store = ws.open_store()
    active = store.runs(active_only=True, limit=1000)
    if active:
        ensure_runner(ws, store=store)
        # one request: the runner cancels every run and starts none after (a continuous job's next run)
        _wait_request(ws, store, store.request("drain"))
        deadline = time.monotonic() + 60
        while store.runs(active_only=True, limit=1) and time.monotonic() < deadline:
            time.sleep(0.2)
    if runner_running(ws, store):
        _wait_request(ws, store, store.request("shutdown"))
        deadline = time.monotonic() + 30
        while runner_running(ws, store) and time.monotonic() < deadline:
            time.sleep(0.1)
    store.destroy()
    store.close()
    ws.destroy()
    _out(f"Destroyed target '{bundle.target.name}': {ws.where} deleted ({len(active)} runs cancelled)")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from streamling.bundle.workspace import Workspace

    bundle = _bundle(args)
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
        _out(json.dumps(rows, indent=2, default=str))
        return 0
    # DEPLOYMENT: what the run runs now (a hot redeploy moves it without a new attempt).
    _out(f"{'RUN':>5}  {'JOB':<24} {'STATE':<10} {'TRIGGER':<10} {'DEPLOYMENT':>10} {'ATTEMPTS':>8}  {'ROWS':>10}  "
         f"{'EPOCHS':>6}  {'STARTED':<19}  MESSAGE")
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started_at"])) if row["started_at"] else "-"
        figures = _latest_figures(row["attempts"])
        rows_out = f"{figures['rows_to_sinks']:,}" if figures else "-"
        epochs = str(figures["checkpoint"]["epochs_succeeded"]) if figures else "-"
        _out(f"{row['run_id']:>5}  {row['job']:<24} {row['state']:<10} {row['trigger']:<10} {row['deployment']:>10} "
             f"{len(row['attempts']):>8}  {rows_out:>10}  {epochs:>6}  {started:<19}  {row['message'] or ''}")
        for task in row["tasks"]:
            for it in task.get("iterations", []):
                name = f"{task['task_key']}[{it['index']}]"
                _out(f"{it['run_id']:>5}    └ {name:<20} {it['state']:<10} input {it['input']}"
                     + (f": {it['message']}" if it["message"] and it["state"] != "succeeded" else ""))
    return 0


def _iterations(store: Any, run_id: int, task_key: str) -> list[dict[str, Any]]:
    """A for-each task's iterations in input order: each ran as a run of the task's hidden job."""
    from streamling.bundle.control_flow import ITERATION_INDEX, ITERATION_INPUT

    out: list[dict[str, Any]] = []
    for child in reversed(store.child_runs(run_id, task_key)):  # oldest first: the order they started
        run = store.run(child["id"])
        if run is None or run.trigger != "for_each":
            continue
        out.append({"run_id": run.id, "index": int(run.params.get(ITERATION_INDEX, len(out))),
                    "input": run.params.get(ITERATION_INPUT), "state": run.state, "message": run.message})
    return sorted(out, key=lambda it: it["index"])


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

    bundle = _bundle(args)
    ws = Workspace.for_target(bundle.target)
    store = ws.open_store()
    attempts = [a for a in store.attempts(args.run_id) if (not args.task or a["task_key"] == args.task)
                and (not args.attempt or a["number"] == args.attempt)]
    if not attempts:
        raise StreamlingError(f"run {args.run_id} has no attempt{' of task ' + args.task if args.task else ''} yet",
                              code="bundle_no_logs", hint="list runs with `streamling bundle runs`")
    for attempt in attempts:
        _out(f"=== run {args.run_id} · task {attempt['task_key']} · attempt {attempt['number']} · {attempt['state']}")
        text = ws.read_log(attempt["log_path"])
        _out("(no log)" if text is None else text)
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


def cmd_cancel(args: argparse.Namespace) -> int:
    from streamling.bundle.runner_start import ensure_runner
    from streamling.bundle.workspace import Workspace

    if (args.run_id is None) == (args.job is None):
        raise StreamlingError("give a RUN_ID or --job JOB", code="bundle_usage")
    bundle = _bundle(args)
    ws = Workspace.for_target(bundle.target)
    store = ws.open_store()
    ensure_runner(ws, store=store)
    if args.job:
        result = _wait_request(ws, store, store.request("cancel_job", job_key=args.job))
        _out(f"Cancelling runs {result.get('cancelled')} of job '{args.job}' (each stops after its current epoch)")
    else:
        result = _wait_request(ws, store, store.request("cancel", run_id=args.run_id))
        _out(f"Cancelling run {args.run_id} (it stops after its current epoch)" if result.get("cancelled") else
             f"Run {args.run_id} is not active")
    return 0


def cmd_runner(args: argparse.Namespace) -> int:
    from streamling.bundle.runner import main as runner_main
    from streamling.bundle.workspace import Workspace

    return runner_main([str(Workspace.for_target(_bundle(args).target).root)])


def cmd_secrets(args: argparse.Namespace) -> int:
    """Secret values go in and never come out: put, delete and list names only."""
    import base64

    from streamling.bundle.workspace import Workspace
    from streamling.secrets import SecretStore

    ws = Workspace.for_target(_bundle(args).target)
    ws.pull_secrets()
    store = SecretStore(ws.secrets)
    needs = {"put-secret": 2, "delete-secret": 2, "list-secrets": 1, "create-scope": 1, "delete-scope": 1,
             "list-scopes": 0}[args.action]
    given = [a for a in (args.scope, args.key) if a]
    if len(given) != needs:
        raise StreamlingError(f"`secrets {args.action}` takes {['no arguments', 'SCOPE', 'SCOPE KEY'][needs]}",
                              code="bundle_usage")
    if args.action == "put-secret":
        if args.bytes_value is not None:
            base64.b64decode(args.bytes_value, validate=True)
            value = f"base64:{args.bytes_value}"
        else:
            value = args.string_value if args.string_value is not None else sys.stdin.read().removesuffix("\n")
        store.put(args.scope, args.key, value)
    elif args.action == "delete-secret":
        store.delete(args.scope, args.key)
    elif args.action == "list-secrets":
        _out("\n".join(store.keys(args.scope)))
    elif args.action == "create-scope":
        if not store.create_scope(args.scope):
            raise StreamlingError(f"secret scope '{args.scope}' exists already", code="secret_scope_exists")
    elif args.action == "delete-scope":
        store.delete_scope(args.scope)
    else:
        _out("\n".join(store.scopes()))
    if args.action in ("put-secret", "delete-secret", "create-scope", "delete-scope"):
        ws.push_secrets()
    return 0


COMMANDS = {"validate": cmd_validate, "deploy": cmd_deploy, "run": cmd_run, "summary": cmd_summary,
            "destroy": cmd_destroy, "runs": cmd_runs, "logs": cmd_logs, "cancel": cmd_cancel, "runner": cmd_runner,
            "secrets": cmd_secrets}


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        return COMMANDS[args.verb](args)
    except ValidationError as exc:
        for problem in exc.problems:
            sys.stderr.write(f"Error: {problem.headline()}\n")
            for context in problem.context:
                sys.stderr.write(f"  while {context}\n")
        sys.stderr.write(f"Found {len(exc.problems)} error{'s' if len(exc.problems) != 1 else ''}\n")
        return 1
    except StreamlingError as exc:
        sys.stderr.write(f"Error: {exc.headline()}\n")
        return 1 if exc.user else 2
    except KeyboardInterrupt:
        return 130
