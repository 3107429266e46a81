"""Which keys a bundle file may hold at each level, and which are Databricks-only.

One tree of shapes, checked before any value is read: an unknown key is an error with a did-you-mean, a key
that configures Databricks itself (clusters' sizes, permissions, notifications we do not raise…) is accepted
with a warning saying why it has no effect, so a bundle shared with Databricks validates on both, and a
Databricks feature we cannot run is left to the builder, which says what to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from streamling.bundle.model import UNSUPPORTED_PAYLOADS
from streamling.bundle.tree import Context, describe, join_path
from streamling.util import did_you_mean


@dataclass(frozen=True)
class Keys:
    """A mapping with fixed keys; ``no_effect`` keys are accepted with a warning saying why, and ``rejected``
    ones (Databricks features we cannot run) are left to the builder, which says what to use instead."""

    keys: Mapping[str, Shape]
    no_effect: Mapping[str, str] = field(default_factory=dict)
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True)
class Named:
    """A mapping from user-chosen names to one shape (jobs, targets, variables)."""

    item: Shape


@dataclass(frozen=True)
class Items:
    """A list of one shape (tasks, libraries, include patterns)."""

    item: Shape


Shape = Keys | Named | Items | None  # None: a value checked by the builder

_COMPUTE = "tasks run on the target's Spark master (config.spark.master)"
_SIZE = "a cluster's size and runtime come from the target's Spark master"
#: a Databricks cluster spec: its Spark settings apply to the task's Spark, the rest has no effect
CLUSTER = Keys({"spark_conf": Named(None), "spark_env_vars": Named(None)}, {
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
_WORKSPACE = Keys({"root_path": None, "file_path": None}, {
    k: _DATABRICKS for k in ("host", "profile", "artifact_path", "state_path", "resource_path", "auth_type",
                             "client_id", "account_id", "cluster_id", "serverless_compute_id", "azure_client_id",
                             "azure_tenant_id", "azure_workspace_resource_id", "azure_environment",
                             "azure_login_app_id", "azure_use_msi", "google_service_account", "metadata_service_url")})
_TASK = Keys({
    "task_key": None,
    "depends_on": Items(Keys({"task_key": None, "outcome": None})),
    "notebook_task": Keys({"notebook_path": None, "base_parameters": Named(None)},
                          {"source": "notebooks are read from the bundle folder",
                           "warehouse_id": "notebooks run on Spark, not on a SQL warehouse"}),
    "spark_python_task": Keys({"python_file": None, "parameters": Items(None)},
                              {"source": "files are read from the bundle folder"}),
    "python_wheel_task": Keys({"package_name": None, "entry_point": None, "parameters": Items(None),
                               "named_parameters": Named(None)}),
    "condition_task": Keys({"op": None, "left": None, "right": None}), "run_if": None,
    "sql_task": Keys({"file": Keys({"path": None, "source": None}), "parameters": Named(None)},
                     {"warehouse_id": "SQL runs on the target's Spark, not on a SQL warehouse"},
                     rejected=("query", "dashboard", "alert")),
    "run_job_task": Keys({"job_id": None, "job_parameters": Named(None)},
                         {"pipeline_params": "a run's pipelines refresh as their own pipeline_task says"},
                         rejected=("notebook_params", "python_params", "jar_params", "python_named_params",
                                   "spark_submit_params", "sql_params", "dbt_commands")),
    "max_retries": None, "min_retry_interval_millis": None, "retry_on_timeout": None, "timeout_seconds": None,
    "libraries": Items(Keys({"whl": None, "pypi": Keys({"package": None, "repo": None}), "requirements": None},
                            rejected=("jar", "maven", "egg", "cran"))),
    "environment_key": None, "job_cluster_key": None, "existing_cluster_id": None, "new_cluster": CLUSTER,
    "pipeline_task": Keys({"pipeline_id": None, "full_refresh": None}),
}, {
    "compute_key": _COMPUTE,
    "description": "descriptions are not shown here", "email_notifications": "notifications are set per job here",
    "webhook_notifications": "notifications are set per job here", "notification_settings": _DATABRICKS,
    "health": _NOTIFY, "disable_auto_optimization": _DATABRICKS,
}, UNSUPPORTED_PAYLOADS)
# a for-each task holds a task (the schema is recursive; a nested for-each is refused by the builder)
cast(dict[str, Shape], _TASK.keys)["for_each_task"] = Keys({"inputs": None, "concurrency": None, "task": _TASK})
EVENTS = ("on_start", "on_success", "on_failure")
JOB = Keys({
    "name": None, "tasks": Items(_TASK), "parameters": Items(Keys({"name": None, "default": None})),
    "schedule": Keys({"quartz_cron_expression": None, "timezone_id": None, "pause_status": None}),
    "trigger": Keys({"periodic": Keys({"interval": None, "unit": None}), "pause_status": None},
                    rejected=("file_arrival", "table_update", "table")),
    "continuous": Keys({"pause_status": None}, {"task_retry_mode": "failed tasks are retried per task settings"}),
    "max_concurrent_runs": None, "timeout_seconds": None, "tags": Named(None),
    "webhook_notifications": Keys({e: Items(None) for e in EVENTS}, {
        "on_duration_warning_threshold_exceeded": _NOTIFY, "on_streaming_backlog_exceeded": _NOTIFY}),
    "email_notifications": Keys({e: Items(None) for e in EVENTS}, {
        "on_duration_warning_threshold_exceeded": _NOTIFY, "on_streaming_backlog_exceeded": _NOTIFY,
        "no_alert_for_skipped_runs": "skipped runs send no notification here"}),
    "job_clusters": Items(Keys({"job_cluster_key": None, "new_cluster": CLUSTER})),
    "environments": Items(Keys({"environment_key": None, "spec": Keys(
        {"dependencies": Items(None)},
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
SECRET_SCOPE = Keys({"name": None, "backend_type": None},
                    {"permissions": "a scope's file is readable by the runner's user only"},
                    rejected=("keyvault_metadata",))
_DLT = "it configures Databricks' pipeline service"
PIPELINE = Keys({
    "name": None, "catalog": None, "schema": None, "target": None, "configuration": Named(None),
    "libraries": Items(Keys({"glob": Keys({"include": None}), "file": Keys({"path": None}),
                             "notebook": Keys({"path": None})}, rejected=("jar", "maven", "whl"))),
    "continuous": None, "storage": None,
}, {**{k: _DLT for k in ("clusters", "photon", "serverless", "channel", "edition", "permissions", "notifications",
                         "budget_policy_id", "environment", "root_path", "allow_duplicate_names", "tags", "event_log",
                         "run_as")},
    "development": "a pipeline runs the same way in every target here"})
_RESOURCES = Keys({"jobs": Named(JOB), "secret_scopes": Named(SECRET_SCOPE), "pipelines": Named(PIPELINE),
                   "clusters": Named(CLUSTER)},
                  rejected=RESOURCE_KINDS)
_DEPLOY = "deploy copies the bundle folder as it is"
ARTIFACT = Keys({"type": None, "build": None, "path": None, "files": Items(Keys({"source": None}))},
                {"executable": "build commands run in a POSIX shell here",
                 "dynamic_version": "a wheel is installed by its file here, whatever its version"})
TARGET = Keys({"default": None, "mode": None, "workspace": _WORKSPACE, "variables": Named(None),
               "resources": _RESOURCES, "config": None, "artifacts": Named(ARTIFACT)}, {
    "presets": "development mode's prefix, tags and pauses are fixed here", "run_as": _DATABRICKS,
    "permissions": _DATABRICKS, "cluster_id": _COMPUTE, "compute_id": _COMPUTE,
    "git": "git details are not recorded here", "sync": _DEPLOY,
    "bundle": "bundle settings are not overridden per target here"})
TOP = Keys({
    "bundle": Keys({"name": None, "uuid": None}, {
        "git": "git details are not recorded here", "cluster_id": _COMPUTE, "compute_id": _COMPUTE,
        "deployment": "deployments are versioned under the target's root_path",
        "databricks_cli_version": "the Databricks CLI is not used here", "engine": "deploy has one engine here"}),
    "include": Items(None),
    "variables": Named(Keys({"description": None, "default": None, "type": None}, rejected=("lookup",))),
    "workspace": _WORKSPACE, "resources": _RESOURCES, "targets": Named(TARGET), "config": None,
    "artifacts": Named(ARTIFACT),
    "python": Keys({"venv_path": None, "resources": Items(None), "mutators": Items(None)}),
}, {
    "sync": _DEPLOY, "permissions": _DATABRICKS, "run_as": _DATABRICKS,
    "presets": "development mode's prefix, tags and pauses are fixed here", "experimental": _DATABRICKS,
    "scripts": "deploy runs no scripts here",
}, ("environments",))


def check_keys(ctx: Context, path: str, value: Any, shape: Shape, warn: bool) -> None:
    """Unknown keys (with did-you-mean) are errors; Databricks-only keys are warnings."""
    if shape is None or value is None:
        return
    key = path.rpartition(".")[2] or "the bundle file"
    if isinstance(shape, Items):
        if not isinstance(value, list):
            ctx.add(path, f"'{key}' must be a list (got {describe(value)})", hint="write one '- item' per line")
            return
        for i, item in enumerate(value):
            check_keys(ctx, f"{path}.{i}", item, shape.item, warn)
        return
    if not isinstance(value, dict):
        ctx.add(path, f"'{key}' must be a mapping of keys (got {describe(value)})")
        return
    if isinstance(shape, Named):
        for name, item in value.items():
            check_keys(ctx, join_path(path, name), item, shape.item, warn)
        return
    for name, item in value.items():
        child = join_path(path, name)
        if name in shape.keys:
            check_keys(ctx, child, item, shape.keys[name], warn)
        elif name in shape.no_effect:
            if warn:
                ctx.warn(child, str(name), shape.no_effect[name])
        elif name == "environments" and path == "":
            ctx.add(child, "'environments' is the old name of 'targets'", hint="rename it to targets")
        elif name not in shape.rejected:
            where = f"in {path}" if path else "at the top level"
            ctx.add(child, f"unknown key '{name}' {where}{did_you_mean(str(name), [*shape.keys, *shape.no_effect])}",
                    hint=f"keys that apply here: {', '.join(shape.keys)}", code="bundle_unknown_key")
