"""``streamling bundle validate|deploy|run|summary|destroy|runs|logs|cancel|runner`` — the Databricks CLI's verbs.

The bundle is found from the working directory upwards (or ``STREAMLING_BUNDLE_ROOT``). Errors
go to stderr, one line per problem with file and line; results go to stdout (``-o json`` where
Databricks has it). Exit codes: 0 success, 1 invalid bundle / failed run, 2 internal error.
The commands that only read (``summary``, ``runs``, ``logs``) are ``streamling.bundle.cli_reports``;
what every command starts from (the bundle of ``--target``, stdout), ``streamling.bundle.cli_context``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from streamling.bundle.cli_context import kv, out, target_bundle
from streamling.bundle.cli_reports import cmd_logs, cmd_runs, cmd_summary
from streamling.errors import StreamlingError, ValidationError


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


def cmd_validate(args: argparse.Namespace) -> int:
    from streamling.bundle.task_build import build

    bundle = target_bundle(args)
    builds = build(bundle)
    warnings = list(bundle.warnings) + [w for tasks in builds.values() for tb in tasks.values()
                                        if tb.compiled is not None for w in tb.compiled.warnings]
    if args.output == "json":
        out(json.dumps({**bundle.to_json(), "warnings": warnings}, indent=2, default=str))
    else:
        for w in warnings:
            sys.stderr.write(f"Warning: {w}\n")
        tasks = sum(len(t) for t in builds.values())
        out(f"Name: {bundle.name}\nTarget: {bundle.target.name}\nRoot: {bundle.target.root_path}\n"
             f"Validation OK: {len(builds)} jobs, {tasks} tasks")
    return 1 if args.strict and warnings else 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from streamling.bundle.deploy import deploy
    from streamling.bundle.runner_start import ensure_runner
    from streamling.bundle.workspace import Workspace

    bundle = target_bundle(args)
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
        out(f"Deployment {result.version} is up to date: nothing changed, running jobs left untouched.")
    else:
        out(f"Deployed version {result.version} of '{bundle.name}' to target '{bundle.target.name}' "
             f"({ws.where}) in {time.monotonic() - started:.1f}s")
        for key in result.added:
            out(f"  + {key}")
        for key, tasks in result.changed.items():
            note = f"; run {active[key]} moves to it after its current epoch" if key in active else ""
            out(f"  ~ {key} (changed: {', '.join(tasks)}{note})")
        for key in result.unchanged:
            out(f"  = {key} (unchanged{'; run ' + str(active[key]) + ' keeps running' if key in active else ''})")
        for key in result.removed:
            out(f"  - {key}{' (its run is cancelled)' if key in active else ''}")
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

    bundle = target_bundle(args)
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
    params = kv(args.param, "--param")
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
    out(f"Run {run_id} of job '{args.job}' created (logs: streamling bundle logs {run_id})")
    if args.no_wait:
        return 0
    continuous = bool(deployment["jobs"][args.job].get("continuous"))
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    last = None
    while True:
        run = store.run(run_id)
        assert run is not None
        if run.state != last:
            out(f"Run {run_id}: {run.state}")
            last = run.state
        if not run.active:
            break
        if continuous and run.state == "running":
            out(f"Run {run_id} is a continuous job: it keeps running (cancel with `streamling bundle cancel "
                 f"{run_id}`)")
            return 0
        if deadline is not None and time.monotonic() > deadline:
            out(f"Run {run_id} still {run.state} after {args.timeout:g}s; it goes on")
            return 0
        time.sleep(0.5)
    if run.state != "succeeded":
        sys.stderr.write(f"Error: run {run_id} {run.state}: {run.message}\n")
        return 1
    return 0


def cmd_destroy(args: argparse.Namespace) -> int:
    from streamling.bundle.runner_start import ensure_runner, runner_running
    from streamling.bundle.workspace import Workspace

    bundle = target_bundle(args)
    ws = Workspace.for_target(bundle.target)
    if not ws.root.exists() or (ws.uri and ws.deployment() is None):
        out(f"Nothing to destroy at {ws.where}")
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
    out(f"Destroyed target '{bundle.target.name}': {ws.where} deleted ({len(active)} runs cancelled)")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from streamling.bundle.runner_start import ensure_runner
    from streamling.bundle.workspace import Workspace

    if (args.run_id is None) == (args.job is None):
        raise StreamlingError("give a RUN_ID or --job JOB", code="bundle_usage")
    bundle = target_bundle(args)
    ws = Workspace.for_target(bundle.target)
    store = ws.open_store()
    ensure_runner(ws, store=store)
    if args.job:
        result = _wait_request(ws, store, store.request("cancel_job", job_key=args.job))
        out(f"Cancelling runs {result.get('cancelled')} of job '{args.job}' (each stops after its current epoch)")
    else:
        result = _wait_request(ws, store, store.request("cancel", run_id=args.run_id))
        out(f"Cancelling run {args.run_id} (it stops after its current epoch)" if result.get("cancelled") else
             f"Run {args.run_id} is not active")
    return 0


def cmd_runner(args: argparse.Namespace) -> int:
    from streamling.bundle.runner import main as runner_main
    from streamling.bundle.workspace import Workspace

    return runner_main([str(Workspace.for_target(target_bundle(args).target).root)])


def cmd_secrets(args: argparse.Namespace) -> int:
    """Secret values go in and never come out: put, delete and list names only."""
    import base64

    from streamling.bundle.workspace import Workspace
    from streamling.secrets import SecretStore

    ws = Workspace.for_target(target_bundle(args).target)
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
        out("\n".join(store.keys(args.scope)))
    elif args.action == "create-scope":
        if not store.create_scope(args.scope):
            raise StreamlingError(f"secret scope '{args.scope}' exists already", code="secret_scope_exists")
    elif args.action == "delete-scope":
        store.delete_scope(args.scope)
    else:
        out("\n".join(store.scopes()))
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
