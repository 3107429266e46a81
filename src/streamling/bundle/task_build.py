"""``bundle validate``: every task built as it will be deployed, with all problems of all jobs at once.

A notebook task is compiled into the pipeline its ``%%streamling`` cells build (job parameters at
their defaults) and checked as its driver would check it: on a target whose master spans hosts, for
what each host would resolve on its own disk; for a continuous job, whether its state survives a
restart. ``TaskBuild.record`` is what a deployment keeps of the task, and its fingerprint decides
whether a redeploy touches a running task (``streamling.bundle.deploy`` writes it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.cron import QuartzSchedule
from streamling.bundle.model import Bundle, Job, Task
from streamling.bundle.workspace import Workspace
from streamling.errors import Location, StreamlingError, ValidationError

if TYPE_CHECKING:
    from streamling.bundle.compile import CompiledNotebook
    from streamling.config.sections import JobRunnerSettings


def task_parameters(job: Job | Mapping[str, Any], task: Task | Mapping[str, Any],
                    run_params: Mapping[str, str] | None = None) -> dict[str, str]:
    """Databricks' order: task ``base_parameters`` < job ``parameters`` defaults < run-now values."""
    job_params = job.parameters if isinstance(job, Job) else job.get("parameters", {})
    base = task.base_parameters if isinstance(task, Task) else task.get("base_parameters", {})
    return {**{k: str(v) for k, v in base.items()}, **{k: str(v) for k, v in job_params.items()},
            **{k: str(v) for k, v in (run_params or {}).items()}}


def default_application_id(bundle: str, job: str, task: str) -> str:
    """A task's application_id when neither its notebook nor the target sets one."""
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


def runner_settings(bundle: Bundle) -> tuple[JobRunnerSettings, str]:
    """The target's ``job_runner`` settings (environment over config) and its default store schema."""
    from streamling.config.sections import JobRunnerSettings
    from streamling.config.settings import deep_merge, env_overrides

    settings = JobRunnerSettings.model_validate(deep_merge(dict(bundle.target.config.get("job_runner") or {}),
                                                           env_overrides(os.environ).get("job_runner", {})))
    schema = re.sub(r"[^a-z0-9_]+", "_", f"streamling_runs_{bundle.name}_{bundle.target.name}".lower())[:63]
    return settings, settings.postgres.schema_name or schema
