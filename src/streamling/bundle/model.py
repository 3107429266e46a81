"""bundle.yml → a resolved, validated ``Bundle`` for one target (Databricks Asset Bundle conventions).

A bundle is a folder holding ``bundle.yml`` or ``databricks.yml``. Its keys are Databricks' so an existing
bundle keeps working: ``include`` globs merge more YAML files into one tree, ``variables`` resolve with the CLI's
precedence (``--var`` > ``BUNDLE_VAR_<name>`` > target > default), ``targets`` overlay their ``workspace``,
``variables`` and ``resources`` on the top level, and ``mode: development`` prefixes, tags and pauses jobs as the
CLI does. Only ``resources.jobs`` with notebook, Python-file and (streamling) wheel tasks can run here; keys that
configure Databricks itself (clusters, libraries, permissions, …) are accepted with a warning, so a bundle shared
with Databricks validates on both.

Extension: ``config`` (top level) and ``targets.<t>.config`` hold streamling runtime settings with the same keys
as ``config.yaml`` (``spark.master``, ``spark.conf``, ``application_id``, …); the target's mapping is merged over
the top-level one. This is where a target says which Spark master runs its jobs.

Everything is checked before anything is raised: ``load_bundle`` reports every problem at once, each located as
``<file relative to the root>: <dotted path>`` with the line of that key in that file. No pyspark import here:
``streamling bundle validate`` must stay fast and JVM-free.
"""

from __future__ import annotations

import copy
import getpass
import glob
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ValidationError as PydanticValidationError

from streamling.config.settings import Settings
from streamling.errors import Location, StreamlingError, ValidationError
from streamling.spec.loader import LoadedDocument, parse_yaml
from streamling.util import did_you_mean

BUNDLE_FILES = ("bundle.yml", "bundle.yaml", "databricks.yml", "databricks.yaml")
NOTEBOOK_HEADER = "# Databricks notebook source"
SQL_NOTEBOOK_HEADER = "-- Databricks notebook source"
PAYLOADS = ("notebook_task", "spark_python_task", "python_wheel_task", "condition_task", "sql_task", "run_job_task",
            "for_each_task", "pipeline_task")
UNSUPPORTED_PAYLOADS = ("dbt_task",
                        "spark_jar_task", "spark_submit_task", "clean_rooms_notebook_task", "dashboard_task",
                        "power_bi_task", "gen_ai_compute_task", "alert_task")
PauseStatus = Literal["PAUSED", "UNPAUSED"]
#: Databricks' condition_task operators
CONDITION_OPS = ("EQUAL_TO", "NOT_EQUAL", "GREATER_THAN", "GREATER_THAN_OR_EQUAL", "LESS_THAN", "LESS_THAN_OR_EQUAL")
#: Databricks' run_if values: when a task runs, given how its dependencies ended
RUN_IF = ("ALL_SUCCESS", "AT_LEAST_ONE_SUCCESS", "NONE_FAILED", "ALL_DONE", "AT_LEAST_ONE_FAILED", "ALL_FAILED")


@dataclass
class ForEach:
    """A for-each task's inputs (a JSON array, or a reference to one), how many iterations run at once,
    and the hidden job that runs one iteration (its nested task; see ``Job.iteration_of``)."""

    inputs: str
    concurrency: int
    job: str


@dataclass
class Task:
    """One task of a job: what it runs (a notebook, a Python file or the streamling wheel) and its retry policy."""

    key: str
    depends_on: list[str]
    kind: Literal["notebook", "spark_python", "python_wheel", "condition", "sql", "run_job", "for_each", "pipeline"]
    notebook_path: Path | None  #: absolute, resolved relative to the YAML file that declares it
    base_parameters: dict[str, str]
    python_file: Path | None  #: absolute, resolved relative to its YAML file
    package_name: str | None
    entry_point: str | None
    parameters: list[str]
    max_retries: int = 0  #: -1 = unlimited (Databricks)
    min_retry_interval_millis: int = 0
    retry_on_timeout: bool = False
    timeout_seconds: int = 0  #: 0 = none
    source: str = ""  #: ``bundle.yml:23``, for messages
    #: a condition task's {op, left, right} (evaluated by the runner, no process)
    condition: dict[str, str] | None = None
    #: dependency → the outcome ("true"/"false") of that condition task this task runs on
    outcomes: dict[str, str] = field(default_factory=dict)
    #: a SQL task's file (absolute, resolved relative to its YAML file); its parameters are ``base_parameters``
    sql_file: Path | None = None
    #: a run-job task: the job it runs (a key of this bundle's jobs) and that run's job parameters
    run_job: str | None = None
    job_parameters: dict[str, str] = field(default_factory=dict)
    #: a for-each task: its inputs (a JSON array, or a reference to one), how many iterations run at
    #: once, and the job that runs one iteration (its nested task; see ``Job.iteration_of``)
    for_each: ForEach | None = None
    run_if: str = "ALL_SUCCESS"
    #: a pipeline task: the pipeline it updates (a key of ``Bundle.pipelines``), and whether it recomputes all
    pipeline: str | None = None
    full_refresh: bool = False
    #: its cluster's Spark settings (``new_cluster``, ``job_cluster_key``, ``existing_cluster_id``): the
    #: ``spark_conf`` applies to the task's Spark session, ``spark_env_vars`` to its driver and executors
    spark_conf: dict[str, str] = field(default_factory=dict)
    spark_env_vars: dict[str, str] = field(default_factory=dict)
    #: what the task's Python needs besides streamling (``libraries`` and its job environment's
    #: ``dependencies``): pip requirement specs, ``-r <file>``, and wheel paths or globs (absolute)
    libraries: list[str] = field(default_factory=list)


@dataclass
class Schedule:
    """A Quartz cron schedule; checked for shape here, parsed by whoever fires it."""

    quartz_cron_expression: str
    timezone_id: str
    pause_status: PauseStatus


@dataclass
class Periodic:
    interval: int
    unit: Literal["MINUTES", "HOURS", "DAYS", "WEEKS"]
    pause_status: PauseStatus


@dataclass
class Job:
    """A job as the runner sees it: development prefixes, tags and pauses already applied."""

    key: str
    name: str  #: after the development prefix ``[dev <user>] ``
    tasks: list[Task]
    parameters: dict[str, str]
    schedule: Schedule | None
    periodic: Periodic | None
    continuous: PauseStatus | None  #: None = not a continuous job
    max_concurrent_runs: int
    timeout_seconds: int
    tags: dict[str, str]
    webhook_notifications: dict[str, list[str]]
    email_notifications: dict[str, list[str]]
    source: str
    #: (job, task) of the for-each task whose iterations this hidden job runs, each with ``{{input}}``
    iteration_of: tuple[str, str] | None = None


@dataclass
class Pipeline:
    """A Lakeflow (Databricks) declarative pipeline, run here by Apache Spark's Declarative Pipelines
    (``pyspark.pipelines``, the ``spark-pipelines`` CLI): its source files and folders (``folder/**``),
    its default catalog and schema, the Spark settings of its runs, and where it keeps its tables and
    checkpoints (``storage``, as on Databricks; see ``pipeline_locations``)."""

    key: str
    name: str
    libraries: list[str]  #: absolute file paths and folder globs (``…/**``)
    catalog: str | None
    schema: str | None
    configuration: dict[str, str]
    source: str = ""
    storage: str | None = None  #: a URI, or an absolute local path (relative ones resolved against the bundle root)


def pipeline_locations(root_path: str, key: str, storage_location: str | None) -> tuple[str, str]:
    """Where pipeline ``key`` keeps its checkpoints (the spec's ``storage``) and its tables (the
    warehouse): under its ``storage`` location when it names one — ``checkpoints/`` and ``tables/``,
    the folders a Databricks pipeline with a storage location uses — else under the target's root,
    ``state/pipelines/<key>/storage`` and the ``warehouse/`` every pipeline of the target shares."""
    from streamling import storage

    if storage_location:
        return storage.join(storage_location, "checkpoints"), storage.join(storage_location, "tables")
    return storage.join(root_path, "state", "pipelines", key, "storage"), storage.join(root_path, "warehouse")


@dataclass
class Artifact:
    """A wheel ``deploy`` builds (``artifacts.<name>``): ``build`` runs in ``path``, the wheels are its ``files``
    (default ``dist/*.whl`` under ``path``)."""

    name: str
    path: Path
    build: str | None
    files: list[str]


@dataclass
class Target:
    """Where a deployment lives and how it runs.

    ``config`` is a streamling extension: runtime settings overrides with the keys of ``config.yaml`` (for example
    ``{spark: {master: "spark://127.0.0.1:7077", conf: {...}}, application_id: ...}``), from
    ``targets.<t>.config`` merged over the top-level ``config``. It is how a target picks its Spark master.
    """

    name: str
    mode: Literal["development", "production"] | None
    root_path: str  #: absolute local path or URI; deployments, checkpoints and run logs live under it
    root_path_explicit: bool
    file_path: str
    config: dict[str, Any]  #: runtime settings overrides (config.yaml keys); see the module docstring


@dataclass
class Bundle:
    """The whole bundle resolved for one target: every ``${...}`` replaced, every path absolute."""

    name: str
    root: Path
    target: Target
    variables: dict[str, str]
    jobs: dict[str, Job]
    files: list[Path]
    user: str
    warnings: list[str] = field(default_factory=list)
    #: the secret scopes the bundle declares (``resources.secret_scopes``): deploy creates missing ones
    secret_scopes: list[str] = field(default_factory=list)
    artifacts: list[Artifact] = field(default_factory=list)
    pipelines: dict[str, Pipeline] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The resolved configuration (paths as text), for ``bundle validate -o json`` and deployment records."""
        return cast(dict[str, Any], _jsonable(asdict(self)))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def find_bundle_root(start: Path) -> Path:
    """The nearest folder at or above ``start`` holding a bundle file, so commands work from any subfolder."""
    here = Path(start).resolve()
    if here.is_file():
        here = here.parent
    for folder in (here, *here.parents):
        if any((folder / name).is_file() for name in BUNDLE_FILES):
            return folder
    raise StreamlingError(f"no bundle found in {here} or any folder above it", code="bundle_missing",
                          hint=f"run from inside a bundle folder, or create one of {', '.join(BUNDLE_FILES)}")


# --- schema: which keys exist at each level, and which are Databricks-only ---------------------------------------

@dataclass(frozen=True)
class _Map:
    """A mapping with fixed keys; ``no_effect`` keys are accepted with a warning saying why, and ``rejected``
    ones (Databricks features we cannot run) are left to the builder, which says what to use instead."""

    keys: Mapping[str, _Shape]
    no_effect: Mapping[str, str] = field(default_factory=dict)
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Named:
    """A mapping from user-chosen names to one shape (jobs, targets, variables)."""

    item: _Shape


@dataclass(frozen=True)
class _List:
    item: _Shape


_Shape = _Map | _Named | _List | None  # None: a value checked by the builder

_COMPUTE = "tasks run on the target's Spark master (config.spark.master)"
_SIZE = "a cluster's size and runtime come from the target's Spark master"
#: a Databricks cluster spec: its Spark settings apply to the task's Spark, the rest has no effect
_CLUSTER = _Map({"spark_conf": _Named(None), "spark_env_vars": _Named(None)}, {
    k: _SIZE for k in ("spark_version", "node_type_id", "driver_node_type_id", "num_workers", "autoscale",
                       "cluster_name", "custom_tags", "aws_attributes", "azure_attributes", "gcp_attributes",
                       "data_security_mode", "runtime_engine", "enable_elastic_disk", "instance_pool_id",
                       "driver_instance_pool_id", "policy_id", "apply_policy_default_values", "init_scripts",
                       "cluster_log_conf", "single_user_name", "autotermination_minutes", "ssh_public_keys",
                       "spark_python_task", "is_single_node", "kind", "use_ml_runtime", "workload_type",
                       "docker_image", "enable_local_disk_encryption", "permissions", "libraries")})
_DATABRICKS = "it configures a Databricks workspace, and there is none"
_LIBS = "tasks run with the environment streamling is installed in"
_NOTIFY = "streaming backlog and duration warnings are not raised here"
_WORKSPACE = _Map({"root_path": None, "file_path": None}, {
    k: _DATABRICKS for k in ("host", "profile", "artifact_path", "state_path", "resource_path", "auth_type",
                             "client_id", "account_id", "cluster_id", "serverless_compute_id", "azure_client_id",
                             "azure_tenant_id", "azure_workspace_resource_id", "azure_environment",
                             "azure_login_app_id", "azure_use_msi", "google_service_account", "metadata_service_url")})
_TASK = _Map({
    "task_key": None,
    "depends_on": _List(_Map({"task_key": None, "outcome": None})),
    "notebook_task": _Map({"notebook_path": None, "base_parameters": _Named(None)},
                          {"source": "notebooks are read from the bundle folder",
                           "warehouse_id": "notebooks run on Spark, not on a SQL warehouse"}),
    "spark_python_task": _Map({"python_file": None, "parameters": _List(None)},
                              {"source": "files are read from the bundle folder"}),
    "python_wheel_task": _Map({"package_name": None, "entry_point": None, "parameters": _List(None),
                               "named_parameters": _Named(None)}),
    "condition_task": _Map({"op": None, "left": None, "right": None}), "run_if": None,
    "sql_task": _Map({"file": _Map({"path": None, "source": None}), "parameters": _Named(None)},
                     {"warehouse_id": "SQL runs on the target's Spark, not on a SQL warehouse"},
                     rejected=("query", "dashboard", "alert")),
    "run_job_task": _Map({"job_id": None, "job_parameters": _Named(None)},
                         {"pipeline_params": "a run's pipelines refresh as their own pipeline_task says"},
                         rejected=("notebook_params", "python_params", "jar_params", "python_named_params",
                                   "spark_submit_params", "sql_params", "dbt_commands")),
    "max_retries": None, "min_retry_interval_millis": None, "retry_on_timeout": None, "timeout_seconds": None,
    "libraries": _List(_Map({"whl": None, "pypi": _Map({"package": None, "repo": None}), "requirements": None},
                            rejected=("jar", "maven", "egg", "cran"))),
    "environment_key": None, "job_cluster_key": None, "existing_cluster_id": None, "new_cluster": _CLUSTER,
    "pipeline_task": _Map({"pipeline_id": None, "full_refresh": None}),
}, {
    "compute_key": _COMPUTE,
    "description": "descriptions are not shown here", "email_notifications": "notifications are set per job here",
    "webhook_notifications": "notifications are set per job here", "notification_settings": _DATABRICKS,
    "health": _NOTIFY, "disable_auto_optimization": _DATABRICKS,
}, UNSUPPORTED_PAYLOADS)
# a for-each task holds a task (the schema is recursive; a nested for-each is refused by the builder)
cast(dict[str, _Shape], _TASK.keys)["for_each_task"] = _Map({"inputs": None, "concurrency": None, "task": _TASK})
_EVENTS = ("on_start", "on_success", "on_failure")
_JOB = _Map({
    "name": None, "tasks": _List(_TASK), "parameters": _List(_Map({"name": None, "default": None})),
    "schedule": _Map({"quartz_cron_expression": None, "timezone_id": None, "pause_status": None}),
    "trigger": _Map({"periodic": _Map({"interval": None, "unit": None}), "pause_status": None},
                    rejected=("file_arrival", "table_update", "table")),
    "continuous": _Map({"pause_status": None}, {"task_retry_mode": "failed tasks are retried per task settings"}),
    "max_concurrent_runs": None, "timeout_seconds": None, "tags": _Named(None),
    "webhook_notifications": _Map({e: _List(None) for e in _EVENTS}, {
        "on_duration_warning_threshold_exceeded": _NOTIFY, "on_streaming_backlog_exceeded": _NOTIFY}),
    "email_notifications": _Map({e: _List(None) for e in _EVENTS}, {
        "on_duration_warning_threshold_exceeded": _NOTIFY, "on_streaming_backlog_exceeded": _NOTIFY,
        "no_alert_for_skipped_runs": "skipped runs send no notification here"}),
    "job_clusters": _List(_Map({"job_cluster_key": None, "new_cluster": _CLUSTER})),
    "environments": _List(_Map({"environment_key": None, "spec": _Map(
        {"dependencies": _List(None)},
        {"client": "the environment is built on the target's Python", "environment_version": "the environment is "
         "built on the target's Python", "base_environment": "the environment is built on streamling's own"})})),
}, {
    "queue": "the job runner decides what happens to runs beyond max_concurrent_runs",
    "health": _NOTIFY, "permissions": _DATABRICKS, "run_as": "jobs run as the user running the job runner",
    "description": "descriptions are not shown here", "notification_settings": _DATABRICKS,
    "git_source": "tasks read files from the bundle folder", "budget_policy_id": _DATABRICKS,
    "edit_mode": _DATABRICKS, "deployment": _DATABRICKS, "format": _DATABRICKS, "performance_target": _DATABRICKS,
    "usage_policy_id": _DATABRICKS,
})
RESOURCE_KINDS = ("schemas", "volumes", "apps", "dashboards", "experiments", "models",
                  "registered_models", "model_serving_endpoints", "quality_monitors",
                  "sql_warehouses", "alerts", "catalogs", "database_instances", "database_catalogs",
                  "synced_database_tables")
_SECRET_SCOPE = _Map({"name": None, "backend_type": None},
                     {"permissions": "a scope's file is readable by the runner's user only"},
                     rejected=("keyvault_metadata",))
_DLT = "it configures Databricks' pipeline service"
_STORAGE_HINT = ("set resources.pipelines.{key}.storage to a location every host reaches, e.g. "
                 "hdfs://namenode:8020/pipelines/{key} or s3a://bucket/pipelines/{key}: its tables go to "
                 "<storage>/tables, its checkpoints to <storage>/checkpoints")
_PIPELINE = _Map({
    "name": None, "catalog": None, "schema": None, "target": None, "configuration": _Named(None),
    "libraries": _List(_Map({"glob": _Map({"include": None}), "file": _Map({"path": None}),
                             "notebook": _Map({"path": None})}, rejected=("jar", "maven", "whl"))),
    "continuous": None, "storage": None,
}, {**{k: _DLT for k in ("clusters", "photon", "serverless", "channel", "edition", "permissions", "notifications",
                         "budget_policy_id", "environment", "root_path", "allow_duplicate_names", "tags", "event_log",
                         "run_as")},
    "development": "a pipeline runs the same way in every target here"})
_RESOURCES = _Map({"jobs": _Named(_JOB), "secret_scopes": _Named(_SECRET_SCOPE), "pipelines": _Named(_PIPELINE),
                   "clusters": _Named(_CLUSTER)},
                  rejected=RESOURCE_KINDS)
_DEPLOY = "deploy copies the bundle folder as it is"
_ARTIFACT = _Map({"type": None, "build": None, "path": None, "files": _List(_Map({"source": None}))},
                 {"executable": "build commands run in a POSIX shell here",
                  "dynamic_version": "a wheel is installed by its file here, whatever its version"})
_TARGET = _Map({"default": None, "mode": None, "workspace": _WORKSPACE, "variables": _Named(None),
                "resources": _RESOURCES, "config": None, "artifacts": _Named(_ARTIFACT)}, {
    "presets": "development mode's prefix, tags and pauses are fixed here", "run_as": _DATABRICKS,
    "permissions": _DATABRICKS, "cluster_id": _COMPUTE, "compute_id": _COMPUTE,
    "git": "git details are not recorded here", "sync": _DEPLOY,
    "bundle": "bundle settings are not overridden per target here"})
_TOP = _Map({
    "bundle": _Map({"name": None, "uuid": None}, {
        "git": "git details are not recorded here", "cluster_id": _COMPUTE, "compute_id": _COMPUTE,
        "deployment": "deployments are versioned under the target's root_path",
        "databricks_cli_version": "the Databricks CLI is not used here", "engine": "deploy has one engine here"}),
    "include": _List(None),
    "variables": _Named(_Map({"description": None, "default": None, "type": None}, rejected=("lookup",))),
    "workspace": _WORKSPACE, "resources": _RESOURCES, "targets": _Named(_TARGET), "config": None,
    "artifacts": _Named(_ARTIFACT),
    "python": _Map({"venv_path": None, "resources": _List(None), "mutators": _List(None)}),
}, {
    "sync": _DEPLOY, "permissions": _DATABRICKS, "run_as": _DATABRICKS,
    "presets": "development mode's prefix, tags and pauses are fixed here", "experimental": _DATABRICKS,
    "scripts": "deploy runs no scripts here",
}, ("environments",))


# --- loading: files, provenance, problems ------------------------------------------------------------------------

def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a mapping, else empty: shapes are reported by the schema check, not twice."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _kind(value: Any) -> str:
    """How a message names a YAML value of the wrong shape."""
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return f"{_text(value)!r}"


def _text(value: Any) -> str:
    """A YAML scalar as the string Databricks would see (``true`` stays lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class _File:
    rel: str
    path: Path
    doc: LoadedDocument
    index: int


class _Context:
    """The merged tree, where each of its paths came from, and the problems and warnings found so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data: dict[str, Any] = {}
        self.origin: dict[str, tuple[_File, str]] = {}
        self.files: list[_File] = []
        self.problems: list[tuple[int, int, StreamlingError]] = []
        self.seen: set[str] = set()
        self.warnings: list[str] = []

    # provenance
    def record(self, path: str, value: Any, file: _File, src: str) -> None:
        self.origin[path] = (file, src)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            self.record(_join(path, key), item, file, _join(src, key))

    def forget(self, path: str) -> None:
        for key in [k for k in self.origin if k == path or k.startswith(path + ".")]:
            del self.origin[key]

    def where(self, path: str) -> tuple[_File, str]:
        """The file and the path inside it for a merged path (or its nearest recorded ancestor)."""
        probe = path
        while probe:
            if probe in self.origin:
                file, src = self.origin[probe]
                return file, src + path[len(probe):]
            probe = probe.rpartition(".")[0]
        return self.files[0], path

    def loc(self, path: str) -> Location:
        file, src = self.where(path)
        return Location(f"{file.rel}: {src or '<root>'}", file.doc.line(src))

    def source(self, path: str) -> str:
        file, src = self.where(path)
        return f"{file.rel}:{file.doc.line(src) or 1}"

    # reporting
    def add(self, where: str | Location, message: str, *, hint: str | None = None, code: str = "invalid_bundle",
            node: str | None = None, node_kind: str | None = None) -> None:
        loc = where if isinstance(where, Location) else self.loc(where)
        err = StreamlingError(message, location=loc, hint=hint, code=code, node=node, node_kind=node_kind)
        if err.headline() in self.seen:  # the same string resolved twice reports once
            return
        self.seen.add(err.headline())
        # Reported in reading order: by file (bundle file, then includes), then line; --var problems last.
        index = next((f.index for f in self.files if loc.path == f.rel or loc.path.startswith(f"{f.rel}: ")),
                     len(self.files))
        self.problems.append((index, loc.line or 0, err))

    def warn(self, path: str, key: str, why: str) -> None:
        self.warnings.append(f"{self.source(path)}: '{key}' has no effect here: {why}")

    def fail(self) -> None:
        if self.problems:
            raise _BundleInvalid([p for _, _, p in sorted(self.problems, key=lambda t: (t[0], t[1]))])


class _BundleInvalid(ValidationError):
    """A ``ValidationError`` whose summary says "bundle" rather than "pipeline"."""

    def __init__(self, problems: list[StreamlingError]) -> None:
        super().__init__(problems)
        count = len(self.problems)
        body = "\n".join(f"  - {p.headline()}" for p in self.problems)
        self.message = f"bundle is invalid ({count} problem{'s' if count != 1 else ''}):\n{body}"
        self.args = (self.message,)
        self.code = "invalid_bundle"


def _read(ctx: _Context, path: Path) -> _File | None:
    rel = _rel(path, ctx.root)
    file = _File(rel, path, LoadedDocument(None, source=rel), len(ctx.files))
    ctx.files.append(file)
    try:
        file.doc = parse_yaml(path.read_text(encoding="utf-8"), source=rel)
    except StreamlingError as exc:
        line = exc.location.line if exc.location else None
        ctx.add(Location(rel, line), exc.message, hint=exc.hint, code=exc.code)
        return None
    except OSError as exc:
        ctx.add(Location(rel), f"cannot read {rel}: {exc.strerror or exc}", code="bundle_unreadable")
        return None
    if file.doc.data is None:
        file.doc.data = {}
    if not isinstance(file.doc.data, dict):
        ctx.add(Location(rel, 1), f"{rel} must hold a mapping of keys (bundle, resources, targets, …)")
        return None
    return file


def _is_section(path: str) -> bool:
    """Mappings whose entries may come from different files (one job per file is the usual layout)."""
    return path in ("variables", "targets", "resources") or (path.startswith("resources.") and path.count(".") == 1)


def _combine(ctx: _Context, path: str, dst: dict[str, Any], value: dict[str, Any], file: _File, src: str) -> None:
    for key, item in value.items():
        child, child_src = _join(path, key), _join(src, key)
        if _is_section(child) and isinstance(item, dict) and isinstance(dst.get(key, {}), dict):
            if key not in dst:
                dst[key] = {}
                ctx.origin[child] = (file, child_src)
            _combine(ctx, child, dst[key], item, file, child_src)
        elif key in dst:
            first, first_src = ctx.where(child)
            ctx.add(Location(f"{file.rel}: {child_src}", file.doc.line(child_src)),
                    f"'{child}' is defined in both {first.rel} (line {first.doc.line(first_src)}) and {file.rel}",
                    hint="keep one definition: the files listed in include are merged into one configuration",
                    code="bundle_duplicate_key")
        else:
            dst[key] = item
            ctx.record(child, item, file, child_src)


def _overlay(ctx: _Context, path: str, dst: dict[str, Any], value: dict[str, Any], file: _File, src: str) -> None:
    """A target's settings over the top level: mappings merge deeply, tasks merge by task_key (as Databricks)."""
    for key, item in value.items():
        child, child_src = _join(path, key), _join(src, key)
        old = dst.get(key)
        if isinstance(old, dict) and isinstance(item, dict):
            _overlay(ctx, child, old, item, file, child_src)
        elif key == "tasks" and isinstance(old, list) and isinstance(item, list):
            keys = [t.get("task_key") if isinstance(t, dict) else None for t in old]
            for i, task in enumerate(item):
                task_key = task.get("task_key") if isinstance(task, dict) else None
                if task_key is not None and task_key in keys:
                    j = keys.index(task_key)
                    _overlay(ctx, f"{child}.{j}", old[j], cast(dict[str, Any], task), file, f"{child_src}.{i}")
                else:
                    old.append(copy.deepcopy(task))
                    ctx.record(f"{child}.{len(old) - 1}", task, file, f"{child_src}.{i}")
        else:
            ctx.forget(child)
            dst[key] = copy.deepcopy(item)
            ctx.record(child, item, file, child_src)


def _check(ctx: _Context, path: str, value: Any, shape: _Shape, warn: bool) -> None:
    """Unknown keys (with did-you-mean) are errors; Databricks-only keys are warnings."""
    if shape is None or value is None:
        return
    key = path.rpartition(".")[2] or "the bundle file"
    if isinstance(shape, _List):
        if not isinstance(value, list):
            ctx.add(path, f"'{key}' must be a list (got {_kind(value)})", hint="write one '- item' per line")
            return
        for i, item in enumerate(value):
            _check(ctx, f"{path}.{i}", item, shape.item, warn)
        return
    if not isinstance(value, dict):
        ctx.add(path, f"'{key}' must be a mapping of keys (got {_kind(value)})")
        return
    if isinstance(shape, _Named):
        for name, item in value.items():
            _check(ctx, _join(path, name), item, shape.item, warn)
        return
    for name, item in value.items():
        child = _join(path, name)
        if name in shape.keys:
            _check(ctx, child, item, shape.keys[name], warn)
        elif name in shape.no_effect:
            if warn:
                ctx.warn(child, str(name), shape.no_effect[name])
        elif name == "environments" and path == "":
            ctx.add(child, "'environments' is the old name of 'targets'", hint="rename it to targets")
        elif name not in shape.rejected:
            where = f"in {path}" if path else "at the top level"
            ctx.add(child, f"unknown key '{name}' {where}{did_you_mean(str(name), [*shape.keys, *shape.no_effect])}",
                    hint=f"keys that apply here: {', '.join(shape.keys)}", code="bundle_unknown_key")


# --- ${…} references ---------------------------------------------------------------------------------------------

_REF = re.compile(r"\$\{([^{}]*)\}")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class _Resolver:
    """Resolves ``${…}`` lazily so values may refer to each other; a failed value reports once, where it is set."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx
        self.raw: dict[str, tuple[str, Location]] = {}
        self.done: dict[str, str | None] = {}
        self.stack: list[str] = []
        self.post: dict[str, Callable[[str], str]] = {}  # e.g. root_path made absolute

    def ref(self, name: str) -> str | None:
        if name in self.done:
            return self.done[name]
        if name in self.stack:
            cycle = [*self.stack[self.stack.index(name):], name]
            self.ctx.add(self.raw[name][1], f"references form a cycle: {' -> '.join(cycle)}",
                         hint="give one of them a plain value", code="bundle_reference_cycle")
            for entry in cycle:
                self.done[entry] = None
            return None
        text, loc = self.raw[name]
        self.stack.append(name)
        value = self.text(text, loc)
        self.stack.pop()
        if name in self.done:  # set to None by a cycle found below
            return None
        if value is not None and name in self.post:
            value = self.post[name](value)
        self.done[name] = value
        return value

    def text(self, text: str, loc: Location) -> str | None:
        failed = False

        def replace(match: re.Match[str]) -> str:
            nonlocal failed
            name = match.group(1)
            if name in self.raw or name in self.done:
                value = self.ref(name)
                if value is not None:
                    return value
            else:
                self.unknown(name, loc)
            failed = True
            return match.group(0)

        out = _REF.sub(replace, text)
        return None if failed else out

    def unknown(self, name: str, loc: Location) -> None:
        known = sorted({*self.raw, *self.done})
        jobs = [k.split(".")[2] for k in known if k.startswith("resources.jobs.")]
        if name.startswith("variables."):
            hint = f"variables are referenced as ${{var.{name.partition('.')[2]}}}"
        elif name.startswith("var."):
            hint = f"declare it: variables: {{{name[4:]}: {{default: …}}}}"
        elif name.startswith("resources.jobs."):
            hint = f"a job is referenced as ${{resources.jobs.<key>.id}}; jobs here: {', '.join(jobs) or 'none'}"
        else:
            hint = ("available: ${var.<name>}, ${bundle.name}, ${bundle.target}, ${workspace.root_path}, "
                    "${workspace.file_path}, ${workspace.current_user.short_name}, ${resources.jobs.<key>.id}")
        close = did_you_mean(name, known, "'${{{}}}'", cutoff=0.8)
        self.ctx.add(loc, f"unknown reference '${{{name}}}'{close}", hint=hint,
                     code="bundle_unknown_reference")

    def tree(self, path: str, value: Any, shape: _Shape = None) -> Any:
        """Every string under ``value`` with its references replaced (unresolved ones kept as written).

        Keys with no effect here keep their text: a reference Databricks would resolve there (an artifact, a
        pipeline id) must not fail a bundle that cannot use it anyway."""
        if isinstance(value, dict):
            if isinstance(shape, _Map):
                return {k: self.tree(_join(path, k), v, shape.keys[k]) if k in shape.keys else v
                        for k, v in value.items()}
            item = shape.item if isinstance(shape, _Named) else None
            return {k: self.tree(_join(path, k), v, item) for k, v in value.items()}
        if isinstance(value, list):
            item = shape.item if isinstance(shape, _List) else None
            return [self.tree(_join(path, i), v, item) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            resolved = self.text(value, self.ctx.loc(path))
            return value if resolved is None else resolved
        return value


def _local_or_uri(text: str, root: Path) -> str:
    """A URI as written; a local path made absolute (``~`` expanded, relative to the bundle root)."""
    if _URI.match(text):
        return text
    path = Path(text).expanduser()
    return os.path.normpath(path if path.is_absolute() else root / path)


# --- loading -----------------------------------------------------------------------------------------------------

def load_bundle(root: Path, target: str | None = None, variables: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None, user: str | None = None) -> Bundle:
    """Load ``root``'s bundle file and includes, resolve them for one target, and check everything.

    ``variables`` come from ``--var k=v``; ``environ`` supplies ``BUNDLE_VAR_<name>`` (default ``os.environ``);
    ``user`` is the short user name of ``${workspace.current_user.short_name}`` and development prefixes.
    Raises ``ValidationError`` listing every problem; keys with no effect here become ``Bundle.warnings``.
    """
    root = Path(root).resolve()
    present = [root / name for name in BUNDLE_FILES if (root / name).is_file()]
    if not present:
        raise StreamlingError(f"no bundle file in {root}", code="bundle_missing",
                              hint=f"create one of {', '.join(BUNDLE_FILES)}")
    ctx = _Context(root)
    main = _read(ctx, present[0])
    if len(present) > 1:
        ctx.add(Location(ctx.files[0].rel), f"{root} holds more than one bundle file: "
                f"{', '.join(p.name for p in present)}", hint="keep one of them")
    if main is None:
        ctx.fail()
    assert main is not None
    _combine(ctx, "", ctx.data, main.doc.data, main, "")
    _includes(ctx, main)
    user = user or _current_user()
    environ = os.environ if environ is None else environ
    targets = _dict(ctx.data.get("targets"))
    chosen = _choose_target(ctx, targets, target)
    for key, value in ctx.data.items():
        if key == "targets" and isinstance(value, dict):  # warnings only for the target in use
            for name, body in value.items():
                _check(ctx, f"targets.{name}", body, _TARGET, warn=name == chosen)
        else:
            _check(ctx, "", {key: value}, _TOP, warn=True)
    if chosen is None:
        ctx.fail()
    assert chosen is not None
    body = _dict(targets.get(chosen))
    for section in ("workspace", "resources", "config", "artifacts"):
        if isinstance(body.get(section), dict):
            if ctx.data.get(section) is None:
                ctx.data[section] = {}
            if not isinstance(ctx.data[section], dict):
                continue
            file, src = ctx.where(f"targets.{chosen}.{section}")
            if section not in ctx.origin:
                ctx.origin[section] = (file, src)
            _overlay(ctx, section, ctx.data[section], body[section], file, src)
    python = _dict(ctx.data.get("python"))
    if python.get("resources") or python.get("mutators"):
        _python_resources(ctx, chosen, variables or {}, environ)
    bundle = _Builder(ctx, chosen, body, user).build(variables or {}, environ)
    ctx.fail()
    return bundle


def _python_resources(ctx: _Context, target: str, cli_vars: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """Jobs and pipelines the bundle defines in Python (``python.resources``, and ``python.mutators``
    that change them), loaded by the ``databricks-bundles`` package as the Databricks CLI loads them;
    they join the YAML-defined ones, located at their Python source."""
    from streamling.bundle import python_resources

    overrides = _dict(_dict(_dict(ctx.data.get("targets")).get(target)).get("variables"))
    values = {}
    for name, spec in _dict(ctx.data.get("variables")).items():
        values[str(name)] = cli_vars.get(name) or environ.get(f"BUNDLE_VAR_{name}") or overrides.get(name, (
            _dict(spec).get("default")))
    try:
        python = python_resources.interpreter(ctx.root, _dict(ctx.data.get("python")).get("venv_path"))
        result = python_resources.load(ctx.root, {k: v for k, v in ctx.data.items() if k != "targets"}, target,
                                       values, python)
    except StreamlingError as exc:
        ctx.add("python", exc.message, hint=exc.hint, code=exc.code)
        return
    for diagnostic in result.diagnostics:
        where = Location(diagnostic.file or "python.resources", diagnostic.line)
        detail = diagnostic.detail.strip().splitlines()[-1] if diagnostic.detail.strip() else None
        if diagnostic.severity == "error":
            ctx.add(where, diagnostic.summary, hint=detail, code="bundle_python")
        else:
            ctx.warnings.append(f"{diagnostic.file or 'python.resources'}:{diagnostic.line or 1}: {diagnostic.summary}")
    resources = _dict(result.data.get("resources"))
    known = _dict(ctx.data.get("resources"))
    files: dict[str, _File] = {}
    for kind, items in resources.items():
        for name, item in _dict(items).items():
            path = f"resources.{kind}.{name}"
            if name in _dict(known.get(kind)):
                continue
            rel, _line = result.locations.get(path, ("python.resources", None))
            if rel not in files:  # a stand-in file: problems in a Python-defined resource name its source
                files[rel] = _File(rel, ctx.root / rel, LoadedDocument({}, source=rel), len(ctx.files))
                ctx.files.append(files[rel])
            ctx.record(path, item, files[rel], path)
    ctx.data["resources"] = resources


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in some containers
        return os.environ.get("USER") or "user"


def _includes(ctx: _Context, main: _File) -> None:
    patterns = ctx.data.get("include")
    if not isinstance(patterns, list):
        return
    seen = {main.path}
    for i, pattern in enumerate(patterns):
        path = f"include.{i}"
        if not isinstance(pattern, str):
            ctx.add(path, "an include entry must be a glob pattern such as resources/*.yml")
            continue
        matches = sorted(glob.glob(pattern, root_dir=ctx.root, recursive=True))
        if not matches:  # as the Databricks CLI: not an error (a folder of resources may be empty)
            ctx.warnings.append(f"{ctx.source(path)}: include pattern '{pattern}' matches no file, so it adds "
                                "nothing (patterns are relative to the bundle folder)")
        for match in matches:
            file_path = Path(os.path.normpath(ctx.root / match))
            if file_path in seen or file_path.is_dir():
                continue
            seen.add(file_path)
            if file_path.suffix not in (".yml", ".yaml"):
                ctx.add(path, f"include pattern '{pattern}' matches {match}, which is not a YAML file",
                        hint="include only lists YAML configuration files")
                continue
            file = _read(ctx, file_path)
            if file is None:
                continue
            if "include" in file.doc.data:
                ctx.add(Location(f"{file.rel}: include", file.doc.line("include")),
                        "include is only read from the bundle file", hint=f"move it to {main.rel}")
                del file.doc.data["include"]
            _combine(ctx, "", ctx.data, file.doc.data, file, "")


def _choose_target(ctx: _Context, targets: dict[str, Any], wanted: str | None) -> str | None:
    names = [str(n) for n in targets]
    if wanted is not None:
        if wanted in targets:
            return wanted
        ctx.add("targets", f"unknown target '{wanted}'{did_you_mean(wanted, names)}",
                hint=f"targets here: {', '.join(names)}" if names else "declare it under targets:",
                code="bundle_unknown_target")
        return None
    if not targets:
        return "default"  # as Databricks: a bundle without targets has one named "default"
    defaults = [n for n, b in targets.items() if isinstance(b, dict) and b.get("default") is True]
    if len(defaults) > 1:
        for name in defaults[1:]:
            ctx.add(f"targets.{name}.default", f"more than one target is the default ({', '.join(defaults)})",
                    hint="keep default: true on one target", code="bundle_no_target")
        return None
    if defaults:
        return str(defaults[0])
    if len(names) == 1:
        return names[0]
    ctx.add("targets", f"no target given and none is the default among {', '.join(names)}",
            hint="pass --target NAME or set default: true on one target", code="bundle_no_target")
    return None


class _Builder:
    """Turns the merged tree of the chosen target into dataclasses, checking values on the way."""

    def __init__(self, ctx: _Context, target: str, body: dict[str, Any], user: str) -> None:
        self.ctx = ctx
        self.target = target
        self.body = body
        self.user = user
        self.resolver = _Resolver(ctx)
        self.node: tuple[str, str] | None = None
        #: the job being built: its environments' dependencies by environment_key, its job clusters by key
        self.environments: dict[str, list[str]] = {}
        self.job_clusters: dict[str, dict[str, Any]] = {}
        #: ``resources.clusters`` (what ``existing_cluster_id: ${resources.clusters.<key>.id}`` names)
        self.clusters: dict[str, dict[str, Any]] = {}
        #: jobs that run one iteration of a for-each task, added next to the bundle's own
        self.iteration_jobs: dict[str, Job] = {}
        mode = body.get("mode")
        if mode is not None and mode not in ("development", "production"):
            ctx.add(f"targets.{target}.mode", f"mode must be development or production (got {mode!r})",
                    hint="development prefixes and pauses jobs; production requires a workspace.root_path")
            mode = None
        self.mode = cast(Literal["development", "production"] | None, mode)

    def build(self, cli_vars: Mapping[str, str], environ: Mapping[str, str]) -> Bundle:
        ctx, data, res = self.ctx, self.ctx.data, self.resolver
        meta = _dict(data.get("bundle"))
        name = meta.get("name")
        if name is None or isinstance(name, (dict, list)) or not str(name).strip():
            ctx.add("bundle.name" if "bundle" in data else "bundle", "the bundle has no name",
                    hint="set bundle: {name: …}; it names deployments and the default root_path")
            name = "bundle"
        workspace = _dict(data.get("workspace"))
        root_raw = workspace.get("root_path")
        if self.mode == "production" and root_raw is None:
            ctx.add(f"targets.{self.target}",
                    f"target '{self.target}' is in production mode and has no workspace.root_path",
                    hint=f"set targets.{self.target}.workspace.root_path to where deployments, checkpoints and "
                         "run logs live", code="bundle_production_root")
        res.raw["bundle.name"] = (_text(name), ctx.loc("bundle.name"))
        res.raw["bundle.target"] = (self.target, ctx.loc(f"targets.{self.target}"))
        for key in ("short_name", "userName"):
            res.done[f"workspace.current_user.{key}"] = self.user
        res.raw["workspace.root_path"] = (
            _text(root_raw) if root_raw is not None else f"~/.streamling/bundle/{name}/{self.target}",
            ctx.loc("workspace.root_path"))
        file_raw = workspace.get("file_path")
        res.raw["workspace.file_path"] = (_text(file_raw) if file_raw is not None else "${workspace.root_path}/files",
                                          ctx.loc("workspace.file_path"))
        res.post["workspace.root_path"] = res.post["workspace.file_path"] = lambda t: _local_or_uri(t, ctx.root)
        resources = _dict(data.get("resources"))
        jobs = _dict(resources.get("jobs"))
        for key in jobs:
            res.done[f"resources.jobs.{key}.id"] = str(key)
        for key in _dict(resources.get("pipelines")):
            res.done[f"resources.pipelines.{key}.id"] = str(key)
        for key in _dict(resources.get("clusters")):
            res.done[f"resources.clusters.{key}.id"] = str(key)
        for kind in resources:
            if kind in RESOURCE_KINDS:  # other names are unknown keys, reported by the schema check
                ctx.add(f"resources.{kind}", f"resources.{kind} is not supported here: only jobs are deployed",
                        hint="run the work as a job with a notebook_task, spark_python_task or python_wheel_task",
                        code="bundle_unsupported")
        names = self.variables(cli_vars, environ)
        values = {n: res.ref(f"var.{n}") for n in names}
        root_path = res.ref("workspace.root_path") or ""
        file_path = res.ref("workspace.file_path") or ""
        bundle_name = res.ref("bundle.name") or _text(name)
        config = res.tree("config", data.get("config")) if "config" in data else {}
        if not isinstance(config, dict):
            ctx.add("config", "config must be a mapping of runtime settings (the keys of config.yaml)")
            config = {}
        self.check_config(config)
        store = self.check_runner_store(config, environ)
        if root_path:
            from streamling.bundle.workspace import root_problem

            if (problem := root_problem(root_path, store)) is not None:
                ctx.add("workspace.root_path", problem.message, hint=problem.hint, code=problem.code)
        self.clusters = {str(k): _dict(res.tree(f"resources.clusters.{k}", v, _CLUSTER))
                         for k, v in _dict(resources.get("clusters")).items()}
        built = {str(k): self.job(str(k), res.tree(f"resources.jobs.{k}", v, _JOB)) for k, v in jobs.items()}
        self.check_run_jobs({**{k: v for k, v in built.items() if v is not None}, **self.iteration_jobs})
        built.update(self.iteration_jobs)
        target = Target(self.target, self.mode, root_path, root_raw is not None, file_path, config)
        self.node = None
        scopes = self.secret_scopes(_dict(resources.get("secret_scopes")))
        pipelines = {str(k): p for k, v in _dict(resources.get("pipelines")).items()
                     if (p := self.pipeline(str(k), res.tree(f"resources.pipelines.{k}", v, _PIPELINE),
                                            str(_dict(config.get("spark")).get("master") or "local[*]"))) is not None}
        self.check_pipeline_tasks({k: v for k, v in built.items() if v is not None}, _dict(resources.get("pipelines")),
                                  pipelines, config, root_path)
        artifacts = [a for k, v in _dict(data.get("artifacts")).items()
                     if (a := self.artifact(str(k), res.tree(f"artifacts.{k}", v, _ARTIFACT))) is not None]
        return Bundle(bundle_name, ctx.root, target, {k: v for k, v in values.items() if v is not None},
                      {k: v for k, v in built.items() if v is not None}, [f.path for f in ctx.files], self.user,
                      ctx.warnings, scopes, artifacts, pipelines)

    def artifact(self, name: str, body: Any) -> Artifact | None:
        path = f"artifacts.{name}"
        spec = _dict(body)
        kind = str(spec.get("type") or "whl")
        if kind != "whl":
            self.ctx.add(f"{path}.type", f"artifact '{name}' is of type {kind!r}; only Python wheels (whl) are "
                         "built here", hint="type: whl", code="bundle_unsupported")
            return None
        raw = self.str_(spec, "path", path) or "."
        folder, shown, hint = self.locate(f"{path}.path" if "path" in spec else path, raw, "artifacts.path")
        if not folder.is_dir():
            self.add(f"{path}.path" if "path" in spec else path, f"artifact '{name}': folder {shown} does not exist",
                     hint=hint, code="bundle_missing_file")
            return None
        files = [str(folder / _text(_dict(f).get("source"))) for f in _list(spec.get("files"))
                 if _dict(f).get("source")] or [str(folder / "dist" / "*.whl")]
        return Artifact(name, folder, self.str_(spec, "build", path), files)

    def cluster(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The cluster spec a task names (inline, a job cluster or a bundle cluster); {} for none."""
        if "new_cluster" in body:
            return _dict(body["new_cluster"])
        if body.get("job_cluster_key") is not None:
            key = _text(body["job_cluster_key"])
            if key not in self.job_clusters:
                self.add(f"{path}.job_cluster_key", f"job_cluster_key '{key}' is not one of the job's job_clusters"
                         f"{did_you_mean(key, list(self.job_clusters))}",
                         hint=f"job clusters: {', '.join(self.job_clusters) or 'none declared'}")
            return self.job_clusters.get(key, {})
        if body.get("existing_cluster_id") is not None:
            # a cluster of this bundle by its key; any other id names a Databricks cluster: no settings to apply
            return self.clusters.get(_text(body["existing_cluster_id"]), {})
        return {}

    def job_environments(self, path: str, items: Any) -> dict[str, list[str]]:
        """A job's ``environments``: each key's dependencies as pip requirements (paths made absolute)."""
        out: dict[str, list[str]] = {}
        for i, item in enumerate(_list(items)):
            key = self.str_(_dict(item), "environment_key", f"{path}.environments.{i}", required=True)
            deps = []
            for j, dep in enumerate(_list(_dict(_dict(item).get("spec")).get("dependencies"))):
                text, at = _text(dep).strip(), f"{path}.environments.{i}.spec.dependencies.{j}"
                if text.startswith("-r "):
                    deps.append(f"-r {self.library_path(at, text[3:].strip())}")
                elif text.startswith(("./", "../", "/")) or text.endswith(".whl"):
                    deps.append(self.library_path(at, text))
                else:
                    deps.append(text)
            if key is not None:
                out[key] = deps
        return out

    def libraries(self, where: str, items: Any, environments: dict[str, list[str]], environment_key: Any) -> list[str]:
        """A task's ``libraries`` and its ``environment_key``'s dependencies, as pip requirements."""
        out: list[str] = []
        for i, item in enumerate(_list(items)):
            spec, at = _dict(item), f"{where}.libraries.{i}"
            for other in ("jar", "maven", "egg", "cran"):
                if other in spec:
                    self.add(f"{at}.{other}", f"{other} libraries cannot be installed here: tasks run Python",
                             hint="use whl, pypi or requirements", code="bundle_unsupported")
            if "whl" in spec:
                out.append(self.library_path(f"{at}.whl", _text(spec["whl"])))
            elif "pypi" in spec:
                package = self.str_(_dict(spec["pypi"]), "package", f"{at}.pypi", required=True)
                if package:
                    repo = _dict(spec["pypi"]).get("repo")
                    out.append(f"{package} --index-url {_text(repo)}" if repo else package)
            elif "requirements" in spec:
                out.append(f"-r {self.library_path(f'{at}.requirements', _text(spec['requirements']))}")
        if environment_key is not None:
            key = _text(environment_key)
            if key not in environments:
                self.add(f"{where}.environment_key", f"environment_key '{key}' is not one of the job's environments"
                         f"{did_you_mean(key, list(environments))}",
                         hint=f"environments: {', '.join(environments) or 'none declared'}")
            out.extend(environments.get(key, []))
        return out

    def library_path(self, where: str, raw: str) -> str:
        """A wheel or requirements file, relative to the YAML file naming it (it may not exist before
        ``deploy`` builds the artifacts)."""
        resolved, _, _ = self.locate(where, raw, "a library path")
        return str(resolved)

    def pipeline(self, key: str, body: Any, master: str) -> Pipeline | None:
        """A declarative pipeline run by Spark's ``pyspark.pipelines``: Databricks-only parts (the
        ``dlt`` module, continuous mode) fail here with what to write instead, and so does a
        ``storage`` location that the hosts of ``master`` do not share."""
        from streamling import storage

        path, spec = f"resources.pipelines.{key}", _dict(body)
        self.node = (key, "pipeline")
        if spec.get("continuous") in (True, "true", "True"):
            self.add(f"{path}.continuous", "a continuous pipeline cannot run here: Spark's declarative pipelines run "
                     "triggered updates", hint="drop continuous and refresh it from a job's pipeline_task (a "
                     "continuous job keeps it fresh)", code="bundle_unsupported")
        libraries: list[str] = []
        for i, item in enumerate(_list(spec.get("libraries"))):
            at, lib = f"{path}.libraries.{i}", _dict(item)
            for other in ("jar", "maven", "whl"):
                if other in lib:
                    self.add(f"{at}.{other}", f"a pipeline's {other} library cannot be loaded here",
                             hint="pipelines load Python and SQL source files", code="bundle_unsupported")
            raw = _text(_dict(lib.get("glob")).get("include") or _dict(lib.get("file")).get("path")
                        or _dict(lib.get("notebook")).get("path") or "")
            if not raw:
                continue
            folder_glob = raw.endswith("/**")
            if "*" in raw.removesuffix("/**") or ("*" in raw and not folder_glob):
                self.add(at, f"library pattern '{raw}' is not a file or a folder/**", hint="Spark's declarative "
                         "pipelines take a file path or a whole folder (transformations/**)")
                continue
            resolved, shown, hint = self.locate(at, raw.removesuffix("/**"), "a pipeline library")
            if "notebook" in lib and not resolved.exists() and resolved.with_suffix(".py").is_file():
                resolved = resolved.with_suffix(".py")  # Databricks leaves a notebook's extension out
            if not resolved.exists():
                self.add(at, f"pipeline library {shown} does not exist", hint=hint, code="bundle_missing_file")
                continue
            if not self.inside(at, resolved, "pipeline library"):
                continue
            files = sorted(resolved.rglob("*.py")) if resolved.is_dir() else [resolved]
            for file in files:
                if re.search(r"^\s*(import\s+dlt\b|from\s+dlt\s+import)", file.read_text(errors="replace"), re.M):
                    self.add(at, f"{_rel(file, self.ctx.root)} uses Databricks' dlt module, which only Databricks "
                             "has", hint="write it with Spark's declarative pipelines: from pyspark import pipelines "
                             "as dp (@dp.materialized_view, @dp.table, dp.create_streaming_table); expectations "
                             "(dlt.expect*) have no equivalent there", code="bundle_unsupported")
            libraries.append(str(resolved) + ("/**" if resolved.is_dir() else ""))
        if not _list(spec.get("libraries")):
            self.add(path, "no libraries: a pipeline is defined by its source files",
                     hint="libraries: [{glob: {include: transformations/**}}]")
        stored = self.str_(spec, "storage", path)
        if stored and (problem := storage.cluster_path_problem(stored, master, "storage", written_by_executors=True)):
            self.add(f"{path}.storage", problem, hint=_STORAGE_HINT.format(key=key), code="cluster_path")
        self.node = None
        return Pipeline(key, self.str_(spec, "name", path) or key, libraries, self.str_(spec, "catalog", path),
                        self.str_(spec, "schema", path) or self.str_(spec, "target", path),
                        self.strings(spec, "configuration", path), self.ctx.source(path),
                        _local_or_uri(stored, self.ctx.root) if stored else None)

    def check_pipeline_tasks(self, jobs: Mapping[str, Job], declared: Mapping[str, Any],
                             pipelines: Mapping[str, Pipeline], config: Mapping[str, Any], root_path: str) -> None:
        """A pipeline_task names a pipeline of the bundle. On a master spanning hosts the pipeline's
        executors write its tables and checkpoints from every host, so both must be on storage every
        host reaches (``pipeline_locations``), not on the driver host's disk."""
        from streamling import storage

        master = str(_dict(config.get("spark")).get("master") or "local[*]")
        for key, job in jobs.items():
            for i, task in enumerate(job.tasks):
                if task.pipeline is None:
                    continue
                where = f"resources.jobs.{key}.tasks.{i}.pipeline_task"
                if task.pipeline not in declared:
                    self.ctx.add(f"{where}.pipeline_id", f"updates pipeline '{task.pipeline}', which this bundle "
                                 f"does not define{did_you_mean(task.pipeline, list(declared))}",
                                 hint="pipeline_id: ${resources.pipelines.<key>.id}", node=task.key, node_kind="task")
                pipeline = pipelines.get(task.pipeline)
                if pipeline is None or pipeline.storage or not root_path:
                    continue  # a storage location of its own was checked with the pipeline
                checkpoints, tables = pipeline_locations(root_path, pipeline.key, None)
                problem = next((p for path, what in ((tables, "table"), (checkpoints, "checkpoint"))
                                if (p := storage.cluster_path_problem(path, master, f"the {what} folder of pipeline "
                                                                      f"'{pipeline.key}'", written_by_executors=True))),
                               None)
                if problem is not None:
                    self.ctx.add(where, problem, hint=_STORAGE_HINT.format(key=pipeline.key), node=task.key,
                                 node_kind="task", code="cluster_path")

    def secret_scopes(self, declared: dict[str, Any]) -> list[str]:
        """Scopes of the local secret store (``streamling.secrets``); Azure Key Vault ones cannot be read here."""
        names: list[str] = []
        for key, body in declared.items():
            path = f"resources.secret_scopes.{key}"
            spec = _dict(self.resolver.tree(path, body, _SECRET_SCOPE))
            backend = str(spec.get("backend_type") or "DATABRICKS").upper()
            if backend != "DATABRICKS" or "keyvault_metadata" in spec:
                shown = backend if backend != "DATABRICKS" else "Azure Key Vault"
                self.ctx.add(f"{path}.backend_type" if "backend_type" in spec else f"{path}.keyvault_metadata",
                             f"secret scope '{key}' is backed by {shown}; only the target's own secret store is read "
                             "here",
                             hint="drop backend_type (DATABRICKS: the target's store) and put the values with "
                                  "`streamling bundle secrets put-secret`", code="bundle_unsupported")
                continue
            names.append(str(spec.get("name") or key))
        return names

    def variables(self, cli_vars: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
        ctx, res = self.ctx, self.resolver
        declared = _dict(ctx.data.get("variables"))
        names = [str(n) for n in declared]
        overrides = _dict(self.body.get("variables"))
        for name in overrides:
            if name not in declared:
                ctx.add(f"targets.{self.target}.variables.{name}",
                        f"target '{self.target}' sets variable '{name}', which is not declared"
                        f"{did_you_mean(str(name), names)}",
                        hint=f"declare it under variables: {{{name}: {{default: …}}}}")
        for name in cli_vars:
            if name not in declared:
                ctx.add(Location(f"--var {name}"), f"--var sets variable '{name}', which is not declared"
                        f"{did_you_mean(name, names)}", hint="declare it under variables: in the bundle, or drop --var")
        for name, spec in declared.items():
            path, ref = f"variables.{name}", f"var.{name}"
            spec = _dict(spec)
            if "lookup" in spec:
                ctx.add(f"{path}.lookup", f"variable '{name}': lookup is not supported here",
                        hint="there is no workspace to look objects up in; give it a default")
            if spec.get("type") is not None:
                ctx.add(f"{path}.type", f"variable '{name}': type {spec['type']!r} is not supported here",
                        hint="variables are plain strings here; remove type")
            value: Any = None
            where: str | Location = path
            if name in cli_vars:
                value, where = cli_vars[name], Location(f"--var {name}")
            elif f"BUNDLE_VAR_{name}" in environ:
                value, where = environ[f"BUNDLE_VAR_{name}"], Location(f"BUNDLE_VAR_{name}")
            elif name in overrides:
                value, where = overrides[name], f"targets.{self.target}.variables.{name}"
                if isinstance(value, dict) and set(value) == {"default"}:
                    value, where = value["default"], f"{where}.default"
            elif "default" in spec:
                value, where = spec["default"], f"{path}.default"
            loc = where if isinstance(where, Location) else ctx.loc(where)
            if value is None:
                ctx.add(path, f"variable '{name}' has no value", code="bundle_variable_unset",
                        hint=f"give it a default, set it per target, pass --var {name}=VALUE or set BUNDLE_VAR_{name}")
                res.done[ref] = None
            elif isinstance(value, (dict, list)):
                ctx.add(loc, f"variable '{name}' must be a single value (got {_kind(value)})",
                        hint="complex variables are not supported here")
                res.done[ref] = None
            else:
                res.raw[ref] = (_text(value), loc)
        return names

    def check_runner_store(self, config: dict[str, Any], environ: Mapping[str, str]) -> str:
        """The target's run store; a target on several hosts whose runner keeps runs on one host's disk
        is warned: nobody can take over."""
        from streamling import storage

        master = str((config.get("spark") or {}).get("master") or "")
        runner = config.get("job_runner") or {}
        store = str(environ.get("STREAMLING__JOB_RUNNER__STORE") or (runner.get("store") if isinstance(runner, dict)
                                                                     else None) or "sqlite")
        if storage.is_multi_host(master) and store == "sqlite":
            self.ctx.warnings.append(
                f"target '{self.target}' runs on {master}, which spans hosts, but its job runner keeps runs in "
                "runs.db on one host's disk (job_runner.store: sqlite): if that host dies, no runner elsewhere can "
                "take over its jobs. Set job_runner.store: postgres (see README, Running on a cluster)")
        return store

    def check_config(self, config: dict[str, Any]) -> None:
        """Runtime settings are checked now, so a typo in targets.<t>.config fails validate, not the first run."""
        top = sorted(Settings.model_fields)
        for key in config:  # Settings keeps unknown top-level keys (other builds' connectors): say so here
            if key not in Settings.model_fields:
                self.ctx.warn(f"config.{key}", str(key), f"not a streamling setting{did_you_mean(str(key), top)}")
        try:
            Settings.model_validate(config)
        except PydanticValidationError as exc:
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                path = ".".join(["config", *loc])
                if err["type"] == "extra_forbidden":
                    model: Any = Settings
                    for part in loc[:-1]:
                        field_info = model.model_fields.get(part) if hasattr(model, "model_fields") else None
                        model = field_info.annotation if field_info else None
                    keys = sorted(getattr(model, "model_fields", {}))
                    self.ctx.add(path, f"unknown key '{loc[-1]}' in {'.'.join(['config', *loc[:-1]])}"
                                 f"{did_you_mean(loc[-1], keys)}", code="bundle_unknown_key",
                                 hint=f"keys that apply here: {', '.join(keys)}" if keys else None)
                else:
                    text = str(err["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")
                    self.ctx.add(path, f"{path}: {text}", hint="it takes the same values as in config.yaml")

    # values --------------------------------------------------------------------------------------------------
    def add(self, path: str, message: str, hint: str | None = None, code: str = "invalid_bundle") -> None:
        """A problem about the job or task being built: its headline starts ``job 'x':`` or ``task 'y':``."""
        node, kind = self.node if self.node else (None, None)
        self.ctx.add(path, message, hint=hint, code=code, node=node, node_kind=kind)

    def str_(self, obj: dict[str, Any], key: str, path: str, required: bool = False) -> str | None:
        value = obj.get(key)
        if value is None:
            if required:
                self.add(_join(path, key), f"{path.rpartition('.')[2]} has no {key}", hint=f"set {key}")
            return None
        if isinstance(value, (dict, list)):
            self.add(_join(path, key), f"{key} must be a single value (got {_kind(value)})")
            return None
        return _text(value)

    def int_(self, obj: dict[str, Any], key: str, path: str, default: int, minimum: int) -> int:
        value = obj.get(key)
        if value is None:
            return default
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):  # e.g. from ${var.retries}
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            self.add(_join(path, key), f"{key} must be a whole number (got {value!r})")
            return default
        if value < minimum:
            self.add(_join(path, key), f"{key} must be at least {minimum} (got {value})")
            return default
        return value

    def bool_(self, obj: dict[str, Any], key: str, path: str) -> bool:
        value = obj.get(key)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if value is not None and not isinstance(value, bool):
            self.add(_join(path, key), f"{key} must be true or false (got {value!r})")
        return value is True

    def pause(self, obj: dict[str, Any], path: str) -> PauseStatus:
        """Unset means paused in development (as Databricks: a dev deploy never starts work by itself)."""
        value = obj.get("pause_status")
        if value is None:
            return "PAUSED" if self.mode == "development" else "UNPAUSED"
        if value not in ("PAUSED", "UNPAUSED"):
            self.add(f"{path}.pause_status", f"pause_status must be PAUSED or UNPAUSED (got {value!r})")
            return "PAUSED"
        return cast(PauseStatus, value)

    def strings(self, obj: dict[str, Any], key: str, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, item in _dict(obj.get(key)).items():
            if isinstance(item, (dict, list)):
                self.add(f"{path}.{key}.{name}", f"{key}.{name} must be a single value")
            elif item is not None:
                out[str(name)] = _text(item)
        return out

    # jobs ----------------------------------------------------------------------------------------------------
    def job(self, key: str, body: Any) -> Job | None:
        if not isinstance(body, dict):
            return None  # reported by the schema check
        path, dev = f"resources.jobs.{key}", self.mode == "development"
        self.node = (key, "job")
        name = self.str_(body, "name", path) or key
        tags = self.strings(body, "tags", path)
        if dev:
            name, tags["dev"] = f"[dev {self.user}] {name}", self.user
        self.environments = self.job_environments(path, body.get("environments"))
        self.job_clusters = {str(_dict(c).get("job_cluster_key")): _dict(_dict(c).get("new_cluster"))
                             for c in _list(body.get("job_clusters")) if _dict(c).get("job_cluster_key")}
        raw_tasks = body.get("tasks")
        if not raw_tasks:
            self.add(path if raw_tasks is None else f"{path}.tasks", "has no tasks",
                     hint="add tasks: [{task_key: main, notebook_task: {notebook_path: …}}]")
        tasks = [task for i, item in enumerate(_list(raw_tasks))
                 if (task := self.task(key, f"{path}.tasks.{i}", item)) is not None]
        self.node = (key, "job")
        self.check_graph(key, path, tasks)
        parameters: dict[str, str] = {}
        for i, item in enumerate(_list(body.get("parameters"))):
            where = f"{path}.parameters.{i}"
            pname = self.str_(_dict(item), "name", where, required=True)
            default = self.str_(_dict(item), "default", where, required=True)
            if pname is not None and pname in parameters:
                self.add(f"{where}.name", f"job parameter '{pname}' is declared twice", hint="remove one of them")
            elif pname is not None and default is not None:
                parameters[pname] = default
        self.references(path, raw_tasks, body.get("parameters"), parameters, tasks)
        for hidden in self.iteration_jobs.values():  # an iteration reads its job's parameters
            if hidden.iteration_of is not None and hidden.iteration_of[0] == key:
                hidden.parameters = dict(parameters)
        schedule = None
        if isinstance(body.get("schedule"), dict):
            schedule = self.schedule(body["schedule"], f"{path}.schedule")
        trigger = _dict(body.get("trigger"))
        for kind in ("file_arrival", "table_update", "table"):
            if kind in trigger:
                self.add(f"{path}.trigger.{kind}", f"trigger.{kind} is not supported here",
                         hint="use trigger.periodic, schedule or continuous")
        periodic = None
        if isinstance(trigger.get("periodic"), dict):
            periodic = self.periodic(trigger["periodic"], f"{path}.trigger", trigger)
        elif "trigger" in body and not any(k in trigger for k in ("file_arrival", "table_update", "table")):
            self.add(f"{path}.trigger", "trigger has no periodic",
                     hint="set trigger.periodic: {interval: 1, unit: HOURS}")
        continuous = None
        if body.get("continuous") is not None:
            continuous = self.pause(_dict(body["continuous"]), f"{path}.continuous")
        given = [k for k in body if k in ("schedule", "trigger", "continuous") and body[k] is not None]
        if len(given) > 1:
            self.add(f"{path}.{given[1]}", f"has both {given[0]} and {given[1]}",
                     hint="a job is either continuous, scheduled or triggered: keep one")
        return Job(
            key=key, name=name, tasks=tasks, parameters=parameters, schedule=schedule, periodic=periodic,
            continuous=continuous, max_concurrent_runs=self.int_(body, "max_concurrent_runs", path, 4 if dev else 1, 1),
            timeout_seconds=self.int_(body, "timeout_seconds", path, 0, 0), tags=tags,
            webhook_notifications=self.notifications(body, "webhook_notifications", path),
            email_notifications=self.notifications(body, "email_notifications", path),
            source=self.ctx.source(path))

    def schedule(self, body: dict[str, Any], path: str) -> Schedule | None:
        cron = self.str_(body, "quartz_cron_expression", path)
        if cron is None:
            self.add(f"{path}.quartz_cron_expression", "schedule has no quartz_cron_expression",
                     hint="set e.g. quartz_cron_expression: '0 0 * * * ?' (seconds minutes hours day month weekday)")
        elif len(cron.split()) not in (6, 7):
            self.add(f"{path}.quartz_cron_expression",
                     f"quartz_cron_expression '{cron}' has {len(cron.split())} fields; Quartz expects 6 or 7",
                     hint="seconds minutes hours day-of-month month day-of-week [year], e.g. '0 0 * * * ?'")
            cron = None
        zone = self.str_(body, "timezone_id", path) or "UTC"
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            self.add(f"{path}.timezone_id", f"unknown timezone_id '{zone}'",
                     hint="use an IANA name such as Europe/Paris")
        status = self.pause(body, path)
        return Schedule(cron, zone, status) if cron is not None else None

    def periodic(self, body: dict[str, Any], path: str, trigger: dict[str, Any]) -> Periodic | None:
        if "interval" not in body:
            self.add(f"{path}.periodic", "trigger.periodic has no interval", hint="set interval: 1 or more")
        interval = self.int_(body, "interval", f"{path}.periodic", 0, 1)
        unit = body.get("unit")
        if unit not in ("MINUTES", "HOURS", "DAYS", "WEEKS"):
            self.add(f"{path}.periodic.unit" if "unit" in body else f"{path}.periodic",
                     f"trigger.periodic.unit must be MINUTES, HOURS, DAYS or WEEKS (got {unit!r})")
        status = self.pause(trigger, path)
        return Periodic(interval, unit, status) if interval >= 1 and unit in ("MINUTES", "HOURS", "DAYS", "WEEKS") \
            else None

    def notifications(self, body: dict[str, Any], key: str, path: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        section = _dict(body.get(key))
        for event in _EVENTS:
            for i, item in enumerate(_list(section.get(event))):
                where = f"{path}.{key}.{event}.{i}"
                if key == "email_notifications":
                    if isinstance(item, str) and "@" in item:
                        out.setdefault(event, []).append(item)
                    else:
                        self.add(where, f"{item!r} is not an email address")
                elif isinstance(item, dict) and "id" in item and "url" not in item:
                    self.add(f"{where}.id", "webhook destinations by id are not supported here",
                             hint="give the address instead: - url: https://…")
                elif isinstance(item, dict) and isinstance(item.get("url"), str) and set(item) == {"url"}:
                    out.setdefault(event, []).append(item["url"])
                else:
                    self.add(where, "a webhook entry must be {url: https://…}")
        return out

    def references(self, path: str, raw_tasks: Any, raw_parameters: Any, parameters: dict[str, str],
                   tasks: list[Task]) -> None:
        """Dynamic value references (``{{job.run_id}}``…) in parameters: each must be one the runner
        fills in (see ``references``)."""
        from streamling.bundle.references import check

        deps = {t.key: t.depends_on for t in tasks}

        def upstream(key: str) -> set[str]:
            seen: set[str] = set()
            todo = list(deps.get(key, []))
            while todo:
                dep = todo.pop()
                if dep not in seen:
                    seen.add(dep)
                    todo.extend(deps.get(dep, []))
            return seen

        places: list[tuple[str, Any, set[str], bool]] = [
            (f"{path}.parameters.{i}.default", _dict(item).get("default"), set(), False)
            for i, item in enumerate(_list(raw_parameters))]

        def add_places(where: str, item: Any, before: set[str], in_loop: bool) -> None:
            """The texts of a task that may hold references (``{{input}}`` only in a for-each's task)."""
            for kind in PAYLOADS:
                spec = _dict(_dict(item).get(kind))
                if kind == "for_each_task" and spec:
                    places.append((f"{where}.{kind}.inputs", spec.get("inputs"), before, False))
                    add_places(f"{where}.{kind}.task", spec.get("task"), before, True)
                    continue
                named = _dict(spec.get("parameters"))  # a SQL task's parameters are named
                texts = [*(("base_parameters", k, v) for k, v in _dict(spec.get("base_parameters")).items()),
                         *(("parameters", k, v) for k, v in (named.items() if named else
                                                             enumerate(_list(spec.get("parameters"))))),
                         *(("named_parameters", k, v) for k, v in _dict(spec.get("named_parameters")).items()),
                         *(("job_parameters", k, v) for k, v in _dict(spec.get("job_parameters")).items())]
                places.extend((f"{where}.{kind}.{group}.{k}", v, before, in_loop) for group, k, v in texts)
                places.extend((f"{where}.{kind}.{side}", spec.get(side), before, in_loop) for side in ("left", "right"))

        for i, item in enumerate(_list(raw_tasks)):
            add_places(f"{path}.tasks.{i}", item, upstream(str(_dict(item).get("task_key"))), False)
        for where, value, before, in_loop in places:
            if isinstance(value, str):
                for problem in check(value, parameters, sorted(before), iteration=in_loop):
                    self.add(where, problem, code="bundle_unknown_reference",
                             hint="Databricks' dynamic value references: {{job.run_id}}, {{job.parameters.<name>}}, "
                                  "{{task.name}}, {{job.start_time.iso_date}}, …")

    def task(self, job: str, path: str, body: Any) -> Task | None:
        if not isinstance(body, dict):
            return None
        key = self.str_(body, "task_key", path)
        if key is None:
            self.add(f"{path}.task_key", "a task has no task_key", hint="give every task a task_key, unique in its job")
            return None
        self.node = (key, "task")
        for payload in UNSUPPORTED_PAYLOADS:
            if payload in body:
                self.add(f"{path}.{payload}", f"{payload} is not supported", code="bundle_unsupported",
                         hint="use notebook_task, spark_python_task, python_wheel_task, sql_task or run_job_task")
        given = [p for p in body if p in PAYLOADS or p in UNSUPPORTED_PAYLOADS]
        if len(given) > 1:
            self.add(f"{path}.{given[1]}", f"has {len(given)} payloads ({', '.join(given)}); a task runs exactly one",
                     hint="split it into tasks ordered with depends_on")
        elif not given:
            self.add(path, "has nothing to run",
                     hint="give it a notebook_task, spark_python_task, python_wheel_task, sql_task, run_job_task "
                          "or condition_task")
        depends = [dep for i, item in enumerate(_list(body.get("depends_on")))
                   if (dep := self.str_(_dict(item), "task_key", f"{path}.depends_on.{i}", required=True))]
        outcomes: dict[str, str] = {}
        for i, item in enumerate(_list(body.get("depends_on"))):
            outcome = _dict(item).get("outcome")
            if outcome is None or not isinstance(_dict(item).get("task_key"), str):
                continue
            if str(outcome).lower() not in ("true", "false"):
                self.add(f"{path}.depends_on.{i}.outcome", f"outcome is '{outcome}'; a condition task's outcome is "
                         "\"true\" or \"false\"", hint='outcome: "true"')
            else:
                outcomes[str(_dict(item)["task_key"])] = str(outcome).lower()
        run_if = str(body.get("run_if") or "ALL_SUCCESS")
        if run_if not in RUN_IF:
            self.add(f"{path}.run_if", f"run_if is '{run_if}'{did_you_mean(run_if, list(RUN_IF))}",
                     hint=f"one of {', '.join(RUN_IF)}")
        kind = next((p for p in PAYLOADS if p in body), "notebook_task")
        where = f"{path}.{kind}"
        spec = _dict(body.get(kind))
        notebook = python_file = package = entry = sql_file = run_job = None
        for_each: ForEach | None = None
        pipeline: str | None = None
        full_refresh = False
        condition: dict[str, str] | None = None
        job_parameters: dict[str, str] = {}
        base_parameters = self.strings(spec, "base_parameters", where)
        parameters = [_text(p) for p in _list(spec.get("parameters"))]
        if kind == "notebook_task" and "notebook_task" in body:
            raw = self.str_(spec, "notebook_path", where, required=True)
            notebook = self.notebook(f"{where}.notebook_path", raw) if raw is not None else None
        elif kind == "spark_python_task":
            raw = self.str_(spec, "python_file", where, required=True)
            python_file = self.python_file(f"{where}.python_file", raw) if raw is not None else None
        elif kind == "python_wheel_task":
            package = self.str_(spec, "package_name", where, required=True)
            entry = self.str_(spec, "entry_point", where, required=True)
            if package is not None and package != "streamling" and not body.get("libraries") \
                    and body.get("environment_key") is None:
                self.add(f"{where}.package_name", f"package_name is '{package}', but the task installs no wheel",
                         hint="add libraries: [{whl: ./dist/*.whl}] (built by artifacts), or an environment_key "
                              "whose dependencies provide it")
            named = _dict(spec.get("named_parameters"))
            if named and parameters:
                self.add(f"{where}.named_parameters", "has both parameters and named_parameters",
                         hint="keep one of them")
            elif named:  # Databricks passes them as --name=value
                parameters = [f"--{k}={_text(v)}" for k, v in named.items()]
        elif kind == "condition_task":
            op = self.str_(spec, "op", where, required=True)
            if op is not None and op not in CONDITION_OPS:
                self.add(f"{where}.op", f"op is '{op}'{did_you_mean(op, list(CONDITION_OPS))}",
                         hint=f"one of {', '.join(CONDITION_OPS)}")
            missing = [side for side in ("left", "right") if spec.get(side) is None]
            for side in missing:
                self.add(f"{where}.{side}", f"a condition task needs '{side}'",
                         hint="left and right are values or references such as {{tasks.t.values.rows}}")
            if op in CONDITION_OPS and not missing:
                condition = {"op": op, "left": _text(spec["left"]), "right": _text(spec["right"])}
        elif kind == "sql_task":
            for other in ("query", "dashboard", "alert"):
                if other in spec:
                    self.add(f"{where}.{other}", f"sql_task.{other} is not supported here: a SQL task runs a file "
                             "of statements on the target's Spark", hint="sql_task: {file: {path: ./report.sql}}",
                             code="bundle_unsupported")
            if "file" not in spec and not any(o in spec for o in ("query", "dashboard", "alert")):
                self.add(where, "sql_task has no file: a SQL task runs a file of statements here",
                         hint="sql_task: {file: {path: ./report.sql}}")
            elif "file" in spec:
                raw = self.str_(_dict(spec.get("file")), "path", f"{where}.file", required=True)
                sql_file = self.sql_file(f"{where}.file.path", raw) if raw is not None else None
            base_parameters = self.strings(spec, "parameters", where)
            parameters = []
        elif kind == "for_each_task":
            for_each = self.for_each(job, key, where, spec, body)
        elif kind == "pipeline_task":
            pipeline = self.str_(spec, "pipeline_id", where, required=True)
            full_refresh = self.bool_(spec, "full_refresh", where)
        elif kind == "run_job_task":
            for other in ("notebook_params", "python_params", "jar_params", "python_named_params",
                          "spark_submit_params", "sql_params", "dbt_commands"):
                if other in spec:
                    self.add(f"{where}.{other}", f"run_job_task.{other} is not supported here",
                             hint="pass the run's values as job_parameters (the job declares them as parameters)",
                             code="bundle_unsupported")
            run_job = self.str_(spec, "job_id", where, required=True)
            job_parameters = self.strings(spec, "job_parameters", where)
        libraries = self.libraries(path, body.get("libraries"), self.environments, body.get("environment_key"))
        cluster = self.cluster(path, body)
        return Task(
            key=key, depends_on=depends, libraries=libraries,
            spark_conf=self.strings(cluster, "spark_conf", path), spark_env_vars=self.strings(cluster, "spark_env_vars",
                                                                                            path),
            kind=cast(Literal["notebook", "spark_python", "python_wheel", "condition", "sql", "run_job", "for_each",
                               "pipeline"], kind[:-5]),
            condition=condition, outcomes=outcomes, run_if=run_if, sql_file=sql_file, run_job=run_job,
            for_each=for_each, pipeline=pipeline, full_refresh=full_refresh,
            job_parameters=job_parameters, notebook_path=notebook, base_parameters=base_parameters,
            python_file=python_file, package_name=package, entry_point=entry, parameters=parameters,
            max_retries=self.int_(body, "max_retries", path, 0, -1),
            min_retry_interval_millis=self.int_(body, "min_retry_interval_millis", path, 0, 0),
            retry_on_timeout=self.bool_(body, "retry_on_timeout", path),
            timeout_seconds=self.int_(body, "timeout_seconds", path, 0, 0), source=self.ctx.source(path))

    def locate(self, path: str, raw: str, what: str) -> tuple[Path, str, str]:
        """A path relative to the YAML file that declares it (Databricks' rule), how to show it, and a hint."""
        file, _ = self.ctx.where(path)
        resolved = Path(os.path.normpath(file.path.parent / Path(raw).expanduser()))
        return resolved, _rel(resolved, self.ctx.root), f"{what} is relative to {file.rel}, the file that declares it"

    def inside(self, path: str, resolved: Path, what: str) -> bool:
        """Deploy snapshots the bundle folder, so a file outside it would be missing on the target."""
        if resolved.is_relative_to(self.ctx.root):
            return True
        self.add(path, f"{what} {resolved} is outside the bundle folder {self.ctx.root}",
                 hint="deploy snapshots only the bundle folder: move it inside")
        return False

    def notebook(self, path: str, raw: str) -> Path | None:
        resolved, shown, hint = self.locate(path, raw, "notebook_path")
        # the extension may be left out
        candidates = [resolved] if resolved.suffix in (".ipynb", ".py", ".sql") else [
            resolved.with_name(resolved.name + ext) for ext in (".ipynb", ".py", ".sql")]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            tried = " (tried .ipynb, .py and .sql)" if len(candidates) > 1 else ""
            self.add(path, f"notebook {shown} does not exist{tried}", hint=hint, code="bundle_missing_file")
            return None
        if not self.inside(path, found, "notebook"):
            return None
        if found.suffix in (".py", ".sql"):
            header = NOTEBOOK_HEADER if found.suffix == ".py" else SQL_NOTEBOOK_HEADER
            with found.open(encoding="utf-8", errors="replace") as handle:
                first = handle.readline().lstrip("\ufeff").rstrip()
            if first != header:
                self.add(path, f"{_rel(found, self.ctx.root)} is not a notebook: a source notebook starts with "
                               f"'{header}'", hint="add that line at the top" + (
                                   ", or run the file as spark_python_task.python_file" if found.suffix == ".py" else
                                   ""))
                return None
        return found

    def for_each(self, job: str, key: str, where: str, spec: dict[str, Any], body: dict[str, Any]) -> ForEach | None:
        """A for-each task: its nested task becomes a hidden job run once per input (``{{input}}``)."""
        raw = spec.get("inputs")
        if raw is None:
            self.add(where, "a for_each_task needs inputs", hint='inputs: \'["a", "b"]\' or a reference such as '
                     '"{{tasks.list.values.items}}"')
            return None
        inputs = json.dumps(raw) if isinstance(raw, list) else _text(raw)
        if "{{" not in inputs:
            try:
                parsed = json.loads(inputs)
            except ValueError:
                parsed = None
            if not isinstance(parsed, list):
                shown = inputs if len(inputs) <= 60 else inputs[:59] + "…"
                self.add(f"{where}.inputs", f"inputs {shown!r} is not a JSON array",
                         hint='e.g. inputs: \'["a", "b"]\' (or a reference to a task value or job parameter)')
        concurrency = self.int_(spec, "concurrency", where, 1, 1)
        if concurrency > 100:
            self.add(f"{where}.concurrency", f"concurrency is {concurrency}; Databricks allows at most 100",
                     hint="concurrency: 100 or less")
        nested_body = spec.get("task")
        if not isinstance(nested_body, dict):
            self.add(where, "a for_each_task needs the task it runs per input",
                     hint="task: {task_key: one, notebook_task: {notebook_path: …, base_parameters: {x: "
                          "'{{input}}'}}}")
            return None
        inner = [p for p in nested_body if p in PAYLOADS]
        if inner and inner[0] in ("for_each_task", "condition_task"):
            self.add(f"{where}.task.{inner[0]}", f"a for_each_task cannot run a {inner[0]}",
                     hint="run a notebook, Python, wheel, SQL or run-job task per input")
            return None
        if nested_body.get("depends_on"):
            self.add(f"{where}.task.depends_on", "the task of a for_each_task has no dependencies of its own",
                     hint="give the for_each_task itself depends_on")
        nested = self.task(job, f"{where}.task", nested_body)
        self.node = (key, "task")
        if nested is None:
            return None
        hidden = f"{job}[{key}]"
        self.iteration_jobs[hidden] = Job(
            key=hidden, name=f"{job} · {key} (one iteration)", tasks=[nested], parameters={}, schedule=None,
            periodic=None, continuous=None, max_concurrent_runs=1000, timeout_seconds=0, tags={},
            webhook_notifications={}, email_notifications={}, source=self.ctx.source(f"{where}.task"),
            iteration_of=(job, key))
        return ForEach(inputs, concurrency, hidden)

    def sql_file(self, path: str, raw: str) -> Path | None:
        resolved, shown, hint = self.locate(path, raw, "sql_task.file.path")
        if not resolved.is_file():
            self.add(path, f"SQL file {shown} does not exist", hint=hint, code="bundle_missing_file")
            return None
        return resolved if self.inside(path, resolved, "SQL file") else None

    def python_file(self, path: str, raw: str) -> Path | None:
        resolved, shown, hint = self.locate(path, raw, "python_file")
        if not resolved.is_file():
            self.add(path, f"python file {shown} does not exist", hint=hint, code="bundle_missing_file")
            return None
        return resolved if self.inside(path, resolved, "python file") else None

    def check_run_jobs(self, jobs: Mapping[str, Job]) -> None:
        """Each run_job_task names a job of this bundle with the parameters it declares, and no job
        ends up running itself (``a -> b -> a``), which would never finish."""
        calls: dict[str, list[str]] = {}
        for key, job in jobs.items():
            for i, task in enumerate(job.tasks):
                if task.run_job is None:
                    continue
                where = f"resources.jobs.{key}.tasks.{i}.run_job_task"
                target = jobs.get(task.run_job)
                if target is None:
                    self.ctx.add(f"{where}.job_id", f"runs job '{task.run_job}', which this bundle "
                                 f"does not define{did_you_mean(task.run_job, list(jobs))}",
                                 hint="job_id: ${resources.jobs.<key>.id}", node=task.key, node_kind="task")
                    continue
                calls.setdefault(key, []).append(task.run_job)
                for name in task.job_parameters:
                    if name not in target.parameters:
                        self.ctx.add(f"{where}.job_parameters.{name}", f"job '{task.run_job}' declares no parameter "
                                     f"'{name}'{did_you_mean(name, list(target.parameters))}",
                                     hint=f"declare it in job '{task.run_job}' (parameters: [{{name: {name}, "
                                          "default: …}]) or drop it", node=task.key, node_kind="task")
        for start in calls:
            todo, seen = [(start, [start])], set()
            while todo:
                node, trail = todo.pop()
                for callee in calls.get(node, []):
                    if callee == start:
                        self.ctx.add(f"resources.jobs.{start}", "jobs run each other in a cycle: "
                                     f"{' -> '.join(trail + [start])}", hint="a run_job_task may not lead back to "
                                     "its own job", code="bundle_cycle")
                        todo = []
                        break
                    if callee not in seen:
                        seen.add(callee)
                        todo.append((callee, trail + [callee]))

    def check_graph(self, job: str, path: str, tasks: list[Task]) -> None:
        """Unique task keys, dependencies inside the job, and no cycles (reported as ``a -> b -> a``)."""
        first: dict[str, int] = {}
        for i, task in enumerate(tasks):
            if task.key in first:
                self.add(f"{path}.tasks.{i}.task_key", f"task_key '{task.key}' is used twice",
                         hint=f"task keys are unique per job; the first is at {tasks[first[task.key]].source}")
            first.setdefault(task.key, i)
        for i, task in enumerate(tasks):
            for j, dep in enumerate(task.depends_on):
                if dep not in first:
                    others = [k for k in first if k != task.key]
                    self.ctx.add(f"{path}.tasks.{i}.depends_on.{j}.task_key",
                                 f"depends on '{dep}', which is not a task of job '{job}'{did_you_mean(dep, others)}",
                                 hint=f"tasks in this job: {', '.join(others) or 'none'}", node=task.key,
                                 node_kind="task")
        conditions = {t.key for t in tasks if t.kind == "condition"}
        for i, task in enumerate(tasks):
            for dep in task.outcomes:
                if dep in first and dep not in conditions:
                    self.add(f"{path}.tasks.{i}.depends_on", f"depends on the outcome of '{dep}', which is not a "
                             "condition task", hint="outcome only follows a condition_task; remove it")
        graph = {t.key: [d for d in t.depends_on if d in first] for t in tasks}
        state: dict[str, int] = {}

        def visit(node: str, stack: list[str]) -> None:
            state[node] = 1
            stack.append(node)
            for dep in graph.get(node, []):
                if state.get(dep) == 1:  # back edge: the stack from dep to here is a cycle
                    cycle = stack[stack.index(dep):]
                    where = f"{path}.tasks.{first[node]}.depends_on"
                    if len(cycle) == 1:
                        self.add(where, f"task '{node}' depends on itself", hint="remove that depends_on entry")
                    else:
                        self.add(where, f"tasks depend on each other in a cycle: {' -> '.join([*cycle, dep])}",
                                 hint="remove one of these depends_on entries")
                elif dep not in state:
                    visit(dep, stack)
            stack.pop()
            state[node] = 2

        for task in tasks:
            if task.key not in state:
                visit(task.key, [])
