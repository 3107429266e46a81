"""What a deployment fixes for one task in its driver: the task's settings and, for a notebook task,
its compiled pipeline (``TaskDefinition``).

Shared by the driver running an attempt, the hot redeploy that compiles a newer deployment of the same
task (``redeploys``) and the standby warming up for it (``standby``), so all three see the same task.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.references import RunContext
from streamling.errors import StreamlingError

if TYPE_CHECKING:
    from streamling.config import Settings


def task_config(deployment: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """The target's runtime settings for this task: its cluster's ``spark_conf`` over the target's
    ``spark.conf``, and its ``spark_env_vars`` on the executors too (``spark.executorEnv.*``)."""
    from streamling.config import deep_merge

    conf = {**(task.get("spark_conf") or {}),
            **{f"spark.executorEnv.{k}": v for k, v in (task.get("spark_env_vars") or {}).items()}}
    config = dict(deployment.get("config") or {})
    return deep_merge(config, {"spark": {"conf": conf}}) if conf else config


def state_defaults(ws: Any, deployment: dict[str, Any], task: dict[str, Any]) -> dict[str, str]:
    """The deployment-defaults variable that gives the task a state backend keeping positions when its
    settings name none (``workspace.default_state_backend``); empty when none is at hand."""
    from streamling.bundle.workspace import default_state_backend
    from streamling.config.settings import DEPLOYMENT_DEFAULTS_ENV

    config = task_config(deployment, task)
    backend = default_state_backend(str(config.get("state_dir") or deployment["state_dir"]),
                                    str((config.get("spark") or {}).get("master") or ""), ws.store_settings())
    return {DEPLOYMENT_DEFAULTS_ENV: json.dumps({"state_backend": backend})} if backend else {}


def reference_filler(job: dict[str, Any], params: dict[str, str], context: RunContext | None) -> Callable[[str], str]:
    """Fills Databricks' dynamic value references into a text for this attempt (none without a
    context: a driver started by hand)."""
    from streamling.bundle.references import job_parameter_values, resolve

    if context is None:
        return lambda text: text
    values = job_parameter_values(job, params)
    return lambda text: resolve(text, context, values)


def resolved_parameters(job: dict[str, Any], task: dict[str, Any], params: dict[str, str],
                context: RunContext | None) -> dict[str, str]:
    from streamling.bundle.task_build import task_parameters

    fill = reference_filler(job, params, context)
    return {k: fill(v) for k, v in task_parameters(job, task, params).items()}


def load_deployment(ws: Any, root: Path, version: int) -> dict[str, Any]:
    deployment = ws.deployment(version)
    if deployment is None:
        raise StreamlingError(f"deployment {version} does not exist under {root}", code="bundle_deployment_missing",
                              hint="deploy again with `streamling bundle deploy`")
    return dict(deployment)


@dataclass
class TaskDefinition:
    """One deployment's version of a notebook task, compiled and ready to run."""

    version: int
    spec: Any
    settings: Settings
    seconds: float | None
    cwd: Path
    values: dict[str, str]
    notebook: str


def task_definition(ws: Any, version: int, job_key: str, task_key: str, params: dict[str, str],
                context: RunContext | None = None) -> TaskDefinition:
    from streamling.bundle.compile import compile_notebook
    from streamling.config import deep_merge, load_settings
    from streamling.spec import parse_pipeline

    deployment = load_deployment(ws, ws.root, version)
    job = deployment["jobs"].get(job_key)
    task = next((t for t in job["tasks"] if t["task_key"] == task_key), None) if job else None
    if task is None or task["kind"] != "notebook":
        raise StreamlingError(f"deployment {version} has no notebook task '{task_key}' in job '{job_key}'",
                              code="bundle_task_missing", hint="deploy the job with this task again")
    values = resolved_parameters(job, task, params, context)
    snapshot = ws.deployment_dir(version) / task["notebook_snapshot"]
    compiled = compile_notebook(snapshot, values)
    # Relative paths in the notebook resolve in its folder of the synced files, as on Databricks.
    cwd = Path(deployment["file_path"]) / Path(task["notebook_path"]).parent
    cwd.mkdir(parents=True, exist_ok=True)
    config = task_config(deployment, task)
    # Checkpoints go under the target root unless the target names shared storage for them
    # (``config: {state_dir: hdfs://…}``), as a CLI task's do (see ``driver.run_task``).
    overrides = deep_merge(config, {"application_id": task["application_id"],
                                    "state_dir": config.get("state_dir") or deployment["state_dir"]})
    if compiled.run.get("rows"):
        overrides["num_records_before_stop"] = int(compiled.run["rows"])
    settings = load_settings(compiled.config_name, cwd=cwd, overrides=overrides)
    spec = parse_pipeline(compiled.to_yaml(), source=f"{task['notebook_path']} (deployment {version})")
    seconds = compiled.run.get("seconds")
    return TaskDefinition(version, spec, settings, float(seconds) if seconds else None, cwd, values,
                       str(task["notebook_path"]))


def target_settings(ws: Any, version: int) -> Settings:
    """A target's runtime settings as deployment ``version`` fixes them for every task (its
    ``config``), before any task's own: what a pooled warm driver builds its session for."""
    from streamling.config import deep_merge, load_settings

    deployment = load_deployment(ws, ws.root, version)
    config = dict(deployment.get("config") or {})
    state_dir = config.get("state_dir") or deployment["state_dir"]
    return load_settings(None, cwd=Path(deployment["file_path"]),
                         overrides=deep_merge(config, {"state_dir": state_dir}))
