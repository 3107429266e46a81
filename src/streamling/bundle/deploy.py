"""``bundle deploy``: check everything, then write one immutable deployment.

Every task is built first (``streamling.bundle.task_build``, which ``bundle validate`` runs alone):
notebooks compiled, pipelines validated. Nothing under the target root changes unless every job of
the bundle is valid, and a task resuming from its checkpoint keeps its sources. A deployment is a
numbered folder that is never edited afterwards; ``current`` names the live one, and the job runner
moves running jobs onto it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from streamling.bundle.model import Bundle
from streamling.bundle.task_build import build, runner_settings
from streamling.bundle.workspace import Workspace
from streamling.errors import StreamlingError, ValidationError

log = logging.getLogger(__name__)


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
