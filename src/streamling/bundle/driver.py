"""One task attempt of a deployed job: ``python -m streamling.bundle.driver …`` (started by the runner).

``main`` runs one attempt (or, with ``--standby``, first waits warm for one: ``standby``); ``run_task``
runs the task by its kind. A notebook task compiles its deployed notebook snapshot with the run's
parameters and runs the pipeline on the target's Spark master (client mode: this process is the
Spark driver, the executors run on the cluster). SIGTERM finishes the current epoch and exits 0, so
the runner can stop a run or move it to a new deployment without leaving an epoch half-written; a
killed driver resumes from its checkpoint on the next attempt. A notebook task's driver stays warm
across redeploys (``redeploys``); pipeline tasks run Spark's pipelines (``pipeline_task``).

The exit code is also written to ``<log>.exit``: a runner that restarted meanwhile reads it
there, since it cannot ``wait()`` on a process it did not start. With a shared run store the
driver is fenced by it (``fence``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from streamling.bundle.fence import Fence
from streamling.bundle.pipeline_task import pipeline_update
from streamling.bundle.redeploys import Redeploys
from streamling.bundle.references import RunContext
from streamling.bundle.standby import Standby
from streamling.bundle.task_definition import (
    load_deployment,
    reference_filler,
    resolved_parameters,
    state_defaults,
    task_config,
    task_definition,
)
from streamling.errors import StreamlingError

log = logging.getLogger("streamling.bundle.driver")


def run_task(root: Path, version: int, job_key: str, task_key: str, params: dict[str, str],
             log_path: Path | None = None, context: RunContext | None = None) -> int:
    from streamling.bundle.workspace import Workspace
    from streamling.notebook.dbutils import TASK_VALUES_ENV, TASK_VALUES_FILE_ENV, values_file

    ws = Workspace(str(root))
    deployment = load_deployment(ws, root, version)
    job = deployment["jobs"][job_key]
    task = next(t for t in job["tasks"] if t["task_key"] == task_key)
    # dbutils.jobs.taskValues in the task's code: what upstream tasks set, and where to put its own
    os.environ[TASK_VALUES_ENV] = json.dumps(context.task_values if context is not None else {})
    if log_path is not None:
        values_file(log_path).unlink(missing_ok=True)
        os.environ[TASK_VALUES_FILE_ENV] = str(values_file(log_path))
    values = resolved_parameters(job, task, params, context)
    os.environ["STREAMLING_JOB_PARAMETERS"] = json.dumps(values)
    os.environ.update(task.get("spark_env_vars") or {})  # its cluster's environment, on the driver too
    os.environ.update(state_defaults(ws, deployment, task))
    files = Path(deployment["file_path"])
    if task["kind"] == "notebook":
        return _notebook_task(ws, version, job_key, task_key, params, log_path, context)
    if task["kind"] == "sql":
        return _executed_notebook(ws, version, job_key, task, log_path)
    if task["kind"] == "pipeline":
        return pipeline_update(deployment, task)
    # A plain CLI task gets the target's settings as STREAMLING__ variables (the same layer users
    # have), with checkpoints under the target root rather than next to wherever it runs.
    from streamling.config import env_variables

    config = task_config(deployment, task)
    os.environ.update(env_variables({"state_dir": deployment["state_dir"], **config}))
    arguments = [reference_filler(job, params, context)(a) for a in task["parameters"]]
    if task["kind"] == "spark_python" or (task["kind"] == "python_wheel" and task.get("package_name") != "streamling"):
        # The task's own SparkSession.builder.getOrCreate() gets the target's master and Spark settings.
        os.environ["PYSPARK_SUBMIT_ARGS"] = _submit_args(config)
    if task["kind"] in ("spark_python", "python_wheel"):
        from streamling.notebook.dbutils import provide_databricks_runtime

        provide_databricks_runtime()  # code written for Databricks imports dbutils and spark from there
    if task["kind"] == "spark_python":
        return _python_file(files / task["python_file"], arguments)
    if task["kind"] == "python_wheel" and task.get("package_name") != "streamling":
        os.chdir(files)
        return _wheel_entry_point(str(task["package_name"]), str(task["entry_point"]), arguments)
    # A wheel task of Streamling itself is the `streamling` command: the CLI owns its parsing,
    # logging and exit codes, so the driver runs that command's entry point rather than a copy.
    from streamling.cli import main

    os.chdir(files)
    return main(arguments)


def _submit_args(config: dict[str, Any]) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a session the task's own code builds: master and Spark settings."""
    import shlex

    spark = config.get("spark") or {}
    args = ["--master", str(spark.get("master") or "local[*]")]
    for key, value in (spark.get("conf") or {}).items():
        args += ["--conf", f"{key}={value}"]
    return " ".join(shlex.quote(a) for a in args) + " pyspark-shell"


def _python_file(script: Path, arguments: list[str]) -> int:
    """A Python file task, run in this process as ``python FILE ARGS`` would run it (its folder first
    on ``sys.path``, ``__name__ == "__main__"``), so what it prints passes the secrets' redaction."""
    import runpy

    os.chdir(script.parent)
    sys.argv = [str(script), *arguments]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as done:
        return _exit_status(done)
    return 0


def _exit_status(done: SystemExit) -> int:
    """The status ``sys.exit`` gives, as the interpreter would: ``sys.exit("message")`` prints the
    message and is status 1."""
    if done.code is None or isinstance(done.code, int):
        return int(done.code or 0)
    print(done.code, file=sys.stderr)
    return 1


def _wheel_entry_point(package: str, entry_point: str, arguments: list[str]) -> int:
    """A wheel task as Databricks runs it: the entry point ``entry_point`` the package's distribution
    declares (console scripts first), else the function ``package.entry_point``; ``sys.argv`` is the
    package name and the task's parameters."""
    import importlib
    from importlib import metadata

    def norm(name: str) -> str:
        return name.lower().replace("-", "_").replace(".", "_")

    found = sorted((ep for ep in metadata.entry_points(name=entry_point)
                    if ep.dist is not None and norm(ep.dist.name) == norm(package)),
                   key=lambda ep: ep.group != "console_scripts")
    try:
        function = found[0].load() if found else getattr(importlib.import_module(package), entry_point)
    except ModuleNotFoundError as exc:
        raise StreamlingError(f"package '{package}' is not installed in the task's environment ({exc})",
                              code="wheel_missing", hint="add its wheel to the task's libraries (built by the "
                              "bundle's artifacts) or its environment's dependencies") from None
    except AttributeError:
        raise StreamlingError(f"package '{package}' has no entry point or function '{entry_point}'",
                              code="wheel_entry_point_missing",
                              hint="declare it in the wheel's [project.scripts] or name a function of the package"
                              ) from None
    sys.argv = [package, *arguments]
    try:
        result = function()
    except SystemExit as done:
        return _exit_status(done)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def _notebook_task(ws: Any, version: int, job_key: str, task_key: str, params: dict[str, str],
                   log_path: Path | None, context: RunContext | None = None) -> int:
    from streamling.execution import execute
    from streamling.plugins.discovery import load_plugins
    from streamling.plugins.host import check_configured_plugins

    task = next(t for t in load_deployment(ws, ws.root, version)["jobs"][job_key]["tasks"] if t["task_key"] == task_key)
    if task.get("executes"):
        return _executed_notebook(ws, version, job_key, task, log_path)
    first = task_definition(ws, version, job_key, task_key, params, context)
    os.chdir(first.cwd)
    # As the CLI does: the target's plugin.path (a change to it needs a new driver, see handover)
    load_plugins(first.settings.plugin.path)
    check_configured_plugins(first.settings)
    log.info("job task '%s': notebook %s, deployment %s, parameters %s, master %s", task_key, first.notebook,
             version, json.dumps(first.values), first.settings.spark.master)
    redeploys = Redeploys(ws, job_key, task_key, params, first, log_path, context) if log_path is not None else None
    return execute(first.spec, first.settings, stop_after_secs=first.seconds, successor=redeploys)


def _executed_notebook(ws: Any, version: int, job_key: str, task: dict[str, Any], log_path: Path | None) -> int:
    """A notebook with Python, SQL or shell cells, or a SQL task's file: its driver runs every cell
    (``NotebookJob``; a SQL file is one SQL cell) on a SparkSession built with the target's settings."""
    from streamling.bundle.notebook_job import NotebookJob
    from streamling.bundle.notebook_reader import Cell
    from streamling.bundle.task_build import default_application_id
    from streamling.config import deep_merge, env_variables, load_settings
    from streamling.notebook.dbutils import output_file
    from streamling.plugins.discovery import load_plugins
    from streamling.plugins.host import check_configured_plugins

    deployment = load_deployment(ws, ws.root, version)
    files = Path(deployment["file_path"])
    if task["kind"] == "sql":
        path, name = files / task["sql_file"], str(task["sql_file"])
        cells: list[Cell] | None = [Cell(1, "code", path.read_text(encoding="utf-8"), default_language="sql")]
    else:
        path, name, cells = ws.deployment_dir(version) / task["notebook_snapshot"], str(task["notebook_path"]), None
    cwd = files / Path(name).parent
    cwd.mkdir(parents=True, exist_ok=True)
    config = task_config(deployment, task)
    application_id = task.get("application_id") or default_application_id(
        str(deployment.get("name") or "bundle"), job_key, task["task_key"])
    target = deep_merge(config, {"application_id": application_id,
                                 "state_dir": config.get("state_dir") or deployment["state_dir"]})
    # The magics load settings as a notebook does (config file, then STREAMLING__ variables): the
    # target's settings and this task's checkpoint reach them as variables, the layer users have.
    os.environ.update(env_variables(target))
    settings = load_settings(task.get("config_name"), cwd=cwd, overrides=target)
    load_plugins(settings.plugin.path)
    check_configured_plugins(settings)
    if log_path is not None:
        output_file(log_path).unlink(missing_ok=True)
    log.info("job task '%s': %s %s (its cells run), deployment %s, master %s", task["task_key"],
             "SQL file" if cells else "notebook", name, version, settings.spark.master)
    job = NotebookJob(path, name, cwd, settings, config_name=task.get("config_name"),
                      output_path=output_file(log_path) if log_path is not None else None,
                      app_name=f"{job_key}.{task['task_key']}", cells=cells)
    return job.run()


def _pull_secrets(root: Path) -> None:
    """An object-store root's secret scopes as they are now (put on any host), in the task's own
    process rather than the runner's loop; an unreachable store leaves this host's copy."""
    from streamling.bundle.workspace import Workspace

    ws = Workspace(str(root))
    if ws.remote is None:
        return
    try:
        ws.pull_secrets()
    except StreamlingError as exc:
        log.warning("cannot read the secret scopes of %s (%s); the task reads this host's copy", ws.where,
                    exc.headline())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamling-driver")
    p.add_argument("--root", required=True)
    p.add_argument("--deployment", type=int, required=True)
    p.add_argument("--job", help="required, except for a pooled warm driver (--standby without it)")
    p.add_argument("--task", help="required, except for a pooled warm driver (--standby without it)")
    p.add_argument("--params", default="{}")
    p.add_argument("--exit-file")
    p.add_argument("--attempt", type=int, help="the attempt's id in the run store (heartbeat and fencing)")
    p.add_argument("--context", help="the attempt's run context as JSON (fills in {{job.run_id}} and the like)")
    p.add_argument("--standby", help="start warm and wait for this file: it names the attempt to run (see Standby)")
    args = p.parse_args(argv)
    if not args.standby and not (args.job and args.task):
        p.error("--job and --task are required (only a pooled warm driver, started with --standby, takes its task "
                "from the runner)")
    from streamling.execution import STATS_FILE_ENV, setup_logging
    from streamling.secrets import SECRETS_DIR_ENV, RedactingStream
    from streamling.util import free_port

    # What the task prints or logs never shows a secret it read (dbutils.secrets), as on Databricks.
    sys.stdout = RedactingStream(sys.stdout)  # type: ignore[assignment]
    sys.stderr = RedactingStream(sys.stderr)  # type: ignore[assignment]
    os.environ[SECRETS_DIR_ENV] = str(Path(args.root) / "secrets")
    setup_logging(os.environ.get("STREAMLING__LOG_FORMAT", "text"), debug=False)
    if args.standby:
        try:
            attempt = Standby(args).wait()
        except Exception:  # noqa: BLE001 - a standby that cannot start is replaced; its log says why
            log.exception("the warm standby driver could not start")
            return 2
        if attempt is None:
            return 0
        args.job, args.task = attempt.get("job", args.job), attempt.get("task", args.task)
        args.deployment, args.params, args.exit_file = attempt["deployment"], attempt["params"], attempt["exit_file"]
        args.attempt, args.context = attempt["attempt"], attempt["context"]
    _pull_secrets(Path(args.root))
    if args.exit_file:
        # The run's figures next to its log (``bundle runs`` / ``summary`` show them), and an admin API
        # on a port of its own: several drivers run side by side (set admin_api_port to pin one).
        os.environ[STATS_FILE_ENV] = args.exit_file.removesuffix(".exit") + ".stats.json"
        os.environ.setdefault("STREAMLING__ADMIN_API_PORT", str(free_port()))
    code = 2
    try:
        if args.attempt is not None:
            from streamling.bundle.workspace import Workspace

            if Workspace(args.root).store_settings().store != "sqlite":
                Fence(Path(args.root), args.attempt, Path(args.exit_file) if args.exit_file else None)
        log_path = Path(args.exit_file.removesuffix(".exit")) if args.exit_file else None
        context = RunContext(**json.loads(args.context)) if args.context else None
        code = run_task(Path(args.root), args.deployment, args.job, args.task, json.loads(args.params), log_path,
                        context)
    except StreamlingError as exc:
        log.error("%s", exc.describe())
        code = 1 if exc.user else 2
    except Exception:  # noqa: BLE001 - reported in the driver log, the run fails
        log.exception("the job task failed")
        code = 2
    finally:
        if args.exit_file:
            Path(args.exit_file).write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
