"""One task attempt of a deployed job: ``python -m streamling.bundle.driver …`` (started by the runner).

A notebook task compiles its deployed notebook snapshot with the run's parameters and runs the
pipeline on the target's Spark master (client mode: this process is the Spark driver, the
executors run on the cluster). SIGTERM finishes the current epoch and exits 0, so the runner can
stop a run or move it to a new deployment without leaving an epoch half-written; a killed
driver resumes from its checkpoint on the next attempt. A notebook task's driver stays warm
across redeploys: asked by the runner (``Redeploys``), it swaps the new deployment's pipeline in
after the epoch in flight, in the same SparkSession and on the same checkpoint.

The exit code is also written to ``<log>.exit``: a runner that restarted meanwhile reads it
there, since it cannot ``wait()`` on a process it did not start.

With a shared run store (runners on several hosts), the driver heartbeats its attempt there every
second and stops at once, without committing another epoch, when it is fenced (a runner on another
host took over) or when it could not reach the store for half a lease: by the time the lease lets
another runner start this task again from the checkpoint, this driver is gone (``Fence``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle import handover
from streamling.bundle.references import RunContext
from streamling.errors import StreamlingError, ValidationError, first_line

if TYPE_CHECKING:
    from streamling.config import Settings

log = logging.getLogger("streamling.bundle.driver")


def run_task(root: Path, version: int, job_key: str, task_key: str, params: dict[str, str],
             log_path: Path | None = None, context: RunContext | None = None) -> int:
    from streamling.bundle.workspace import Workspace
    from streamling.notebook.dbutils import TASK_VALUES_ENV, TASK_VALUES_FILE_ENV, values_file

    ws = Workspace(str(root))
    deployment = _deployment(ws, root, version)
    job = deployment["jobs"][job_key]
    task = next(t for t in job["tasks"] if t["task_key"] == task_key)
    # dbutils.jobs.taskValues in the task's code: what upstream tasks set, and where to put its own
    os.environ[TASK_VALUES_ENV] = json.dumps(context.task_values if context is not None else {})
    if log_path is not None:
        values_file(log_path).unlink(missing_ok=True)
        os.environ[TASK_VALUES_FILE_ENV] = str(values_file(log_path))
    values = _parameters(job, task, params, context)
    os.environ["STREAMLING_JOB_PARAMETERS"] = json.dumps(values)
    os.environ.update(task.get("spark_env_vars") or {})  # its cluster's environment, on the driver too
    os.environ.update(state_defaults(ws, deployment, task))
    files = Path(deployment["file_path"])
    if task["kind"] == "notebook":
        return _notebook_task(ws, version, job_key, task_key, params, log_path, context)
    if task["kind"] == "sql":
        return _executed_notebook(ws, version, job_key, task, log_path)
    if task["kind"] == "pipeline":
        return _pipeline_update(deployment, task)
    # A plain CLI task gets the target's settings as STREAMLING__ variables (the same layer users
    # have), with checkpoints under the target root rather than next to wherever it runs.
    from streamling.config import env_variables

    config = task_config(deployment, task)
    os.environ.update(env_variables({"state_dir": deployment["state_dir"], **config}))
    arguments = [_filler(job, params, context)(a) for a in task["parameters"]]
    if task["kind"] == "spark_python" or (task["kind"] == "python_wheel" and task.get("package_name") != "streamling"):
        # The task's own SparkSession.builder.getOrCreate() gets the target's master and Spark settings.
        os.environ["PYSPARK_SUBMIT_ARGS"] = _submit_args(config)
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


def _filler(job: dict[str, Any], params: dict[str, str], context: RunContext | None) -> Callable[[str], str]:
    """Fills Databricks' dynamic value references into a text for this attempt (none without a
    context: a driver started by hand)."""
    from streamling.bundle.references import job_parameter_values, resolve

    if context is None:
        return lambda text: text
    values = job_parameter_values(job, params)
    return lambda text: resolve(text, context, values)


def _parameters(job: dict[str, Any], task: dict[str, Any], params: dict[str, str],
                context: RunContext | None) -> dict[str, str]:
    from streamling.bundle.deploy import task_parameters

    fill = _filler(job, params, context)
    return {k: fill(v) for k, v in task_parameters(job, task, params).items()}


def _deployment(ws: Any, root: Path, version: int) -> dict[str, Any]:
    deployment = ws.deployment(version)
    if deployment is None:
        raise StreamlingError(f"deployment {version} does not exist under {root}", code="bundle_deployment_missing",
                              hint="deploy again with `streamling bundle deploy`")
    return dict(deployment)


@dataclass
class _Definition:
    """One deployment's version of a notebook task, compiled and ready to run."""

    version: int
    spec: Any
    settings: Settings
    seconds: float | None
    cwd: Path
    values: dict[str, str]
    notebook: str


def _definition(ws: Any, version: int, job_key: str, task_key: str, params: dict[str, str],
                context: RunContext | None = None) -> _Definition:
    from streamling.bundle.compile import compile_notebook
    from streamling.config import deep_merge, load_settings
    from streamling.spec import parse_pipeline

    deployment = _deployment(ws, ws.root, version)
    job = deployment["jobs"].get(job_key)
    task = next((t for t in job["tasks"] if t["task_key"] == task_key), None) if job else None
    if task is None or task["kind"] != "notebook":
        raise StreamlingError(f"deployment {version} has no notebook task '{task_key}' in job '{job_key}'",
                              code="bundle_task_missing", hint="deploy the job with this task again")
    values = _parameters(job, task, params, context)
    snapshot = ws.deployment_dir(version) / task["notebook_snapshot"]
    compiled = compile_notebook(snapshot, values)
    # Relative paths in the notebook resolve in its folder of the synced files, as on Databricks.
    cwd = Path(deployment["file_path"]) / Path(task["notebook_path"]).parent
    cwd.mkdir(parents=True, exist_ok=True)
    config = task_config(deployment, task)
    # Checkpoints go under the target root unless the target names shared storage for them
    # (``config: {state_dir: hdfs://…}``), as a CLI task's do (see ``run_task``).
    overrides = deep_merge(config, {"application_id": task["application_id"],
                                    "state_dir": config.get("state_dir") or deployment["state_dir"]})
    if compiled.run.get("rows"):
        overrides["num_records_before_stop"] = int(compiled.run["rows"])
    settings = load_settings(compiled.config_name, cwd=cwd, overrides=overrides)
    spec = parse_pipeline(compiled.to_yaml(), source=f"{task['notebook_path']} (deployment {version})")
    seconds = compiled.run.get("seconds")
    return _Definition(version, spec, settings, float(seconds) if seconds else None, cwd, values,
                       str(task["notebook_path"]))


def _notebook_task(ws: Any, version: int, job_key: str, task_key: str, params: dict[str, str],
                   log_path: Path | None, context: RunContext | None = None) -> int:
    from streamling.cli import execute
    from streamling.plugins.discovery import load_plugins
    from streamling.plugins.host import check_configured_plugins

    task = next(t for t in _deployment(ws, ws.root, version)["jobs"][job_key]["tasks"] if t["task_key"] == task_key)
    if task.get("executes"):
        return _executed_notebook(ws, version, job_key, task, log_path)
    first = _definition(ws, version, job_key, task_key, params, context)
    os.chdir(first.cwd)
    # As the CLI does: the target's plugin.path (a change to it needs a new driver, see handover)
    load_plugins(first.settings.plugin.path)
    check_configured_plugins(first.settings)
    log.info("job task '%s': notebook %s, deployment %s, parameters %s, master %s", task_key, first.notebook,
             version, json.dumps(first.values), first.settings.spark.master)
    redeploys = Redeploys(ws, job_key, task_key, params, first, log_path, context) if log_path is not None else None
    return execute(first.spec, first.settings, stop_after_secs=first.seconds, successor=redeploys)


def _pipeline_update(deployment: dict[str, Any], task: dict[str, Any]) -> int:
    """A pipeline task: one update of a declarative pipeline by Spark's Declarative Pipelines, with its
    state (``storage``: checkpoints of its streaming tables) and its tables where ``pipeline_locations``
    puts them (by default the target root's ``state/pipelines/<key>/`` and ``warehouse/``); a full
    refresh recomputes every table from scratch. Its tables are Delta tables, as a Lakeflow pipeline's
    are. On a local master Spark's own ``spark-pipelines`` CLI runs it (``_pipelines_cli``); on a
    cluster this process is its driver (``_pipelines_on_cluster``)."""
    import yaml

    from streamling.bundle.model import pipeline_locations
    from streamling.config import load_settings

    key = task["pipeline"]["id"]
    resolved = deployment["resolved"]
    pipeline = resolved["pipelines"][key]
    files = Path(deployment["file_path"])
    home = Path(deployment["root_path"]) / "state" / "pipelines" / key  # this host's: the spec and Spark settings
    home.mkdir(parents=True, exist_ok=True)
    settings = load_settings(task.get("config_name"), cwd=files, overrides=task_config(deployment, task))
    local = settings.spark.master.startswith("local")
    # A local master keeps its tables under the root as this host sees it (a remote root's mirror);
    # a cluster's executors write them from every host, so they go where the root or the pipeline's
    # storage says, which validation made sure every host reaches.
    root = str(deployment["root_path"]) if local else str(resolved["target"]["root_path"])
    checkpoints, warehouse = pipeline_locations(root, key, pipeline.get("storage"))
    # The spec's library globs are relative to its folder; the sources are the deployed files.
    libraries = []
    for library in pipeline["libraries"]:
        folder = library.endswith("/**")
        deployed = files / Path(library.removesuffix("/**")).relative_to(resolved["root"])
        libraries.append({"glob": {"include": os.path.relpath(deployed, home) + ("/**" if folder else "")}})
    spec = {"name": pipeline["name"], "storage": _uri(checkpoints), "libraries": libraries,
            "configuration": dict(pipeline["configuration"])}
    if pipeline.get("catalog"):
        spec["catalog"] = pipeline["catalog"]
    if pipeline.get("schema"):
        spec["database"] = pipeline["schema"]
    spec_file = home / "spark-pipeline.yml"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    full_refresh = bool(task["pipeline"].get("full_refresh"))
    log.info("pipeline task '%s': updating pipeline '%s'%s on %s: tables in %s, checkpoints in %s", task["task_key"],
             key, " (full refresh)" if full_refresh else "", settings.spark.master, warehouse, checkpoints)
    if local:
        return _pipelines_cli(key, task, home, spec_file, settings, warehouse, full_refresh)
    return _pipelines_on_cluster(key, task, spec_file, settings, warehouse, full_refresh)


def _uri(location: str) -> str:
    """A location as the pipeline spec's ``storage`` takes it: a URI (``file:`` for a local path)."""
    from streamling import storage

    return storage.local_path(location).as_uri() if storage.is_local(location) else location


def _pipelines_cli(key: str, task: dict[str, Any], home: Path, spec_file: Path, settings: Settings,
                   warehouse: str, full_refresh: bool) -> int:
    """The update by Spark's own ``spark-pipelines`` CLI, which starts a local Spark Connect session
    of its own. The CLI's JVM gets streamling's connector jars on its class path
    (``SPARK_DIST_CLASSPATH``: Spark Connect's sessions find data sources there, not through
    ``spark.jars``) and, in a configuration folder of its own (``SPARK_CONF_DIR``: the CLI's
    ``--conf`` options did not reliably reach its server), the Delta catalog and the target's Spark
    settings (a task cluster's ``spark_conf`` over them)."""
    import subprocess
    from importlib import resources

    import pyspark

    from streamling.config.settings import mask_secrets
    from streamling.runtime.session import ensure_jars
    from streamling.util import write_private

    # The CLI's JVM reads its settings from the Spark configuration folder it is given: static ones
    # (the warehouse, the Delta catalog) included, and none of them on a command line (secrets).
    partitions = str(settings.spark.shuffle_partitions)
    conf = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.sources.default": "delta", "spark.sql.shuffle.partitions": partitions,
            "spark.databricks.delta.snapshotPartitions": partitions, "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC", **{k: str(v) for k, v in settings.spark.conf.items()},
            "spark.sql.warehouse.dir": warehouse}
    conf_dir = home / "spark-conf"
    conf_dir.mkdir(exist_ok=True)
    # the defaults the CLI would have read otherwise come first: ours (later lines) win
    inherited = Path(os.environ.get("SPARK_CONF_DIR") or Path(pyspark.__file__).parent / "conf") / "spark-defaults.conf"
    base = inherited.read_text(encoding="utf-8") + "\n" if inherited.is_file() else ""
    write_private(conf_dir / "spark-defaults.conf", base + "".join(f"{k} {v}\n" for k, v in conf.items()))
    shutil.copyfile(str(resources.files("streamling.runtime").joinpath("log4j2.properties")),
                    conf_dir / "log4j2.properties")
    command = [str(Path(sys.executable).parent / "spark-pipelines"), "run", "--spec", str(spec_file)]
    if full_refresh:
        command.append("--full-refresh-all")
    log.info("pipeline task '%s': %s, with %s", task["task_key"], " ".join(command), json.dumps(mask_secrets(conf)))
    jars = os.pathsep.join(str(j) for j in ensure_jars())
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_CONF_DIR": str(conf_dir),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
           "SPARK_DIST_CLASSPATH": os.pathsep.join(p for p in [jars, os.environ.get("SPARK_DIST_CLASSPATH", "")] if p)}
    sys.stdout.flush()
    proc = subprocess.Popen(command, cwd=home, env=env, start_new_session=True)

    def forward(signum: int, _frame: Any) -> None:  # a cancel stops the update (its tables stay as they were)
        try:
            os.killpg(proc.pid, signum)
        except OSError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = proc.wait()
    if code != 0:
        raise StreamlingError(f"the update of pipeline '{key}' failed (spark-pipelines exited with {code})",
                              code="pipeline_failed", hint="the driver log above has Spark's error")
    return 0


#: the Spark plugin that serves Spark Connect from a classic session's driver
_CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def _pipelines_on_cluster(key: str, task: dict[str, Any], spec_file: Path, settings: Settings, warehouse: str,
                          full_refresh: bool) -> int:
    """The update with this process as the Spark driver of the target's cluster.

    Spark's CLI would start a Spark Connect server on a local master. Here the session is streamling's
    own (``build_session``): the target's master and ``spark.driver.host``, the connector jars on
    the driver's class path and, on the executors, from each host's cache (``HostJars``), the job's
    Python environment shipped to other hosts — with Spark Connect served from it, on a free port of
    the loopback interface, for the CLI's own ``run`` (its graph registration, the pipeline's Python
    and SQL files, its event log), which this process then calls as the CLI would."""
    import secrets

    from pyspark.pipelines import cli
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from streamling.runtime.session import build_session

    conf = {k: str(v) for k, v in settings.spark.conf.items()}
    plugins = [p for p in conf.get("spark.plugins", "").split(",") if p.strip()]
    conf = {"spark.sql.sources.default": "delta", **conf, "spark.sql.warehouse.dir": warehouse,
            "spark.plugins": ",".join([*plugins, _CONNECT_PLUGIN]),
            "spark.connect.grpc.binding.address": "localhost", "spark.connect.grpc.binding.port": "0"}
    settings = settings.model_copy(update={"spark": settings.spark.model_copy(update={"conf": conf})})
    # The Connect server (in the driver's JVM, launched with this environment) takes only this
    # process's sessions: a fresh token, never written anywhere.
    os.environ["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = secrets.token_urlsafe(24)
    stopping: list[int] = []

    def stop(signum: int, _frame: Any) -> None:  # a cancel stops the update (its tables stay as they were)
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        spark = build_session(settings, app_name=f"pipeline {key}")
        jvm: Any = spark._jvm
        port = int(getattr(getattr(jvm, "org.apache.spark.sql.connect.service.SparkConnectService$"),
                           "MODULE$").localPort())
        # Connect's server logs every error it returns, with its stack trace, and the one its client's
        # last release gets once the CLI has closed its session: the client raises the real ones.
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.connect.utils.ErrorUtils", jvm.org.apache.logging.log4j.Level.OFF)
        # The CLI's SparkSession.builder.getOrCreate() then returns this Connect session.
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = os.environ["SPARK_LOCAL_REMOTE"] = "1"
        ConnectSession.builder.remote(f"sc://localhost:{port}").getOrCreate()  # plain text on loopback
        sys.stdout.flush()
        cli.run(spec_file, full_refresh=[], full_refresh_all=full_refresh, refresh=[], dry=False)
    except KeyboardInterrupt:
        if not stopping:
            raise
        raise StreamlingError(f"the update of pipeline '{key}' was stopped by signal {stopping[0]}",
                              code="pipeline_stopped", hint="its tables stay as the last complete update left "
                              "them; run the job again to update them") from None
    except StreamlingError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark's errors, said in one line; the driver log has the rest
        from streamling.runtime.environment import worker_failure

        worker = worker_failure(str(exc))
        cause = worker.message if worker is not None else first_line(exc)
        log.exception("the update of pipeline '%s' failed", key)
        raise StreamlingError(f"the update of pipeline '{key}' (task '{task['task_key']}') failed on "
                              f"{settings.spark.master}: {cause[:500]}", code="pipeline_failed",
                              hint=worker.hint if worker is not None and worker.hint else
                              "the driver log has Spark's error") from exc
    return 0


def _executed_notebook(ws: Any, version: int, job_key: str, task: dict[str, Any], log_path: Path | None) -> int:
    """A notebook with Python, SQL or shell cells, or a SQL task's file: its driver runs every cell
    (``NotebookJob``; a SQL file is one SQL cell) on a SparkSession built with the target's settings."""
    from streamling.bundle.compile import Cell
    from streamling.bundle.deploy import default_application_id
    from streamling.bundle.notebook_job import NotebookJob
    from streamling.config import deep_merge, env_variables, load_settings
    from streamling.notebook.dbutils import output_file
    from streamling.plugins.discovery import load_plugins
    from streamling.plugins.host import check_configured_plugins

    deployment = _deployment(ws, ws.root, version)
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


class Redeploys:
    """Swaps a newer deployment of this task into the warm driver when the runner asks (hot redeploy).

    The new definition is compiled, checked against what the JVM was started with and analysed in
    this driver's SparkSession while the old one keeps running; only then does the old one stop
    after its epoch in flight, and ``execute`` starts the new one on the same checkpoint. A broken
    new definition leaves the old one running, and says why in this log and in the answer the
    runner records (see ``streamling.bundle.handover``).
    """

    POLL_SECS = 0.2

    def __init__(self, ws: Any, job_key: str, task_key: str, params: dict[str, str], first: _Definition,
                 log_path: Path, context: RunContext | None = None) -> None:
        self.ws, self.job_key, self.task_key, self.params, self.context = ws, job_key, task_key, params, context
        self.request_path = handover.request_file(log_path)
        self.status_path = handover.status_file(log_path)
        self.running = first
        self.jvm_settings = first.settings  # the SparkSession was (or will be) built with these
        self._lock = threading.Lock()
        self._pipeline: Any = None
        self._next: _Definition | None = None
        self._answered = first.version  # the newest deployment asked for and answered
        self._swapped = False
        self._report(handover.RUNNING, None)  # tells the runner this driver can swap
        threading.Thread(target=self._loop, name="streamling-redeploys", daemon=True).start()

    # --- called by ``execute`` ----------------------------------------------------------------------

    def watch(self, pipeline: Any) -> None:
        with self._lock:
            self._pipeline = pipeline
        if self._swapped:
            log.info("job task '%s': deployment %d runs in this driver (no JVM restart)", self.task_key,
                     self.running.version)
            self._report(handover.RUNNING, self.running.version)

    def take(self) -> tuple[Any, Settings, float | None] | None:
        with self._lock:
            nxt, self._next, self._pipeline = self._next, None, None
        if nxt is None:
            return None
        self.running, self._swapped = nxt, True
        os.environ["STREAMLING_JOB_PARAMETERS"] = json.dumps(nxt.values)
        os.chdir(nxt.cwd)
        log.info("job task '%s': starting deployment %d (notebook %s, parameters %s) on the same checkpoint",
                 self.task_key, nxt.version, nxt.notebook, json.dumps(nxt.values))
        return nxt.spec, nxt.settings, nxt.seconds

    # --- the watcher ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            time.sleep(self.POLL_SECS)
            try:
                self._poll()
            except Exception:  # noqa: BLE001 - the watcher must outlive one bad look
                log.exception("checking for a redeploy request failed")

    def _poll(self) -> None:
        request = handover.read(self.request_path)
        version = int(request["deployment"]) if request and request.get("deployment") is not None else None
        if version is None or version <= self._answered:
            return
        with self._lock:
            pipeline = self._pipeline
            if pipeline is None or self._next is not None:
                return  # not running yet, or a swap is under way: the request waits
        self._answered = version
        self._check(version, pipeline)

    def _check(self, version: int, pipeline: Any) -> None:
        from streamling.runtime.planner import analyze, build_plan

        old = self.running.version
        log.info("job task '%s': deployment %d changes this task; checking it in this driver's Spark session while "
                 "deployment %d keeps running", self.task_key, version, old)
        try:
            nxt = _definition(self.ws, version, self.job_key, self.task_key, self.params, self.context)
            changes = self._source_changes(old, version)
            if changes:
                raise StreamlingError(
                    f"{'; '.join(changes)}: the running pipeline's checkpoint records the old sources' offsets, so "
                    "the new definition cannot resume from it", code="bundle_checkpoint_incompatible",
                    hint="deploy it under a new application_id; it then reads its sources from their starting offsets")
            reasons = handover.restart_reasons(self.jvm_settings, nxt.settings)
            if reasons:
                why = "; ".join(reasons)
                log.info("job task '%s': deployment %d needs a new driver JVM (%s); the runner restarts this task "
                         "after its current epoch", self.task_key, version, why)
                self._report(handover.NEEDS_RESTART, version, why)
                return
            analyze(build_plan(nxt.spec, nxt.settings, dry_run=True), pipeline.spark)
        except StreamlingError as exc:
            message = _one_line(exc)
            log.error("deployment %d was not swapped in, deployment %d keeps running: %s", version, old,
                      exc.describe())
            self._report(handover.FAILED, version, message)
            return
        except Exception as exc:  # noqa: BLE001 - a bug in checking must not stop the running pipeline
            log.exception("checking deployment %d failed; deployment %d keeps running", version, old)
            self._report(handover.FAILED, version, f"internal error: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._pipeline is not pipeline:
                return  # the run ended by itself meanwhile; the runner sees the driver exit
            self._next = nxt
        log.info("job task '%s': deployment %d checked; stopping deployment %d after its epoch in flight",
                 self.task_key, version, old)
        pipeline.request_stop(f"deployment {version} takes over")

    def _source_changes(self, old: int, new: int) -> list[str]:
        """How the task's sources differ between two deployments (the deploy's own rule, checked again
        here: a deploy cannot always see the checkpoint, this driver runs on it)."""
        from streamling.bundle.deploy import source_changes

        def sources(version: int) -> dict[str, Any]:
            job = _deployment(self.ws, self.ws.root, version)["jobs"].get(self.job_key) or {}
            task = next((t for t in job.get("tasks", []) if t["task_key"] == self.task_key), None) or {}
            return dict(task.get("sources") or {})

        return source_changes(sources(old), sources(new))

    def _report(self, state: str, request: int | None, message: str | None = None) -> None:
        handover.write(self.status_path, {"running": self.running.version, "request": request, "state": state,
                                          "message": message, "at": time.time()})


class Fence:
    """Heartbeats this attempt in a shared run store; stops the driver's process group when fenced.

    A watchdog apart from the heartbeat measures the silence: a heartbeat hanging on a cut network
    cannot delay the stop past half a lease after the last one that got through, while a runner
    taking over waits for a whole lease of silence before it starts the task elsewhere."""

    EVERY_SECS = 1.0
    WATCH_SECS = 0.2

    def __init__(self, root: Path, attempt_id: int, exit_file: Path | None) -> None:
        from streamling.bundle.workspace import Workspace

        ws = Workspace(str(root))
        self.attempt_id, self.exit_file = attempt_id, exit_file
        self.lease_secs = ws.store_settings().lease_secs
        self.store = ws.open_store()
        self._ok = time.monotonic()
        self._last_error = "no answer"
        threading.Thread(target=self._beat, name="streamling-fence", daemon=True).start()
        threading.Thread(target=self._watch, name="streamling-fence-watchdog", daemon=True).start()

    def _beat(self) -> None:
        from streamling.bundle.store import StoreUnavailable

        while True:
            try:
                row = self.store.heartbeat(self.attempt_id)
                self._ok = time.monotonic()
                if row is None:
                    self._stop(f"its attempt {self.attempt_id} is no longer in the run store")
                elif row["fenced_at"] is not None:
                    self._stop(f"runner {row['fenced_by']} took over supervision and runs this task on its host")
            except StoreUnavailable as exc:
                self._last_error = exc.headline()
            except Exception:  # noqa: BLE001 - the heartbeat must outlive one bad look
                log.exception("heartbeat to the run store failed")
            time.sleep(self.EVERY_SECS)

    def _watch(self) -> None:
        while True:
            time.sleep(self.WATCH_SECS)
            silent = time.monotonic() - self._ok
            if silent > self.lease_secs / 2:
                self._stop(f"the run store has not answered for {silent:.1f}s ({self._last_error}), so another "
                           "runner may start this task elsewhere")

    def _stop(self, why: str) -> None:
        log.error("this driver stops now: %s. The epoch in flight is not committed; the task resumes from its "
                  "checkpoint where it runs next", why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        if self.exit_file is not None:
            try:
                self.exit_file.write_text("75")
            except OSError:
                pass
        # The driver JVM (in a session of its own) first, then this process and Spark's Python workers.
        from streamling.runtime.session import jvm_process_group

        jvm = jvm_process_group()
        if jvm is not None:
            try:
                os.killpg(jvm, signal.SIGKILL)
            except OSError:
                pass
        os.killpg(os.getpgrp(), signal.SIGKILL)


def leave_with_runner(go: Path, parent: int) -> None:
    """A waiting standby's watch: exit the process as soon as its runner is gone, however it went and
    whatever the process is doing (warming up, or a JVM call that does not return). The runner holds
    the write end of the pipe on stdin, so its death, even a SIGKILL, is an EOF here; a parent that
    stays alive (a subreaper, a PID namespace) cannot hide it. Without that pipe (started by hand),
    the parent process changing says the same, checked twice a second. Returns only when the runner
    handed over an attempt (``go`` exists) before it went: that attempt runs."""
    import stat

    if stat.S_ISFIFO(os.fstat(0).st_mode):
        while os.read(0, 4096):
            pass
    else:
        while os.getppid() == parent:
            time.sleep(0.5)
    if not go.exists():
        log.info("warm standby leaves: its runner is gone")
        logging.shutdown()
        os._exit(0)


class Standby:
    """A driver started before it is needed: the runner keeps one per running task of a continuous
    job (``job_runner.standby``), so that when the active driver dies its replacement has its JVM,
    SparkSession and plugins ready and resumes from the checkpoint in seconds, not after a cold start.

    It prepares everything the task's deployment fixes, then only waits: it runs no query, opens no sink
    and touches no checkpoint until the runner, having seen the active driver end, writes the go file
    (the attempt to run, as JSON). On a local master it holds a SparkSession. On a cluster it holds an
    application registered with the master but without executors (``idle_conf``: the cores are the
    active driver's), and claims them as it takes over, while its query is planned; where the job's
    Spark settings choose the executors themselves, only the driver JVM (``prelaunch``). It leaves
    when asked (SIGTERM: the task's definition changed, or it is no longer needed) or when its
    runner is gone (the pipe the runner holds on its stdin ends).

    Started without a job and task it is a **pooled** warm driver (``job_runner.warm_drivers``): warmed
    for the target's settings, it takes whichever notebook task the runner starts next without a
    standby of its own (a new deploy's first run, say). If that task's session needs other settings
    (``session_key``), it becomes the task's cold driver in the same process instead."""

    POLL_SECS = 0.05

    def __init__(self, args: argparse.Namespace) -> None:
        self.go = Path(args.standby)
        self.root, self.version = Path(args.root), int(args.deployment)
        #: None for a pooled driver: warmed for the target, it takes whichever task comes first
        self.job: str | None = args.job
        self.task: str | None = args.task

    def _warm_for(self) -> tuple[Settings, bool, str, Any]:
        """The settings and UI flag to warm the session for, what the log calls this driver, and the
        task's plan (None for a pooled driver)."""
        from streamling.bundle.workspace import Workspace
        from streamling.plugins.discovery import load_plugins
        from streamling.plugins.host import check_configured_plugins
        from streamling.runtime.planner import build_plan

        ws = Workspace(str(self.root))
        if self.job is None or self.task is None:
            return target_settings(ws, self.version), True, "pooled warm driver", None
        definition = _definition(ws, self.version, self.job, self.task, {})
        os.chdir(definition.cwd)
        load_plugins(definition.settings.plugin.path)
        check_configured_plugins(definition.settings)
        plan = build_plan(definition.spec, definition.settings, dry_run=True)
        return definition.settings, not plan.bounded, f"warm standby for job '{self.job}' task '{self.task}'", plan

    def wait(self) -> dict[str, Any] | None:
        """Warm up, then the attempt to run once the go file appears; None when released first."""
        import signal
        import threading
        import time

        from streamling.runtime.session import (
            build_session,
            claim_executors,
            idle_conf,
            prelaunch,
            session_key,
            warm_executors,
        )

        parent, released, ready, started = os.getppid(), threading.Event(), threading.Event(), time.monotonic()
        taking_over = threading.Event()

        def on_term(*_: Any) -> None:
            if not ready.is_set():
                os._exit(0)  # still warming up: nothing runs and nothing is owed (a JVM start may take long)
            released.set()

        signal.signal(signal.SIGTERM, on_term)
        threading.Thread(target=leave_with_runner, args=(self.go, parent), name="streamling-standby-watch",
                         daemon=True).start()
        settings, ui, role, plan = self._warm_for()
        spark, idle, holds, warming, kept = None, False, "a SparkSession", None, 0
        if settings.spark.master.startswith("local"):
            spark = build_session(settings, ui=ui)
            # the first job's one-time costs (code generation, the executor's first task) paid now
            spark.range(1).count()
        elif idle_conf(settings) is not None:
            # On a cluster its application registers with the master but holds no executor until
            # it takes over (they would be cores the active driver may need): the query planner
            # is warmed without running a job.
            # A task's standby may keep executors of its own, warmed while it waits: taking over then
            # starts none. A pooled driver keeps none (they would be a standby's).
            kept = settings.job_runner.standby_executors if self.job is not None else 0
            spark, idle = build_session(settings, ui=ui, idle=True, keep_executors=kept), True
            holds = "an application without executors"
            if kept:
                holds = f"an application keeping {kept} warm executor(s) (job_runner.standby_executors)"
                warming = warm_executors(spark, kept, self._modules(plan), taking_over)
        else:
            # The job's Spark settings choose its executors (dynamic allocation or a number): an
            # application registered now could hold some, so the JVM only; its context is made
            # when the standby takes over.
            prelaunch(settings, ui=ui)
            holds = "a driver JVM without a SparkContext (spark.conf chooses the executors)"
        if spark is not None and plan is not None:
            self._analyze(plan, spark)
        if warming is not None:
            self._await_warm_up(warming, kept, released)
        ready.set()
        Path(f"{self.go}.ready").write_text(str(os.getpid()))
        log.info("%s (deployment %d) ready in %.1fs with %s: it runs nothing until the runner hands it an attempt",
                 role, self.version, time.monotonic() - started, holds)
        while not self.go.exists():
            if released.is_set() or os.getppid() != parent:
                log.info("warm standby released (%s)", "asked to stop" if released.is_set() else "its runner is gone")
                taking_over.set()
                if spark is not None:
                    spark.stop()
                return None
            released.wait(self.POLL_SECS)
        attempt = dict(json.loads(self.go.read_text()))
        taking_over.set()  # a warm-up job still running gives its cores to the first epoch
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the task's own handling takes over (execute)
        if self.job is None:
            self.job, self.task = str(attempt["job"]), str(attempt["task"])
            if self._session_key(attempt) != session_key(settings):
                self._start_cold(attempt)
        if idle and spark is not None:
            claim_executors(spark)  # they start while the task plans its query
        log.info("%s takes over: run %s, attempt %s of task '%s' (deployment %s), %.1fs after it started",
                 "warm standby" if role.startswith("warm standby") else role,
                 (attempt.get("context") and json.loads(attempt["context"]).get("run_id")), attempt["attempt"],
                 self.task, attempt["deployment"], time.monotonic() - started)
        return attempt

    #: how long a standby that keeps executors waits for them to be warmed before it says it is ready
    WARM_UP_SECS = 120.0

    def _await_warm_up(self, warming: threading.Thread, kept: int, released: threading.Event) -> None:
        """Ready once the kept executors are warmed (or the attempt comes first): until then a
        takeover would still start them. Past ``WARM_UP_SECS`` the master has no cores for them;
        the standby is ready without them and says so (it keeps asking)."""
        deadline = time.monotonic() + self.WARM_UP_SECS
        while warming.is_alive() and time.monotonic() < deadline and not self.go.exists() and not released.is_set():
            warming.join(self.POLL_SECS)
        if warming.is_alive() and not self.go.exists() and not released.is_set():
            log.warning("warm standby: the cluster gave none of its %d executor(s) in %.0fs — the active driver "
                        "holds every free core; leave room with spark.cores.max. It keeps asking, and takes its "
                        "executors when it takes over", kept, self.WARM_UP_SECS)

    @staticmethod
    def _modules(plan: Any) -> tuple[str, ...]:
        """The modules of the task's nodes (their functions run in the executors' Python workers);
        streamling's own for a pooled driver, which has no task yet."""
        nodes = plan.nodes.values() if plan is not None else ()
        return tuple(sorted({type(node).__module__ for node in nodes} or {"streamling.runtime.nodes"}))

    @staticmethod
    def _analyze(plan: Any, spark: Any) -> None:
        """Analyse the task's pipeline on Spark as ``--validate`` does (no query, no sink, no
        checkpoint): the classes its sources and transforms need are loaded now, not at takeover.
        A pipeline that does not analyse fails in the attempt, which says why."""
        from streamling.runtime.planner import analyze

        try:
            analyze(plan, spark)
        except Exception as exc:  # noqa: BLE001 - reported by the attempt that runs it
            log.info("warm standby: the pipeline does not analyse yet (%s); the attempt will say why",
                     first_line(exc))

    def _session_key(self, attempt: dict[str, Any]) -> str | None:
        """The session the attempt's task needs (``session_key``), or None when it cannot be told here
        (the task's own driver then reports why)."""
        from streamling.bundle.workspace import Workspace
        from streamling.runtime.session import session_key

        assert self.job is not None and self.task is not None
        try:
            context = RunContext(**json.loads(attempt["context"])) if attempt.get("context") else None
            definition = _definition(Workspace(str(self.root)), int(attempt["deployment"]), self.job, self.task,
                                     dict(json.loads(attempt["params"])), context)
        except Exception:  # noqa: BLE001 - a definition that does not build fails in the task's own driver
            return None
        return session_key(definition.settings)

    def _start_cold(self, attempt: dict[str, Any]) -> None:
        """Become the attempt's cold driver, in this process (the runner follows its pid): its task
        needs a session other than the one warmed for the target (its own Spark settings), and a
        driver JVM's launch settings cannot change. The warm JVM ends with the exec (its gateway's
        stdin closes)."""
        assert self.job is not None and self.task is not None
        log.info("pooled warm driver: task '%s' of job '%s' needs a Spark session with other settings than the "
                 "target's; it starts in a new driver JVM", self.task, self.job)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "streamling.bundle.driver", "--root", str(self.root),
                                  "--deployment", str(attempt["deployment"]), "--job", self.job, "--task", self.task,
                                  "--params", str(attempt["params"]), "--exit-file", str(attempt["exit_file"]),
                                  "--attempt", str(attempt["attempt"]), "--context", str(attempt["context"])])


def target_settings(ws: Any, version: int) -> Settings:
    """A target's runtime settings as deployment ``version`` fixes them for every task (its
    ``config``), before any task's own: what a pooled warm driver builds its session for."""
    from streamling.config import deep_merge, load_settings

    deployment = _deployment(ws, ws.root, version)
    config = dict(deployment.get("config") or {})
    state_dir = config.get("state_dir") or deployment["state_dir"]
    return load_settings(None, cwd=Path(deployment["file_path"]),
                         overrides=deep_merge(config, {"state_dir": state_dir}))


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


def _one_line(exc: StreamlingError) -> str:
    """The error as the run record shows it: each problem of a validation error, on one line."""
    if isinstance(exc, ValidationError):
        return "; ".join(p.headline() for p in exc.problems)
    return exc.headline()


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
    from streamling.cli import STATS_FILE_ENV, setup_logging
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
