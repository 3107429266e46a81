"""``bundle validate`` and ``bundle deploy``: check everything, then write one immutable deployment.

A notebook task is compiled into the pipeline its ``%%streamling`` cells build (job parameters
at their defaults) and validated like a pipeline file. Nothing under the target root changes
unless every job of the bundle is valid. A deployment is a numbered folder that is never edited
afterwards; ``current`` names the live one, and the job runner moves running jobs onto it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from streamling.bundle.cron import QuartzSchedule
from streamling.bundle.model import Bundle, Job, Task
from streamling.bundle.workspace import Workspace
from streamling.errors import Location, StreamlingError, ValidationError

if TYPE_CHECKING:
    from streamling.bundle.compile import CompiledNotebook
    from streamling.config.settings import JobRunnerSettings

log = logging.getLogger(__name__)


def task_parameters(job: Job | Mapping[str, Any], task: Task | Mapping[str, Any],
                    run_params: Mapping[str, str] | None = None) -> dict[str, str]:
    """Databricks' order: task ``base_parameters`` < job ``parameters`` defaults < run-now values."""
    job_params = job.parameters if isinstance(job, Job) else job.get("parameters", {})
    base = task.base_parameters if isinstance(task, Task) else task.get("base_parameters", {})
    return {**{k: str(v) for k, v in base.items()}, **{k: str(v) for k, v in job_params.items()},
            **{k: str(v) for k, v in (run_params or {}).items()}}


def default_application_id(bundle: str, job: str, task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", f"{bundle}_{job}_{task}").strip("_").lower()


@dataclass
class TaskBuild:
    """One task as it will be deployed: compiled pipeline (notebook tasks) and its fingerprint."""

    job: Job
    task: Task
    compiled: CompiledNotebook | None = None
    application_id: str | None = None

    @functools.cached_property
    def pipeline_yaml(self) -> str | None:
        """The compiled pipeline as deployed (dumped once: the fingerprint and the file use the same text)."""
        return self.compiled.to_yaml() if self.compiled is not None else None

    def record(self, bundle: Bundle) -> dict[str, Any]:
        """What the deployment stores for the task; its fingerprint decides restarts on redeploy."""
        out: dict[str, Any] = {
            "task_key": self.task.key, "kind": self.task.kind, "depends_on": list(self.task.depends_on),
            "base_parameters": dict(self.task.base_parameters), "parameters": list(self.task.parameters),
            "max_retries": self.task.max_retries, "min_retry_interval_millis": self.task.min_retry_interval_millis,
            "retry_on_timeout": self.task.retry_on_timeout, "timeout_seconds": self.task.timeout_seconds,
            "python_file": _rel(self.task.python_file, bundle.root), "package_name": self.task.package_name,
            "entry_point": self.task.entry_point, "notebook_path": _rel(self.task.notebook_path, bundle.root),
        }
        # only when set: the fingerprints of tasks that use none stay as they were
        if self.task.condition is not None:
            out["condition"] = dict(self.task.condition)
        if self.task.outcomes:
            out["outcomes"] = dict(self.task.outcomes)
        if self.task.run_if != "ALL_SUCCESS":
            out["run_if"] = self.task.run_if
        if self.task.sql_file is not None:
            out["sql_file"] = _rel(self.task.sql_file, bundle.root)
        if self.task.run_job is not None:
            out["run_job"] = {"job": self.task.run_job, "parameters": dict(self.task.job_parameters)}
        if self.task.libraries:  # the environment's content: a changed wheel changes the fingerprint
            from streamling.bundle.environments import content_key

            out["libraries"] = list(self.task.libraries)
            out["environment"] = content_key(self.task.libraries)
        if self.task.spark_conf:
            out["spark_conf"] = dict(self.task.spark_conf)
        if self.task.spark_env_vars:
            out["spark_env_vars"] = dict(self.task.spark_env_vars)
        if self.task.pipeline is not None:
            out["pipeline"] = {"id": self.task.pipeline, "full_refresh": self.task.full_refresh}
        if self.task.for_each is not None:
            out["for_each"] = {"inputs": self.task.for_each.inputs, "concurrency": self.task.for_each.concurrency,
                               "job": self.task.for_each.job}
        if self.compiled is not None:
            out.update(application_id=self.application_id, config_name=self.compiled.config_name,
                       run=self.compiled.run, declared_parameters=self.compiled.parameters,
                       sources=self.compiled.document.get("sources") or {})
            if self.compiled.executes:  # its driver runs the notebook's cells (and restarts on redeploy)
                out["executes"] = True
        # What the task runs: the compiled pipeline, or the content of the files a plain task is given
        # (a notebook whose cells run: the notebook and those it includes).
        files = [self.task.python_file] if self.task.python_file else [self.task.sql_file] if self.task.sql_file \
            else [Path(p) for p in self.task.parameters if p.startswith("/") and Path(p).is_file()]
        if self.compiled is not None and self.compiled.executes:
            files = [self.compiled.path, *self.compiled.includes]
        identity = {**out, "pipeline": self.pipeline_yaml, "config": bundle.target.config,
                    "files": {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f and f.is_file()}}
        out["fingerprint"] = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return out


def _rel(path: Path | None, root: Path) -> str | None:
    if path is None:
        return None
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def build(bundle: Bundle) -> dict[str, dict[str, TaskBuild]]:
    """Compile every notebook task and check schedules; all problems of all jobs at once."""
    from streamling.bundle.compile import compile_notebook

    problems: list[StreamlingError] = []
    builds: dict[str, dict[str, TaskBuild]] = {}
    defaults = _state_defaults(bundle)
    for job in bundle.jobs.values():
        if job.schedule is not None:
            try:
                QuartzSchedule(job.schedule.quartz_cron_expression, job.schedule.timezone_id)
            except StreamlingError as exc:
                exc.location = Location(f"{job.source}: resources.jobs.{job.key}.schedule")
                problems.append(exc)
        builds[job.key] = {}
        for task in job.tasks:
            tb = TaskBuild(job, task)
            builds[job.key][task.key] = tb
            if task.kind != "notebook" or task.notebook_path is None:
                continue
            try:
                tb.compiled = compile_notebook(task.notebook_path, task_parameters(job, task))
            except ValidationError as exc:
                for p in exc.problems:
                    p.add_context(f"compiling task '{task.key}' of job '{job.key}'")
                problems.extend(exc.problems)
                continue
            except StreamlingError as exc:
                problems.append(exc.add_context(f"compiling task '{task.key}' of job '{job.key}'"))
                continue
            tb.application_id = tb.compiled.application_id or str(
                bundle.target.config.get("application_id") or default_application_id(bundle.name, job.key, task.key))
            problems.extend(_cluster_problems(bundle, tb))
            if (warning := _state_warning(bundle, tb, defaults)) and warning not in bundle.warnings:
                bundle.warnings.append(warning)
    if problems:
        raise ValidationError(problems)
    return builds


def _cluster_problems(bundle: Bundle, tb: TaskBuild) -> list[StreamlingError]:
    """On a target whose master spans hosts: what the task's driver would refuse at start (paths each
    host would resolve on its own disk, the SQLite state backend), found at deploy instead, before
    anything changes. The task's settings are the target's, as its driver loads them."""
    from streamling import storage
    from streamling.config import load_settings
    from streamling.runtime.planner import build_plan
    from streamling.spec import parse_pipeline

    master = str((bundle.target.config.get("spark") or {}).get("master") or "")
    notebook = tb.task.notebook_path
    if tb.compiled is None or notebook is None or not storage.is_multi_host(master):
        return []
    where = f"task '{tb.task.key}' of job '{tb.job.key}' on target '{bundle.target.name}'"
    overrides = {**bundle.target.config, "application_id": tb.application_id}
    overrides.setdefault("state_dir", Workspace.for_target(bundle.target).state_dir)
    try:
        settings = load_settings(tb.compiled.config_name, cwd=notebook.parent, overrides=overrides)
        build_plan(parse_pipeline(tb.compiled.to_yaml(), source=notebook.name), settings, dry_run=True)
    except ValidationError as exc:
        return [p.add_context(f"checking {where} for a cluster of several hosts") for p in exc.problems]
    except StreamlingError as exc:
        return [exc.add_context(f"checking {where} for a cluster of several hosts")]
    return []


def _state_defaults(bundle: Bundle) -> dict[str, str]:
    """The deployment-defaults variable the target's drivers get (``task_definition.state_defaults``), once
    per build."""
    from streamling.bundle.workspace import default_state_backend
    from streamling.config.settings import DEPLOYMENT_DEFAULTS_ENV

    config = bundle.target.config
    state_dir = str(config.get("state_dir") or Workspace.for_target(bundle.target).state_dir)
    backend = default_state_backend(state_dir, str((config.get("spark") or {}).get("master") or ""),
                                    runner_settings(bundle)[0])
    return {DEPLOYMENT_DEFAULTS_ENV: json.dumps({"state_backend": backend})} if backend else {}


def _state_warning(bundle: Bundle, tb: TaskBuild, defaults: dict[str, str]) -> str | None:
    """A continuous job's task whose state backend keeps no position between driver starts (set to
    ``InMemory``, or no durable default at hand) is told so: every restart would read its sources again."""
    from streamling.config import load_settings
    from streamling.state import is_durable

    notebook = tb.task.notebook_path
    if tb.compiled is None or notebook is None or tb.job.continuous is None:
        return None
    config = bundle.target.config
    environ = {**os.environ, **defaults}
    try:
        settings = load_settings(tb.compiled.config_name, environ=environ, cwd=notebook.parent, overrides=config)
    except StreamlingError:
        return None  # its driver reports the configuration's problem
    if is_durable(settings):
        return None
    backend_type = settings.state_backend.backend_type
    return (f"task '{tb.task.key}' of continuous job '{tb.job.key}': state_backend {backend_type} keeps no position "
            "between driver starts, so a retry, a failover or a redeploy that restarts the driver reads its sources "
            "again from their starting_offsets; set state_backend.backend_type: Postgres (or Sqlite on one host) in "
            "the target's config")


def source_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human descriptions of how a task's sources differ: added, removed, or which keys changed."""
    out: list[str] = []
    for name in sorted(set(old) | set(new)):
        if name not in old:
            out.append(f"source '{name}' was added")
        elif name not in new:
            out.append(f"source '{name}' was removed")
        elif old[name] != new[name]:
            a, b = old[name] or {}, new[name] or {}
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            detail = ", ".join(f"{k}: {json.dumps(a.get(k))} → {json.dumps(b.get(k))}" for k in keys)
            out.append(f"source '{name}' was reconfigured ({detail})")
    return out


@dataclass
class DeployResult:
    version: int
    changed: dict[str, list[str]] = field(default_factory=dict)  # job → tasks whose definition changed
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: bool = False  # nothing differed from the live deployment


@contextmanager
def deploy_lock(ws: Workspace, force: bool = False, bundle: Bundle | None = None) -> Iterator[None]:
    """One deploy at a time per target root. An OS lock: it dies with its holder, so no stale locks.
    An object-store root is deployed from any host: the run store's lock serialises those too."""
    ws.root.mkdir(parents=True, exist_ok=True)
    with open(ws.deploy_lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            if not force:
                raise StreamlingError(f"another deploy of this target is in progress ({holder})",
                                      code="bundle_locked", hint="wait for it to finish") from exc
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        handle.flush()
        try:
            if ws.remote is None or bundle is None:
                yield
                return
            from streamling.bundle.store_backends import PostgresStore

            settings, schema = runner_settings(bundle)
            store = PostgresStore(settings, schema)
            try:
                with store.exclusive("deploy", wait=force) as got:
                    if not got:
                        raise StreamlingError(f"another deploy of {ws.where} is in progress on another host",
                                              code="bundle_locked", hint="wait for it to finish")
                    yield
            finally:
                store.close()
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def git_state(root: Path) -> dict[str, Any] | None:
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                                text=True, timeout=10)
        if inside.returncode != 0:
            return None
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        branch = subprocess.run(["git", "-C", str(root), "rev-parse", "--abbrev-ref", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "branch": branch, "dirty": dirty}


def bundle_files(root: Path) -> list[Path]:
    """The files a deploy syncs: git's view (tracked + untracked, .gitignore honoured) or every non-hidden file."""
    try:
        proc = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z", "--", "."],
                              capture_output=True, timeout=30)
        if proc.returncode == 0:
            names = [n for n in proc.stdout.decode().split("\0") if n]
            return sorted(p for p in (root / n for n in names) if p.is_file())
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(p for p in root.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def files_digest(bundle: Bundle) -> str:
    """The bundle's files (names and contents): a deploy that changed only a helper module or a data
    file is a new version, not "up to date" (its tasks' definitions are unchanged, so runs go on)."""
    from streamling.bundle.environments import file_digest

    digest = hashlib.sha256()
    for path in bundle_files(bundle.root):  # a wheel by its members: a rebuild of the same sources is no change
        digest.update(str(path.relative_to(bundle.root)).encode() + b"\0" + file_digest(path))
    return digest.hexdigest()[:16]


def _sync_files(bundle: Bundle, ws: Workspace, previous: list[str]) -> list[str]:
    """Copy the bundle's files to ``workspace.file_path`` in place (running drivers keep their folder)."""
    names: list[str] = []
    for path in bundle_files(bundle.root):
        rel = str(path.relative_to(bundle.root))
        target = ws.files / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        names.append(rel)
    for gone in set(previous) - set(names):
        (ws.files / gone).unlink(missing_ok=True)
    return names


def deploy(bundle: Bundle, force: bool = False, force_lock: bool = False) -> DeployResult:
    """Validate, then write deployment N+1 and make it live. Refuses checkpoint-incompatible changes."""
    builds = build(bundle)
    ws = Workspace.for_target(bundle.target)
    git = git_state(bundle.root)
    if bundle.target.mode == "production" and git and git["dirty"] and not force:
        shown = ", ".join(line[3:] for line in git["dirty"][:5]) + (" …" if len(git["dirty"]) > 5 else "")
        raise StreamlingError(f"target '{bundle.target.name}' is in production mode and the working copy has "
                              f"uncommitted changes ({shown})", code="bundle_dirty",
                              hint="commit them first, or deploy anyway with --force")
    if bundle.artifacts:  # the wheels tasks install; built before the tasks' fingerprints are taken
        from streamling.bundle.environments import build_artifacts

        build_artifacts(bundle.artifacts)
    if ws.remote is not None and ws.uri is not None:  # before anything changes: the store is there and lets us in
        ws.remote.check_root(ws.uri)
    with deploy_lock(ws, force=force_lock, bundle=bundle):
        _check_store(bundle, ws)
        if bundle.secret_scopes:  # declared scopes exist (empty) once deployed; their values are put by hand
            from streamling.secrets import SecretStore

            ws.pull_secrets()
            store = SecretStore(ws.secrets)
            if any([store.create_scope(scope) for scope in bundle.secret_scopes]):
                ws.push_secrets()
        live = ws.deployment()
        jobs: dict[str, Any] = {}
        resolved = bundle.to_json()
        for key, tasks in builds.items():
            job_json = dict(resolved["jobs"][key])
            job_json["tasks"] = [tb.record(bundle) for tb in tasks.values()]
            jobs[key] = job_json
        for job_json in jobs.values():  # each task's environment, built once per content
            for record in job_json["tasks"]:
                if record.get("libraries"):
                    from streamling.bundle.environments import task_python

                    record["python"] = task_python(record["libraries"])
        _refuse_incompatible(ws, live, jobs)
        result = _compare(live, jobs)
        digest = files_digest(bundle)
        if live is not None and not result.changed and not result.added and not result.removed \
                and live.get("target") == bundle.target.name and live.get("config") == bundle.target.config \
                and live.get("files_digest") == digest \
                and _job_settings(live) == _job_settings(json.loads(json.dumps({"jobs": jobs}, default=str))):
            result.version = int(live["version"])
            result.skipped = True
            return result
        version = ws.next_version()
        result.version = version
        tmp = ws.deployments / f".{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "pipelines").mkdir(parents=True)
        for key, tasks in builds.items():
            for tb, record in zip(tasks.values(), jobs[key]["tasks"], strict=True):
                if tb.compiled is not None and tb.task.notebook_path is not None:
                    pipeline = tmp / "pipelines" / key / f"{tb.task.key}.yaml"
                    pipeline.parent.mkdir(parents=True, exist_ok=True)
                    pipeline.write_text(tb.pipeline_yaml or "")
                    snapshot = tmp / "notebooks" / key / tb.task.key / tb.task.notebook_path.name
                    snapshot.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(tb.task.notebook_path, snapshot)
                    record["pipeline_file"] = str(pipeline.relative_to(tmp))
                    record["notebook_snapshot"] = str(snapshot.relative_to(tmp))
        synced = _sync_files(bundle, ws, list((live or {}).get("files", [])))
        record_json = {
            "version": version, "created_at": time.time(), "user": bundle.user,
            "git": {k: v for k, v in (git or {}).items() if k != "dirty"} | {"dirty": bool(git and git["dirty"])},
            "name": bundle.name, "target": bundle.target.name, "mode": bundle.target.mode,
            "root_path": str(ws.root), "file_path": str(ws.files), "state_dir": ws.state_dir,
            "config": bundle.target.config, "jobs": jobs, "files": synced, "files_digest": digest,
            "resolved": resolved,
        }
        (tmp / "deployment.json").write_text(json.dumps(record_json, indent=2, default=str))
        tmp.rename(ws.deployment_dir(version))
        ws.publish(version)
        ws.set_current(version)
    log.info("deployed version %d of bundle '%s' to %s", version, bundle.name, ws.where)
    return result


def runner_settings(bundle: Bundle) -> tuple[JobRunnerSettings, str]:
    """The target's ``job_runner`` settings (environment over config) and its default store schema."""
    from streamling.config.settings import JobRunnerSettings, deep_merge, env_overrides

    settings = JobRunnerSettings.model_validate(deep_merge(dict(bundle.target.config.get("job_runner") or {}),
                                                           env_overrides(os.environ).get("job_runner", {})))
    schema = re.sub(r"[^a-z0-9_]+", "_", f"streamling_runs_{bundle.name}_{bundle.target.name}".lower())[:63]
    return settings, settings.postgres.schema_name or schema


def _check_store(bundle: Bundle, ws: Workspace) -> None:
    """Fix (first deploy) or check the root's run store, and reach it before anything changes."""
    settings, schema = runner_settings(bundle)
    ws.record_store(settings, schema)
    ws.open_store().close()


def _job_settings(deployment: Mapping[str, Any]) -> dict[str, Any]:
    return {k: {n: v for n, v in job.items() if n != "tasks"} for k, job in deployment.get("jobs", {}).items()}


def _compare(live: Mapping[str, Any] | None, jobs: Mapping[str, Any]) -> DeployResult:
    result = DeployResult(version=0)
    old_jobs = (live or {}).get("jobs", {})
    for key, job in jobs.items():
        if key not in old_jobs:
            result.added.append(key)
            continue
        old_tasks = {t["task_key"]: t["fingerprint"] for t in old_jobs[key]["tasks"]}
        changed = [t["task_key"] for t in job["tasks"] if old_tasks.get(t["task_key"]) != t["fingerprint"]]
        changed += [k for k in old_tasks if k not in {t["task_key"] for t in job["tasks"]}]
        if changed:
            result.changed[key] = changed
        else:
            result.unchanged.append(key)
    result.removed = [k for k in old_jobs if k not in jobs]
    return result


def _refuse_incompatible(ws: Workspace, live: Mapping[str, Any] | None, jobs: Mapping[str, Any]) -> None:
    """A task resuming from its checkpoint must keep its sources: refuse, naming the change and the way out."""
    if live is None:
        return
    problems: list[StreamlingError] = []
    for key, job in jobs.items():
        old = {t["task_key"]: t for t in live.get("jobs", {}).get(key, {}).get("tasks", [])}
        for task in job["tasks"]:
            before = old.get(task["task_key"])
            app = task.get("application_id")
            state_dir = (live.get("config") or {}).get("state_dir")
            if before is None or app is None or before.get("application_id") != app \
                    or not ws.has_checkpoint(app, state_dir, key, task["task_key"]):
                continue
            changes = source_changes(before.get("sources") or {}, task.get("sources") or {})
            if changes:
                problems.append(StreamlingError(
                    f"job '{key}' task '{task['task_key']}': {'; '.join(changes)} since deployment "
                    f"{live['version']}; the checkpoint of application_id '{app}' records the old sources' offsets, "
                    "so the new definition cannot resume from it", code="bundle_checkpoint_incompatible",
                    hint=f"deploy it under a new application_id (in the notebook: %config StreamlingMagics."
                         f"application_id = '{app}_v2'); it then reads its sources from their starting offsets"))
    if problems:
        raise ValidationError(problems)


def deployed_pipeline(ws: Workspace, deployment: Mapping[str, Any], job_key: str, task_key: str) -> str:
    task = next(t for t in deployment["jobs"][job_key]["tasks"] if t["task_key"] == task_key)
    return (ws.deployment_dir(int(deployment["version"])) / task["pipeline_file"]).read_text()


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
