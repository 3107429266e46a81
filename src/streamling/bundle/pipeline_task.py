"""A pipeline task in its driver: one update of a declarative pipeline by Spark's Declarative Pipelines.

Apart from the driver's other task kinds because it runs Spark's own pipeline CLI rather than
streamling's runtime: a local master gets the ``spark-pipelines`` command, a cluster gets this process
as the Spark driver serving Spark Connect to the CLI's ``run``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.task_definition import task_config
from streamling.errors import StreamlingError, first_line

if TYPE_CHECKING:
    from streamling.config import Settings

#: the driver process logs as one logger, whichever module speaks: its log lines name it
log = logging.getLogger("streamling.bundle.driver")


def pipeline_update(deployment: dict[str, Any], task: dict[str, Any]) -> int:
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
    from streamling.runtime.jars import ensure_jars
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
