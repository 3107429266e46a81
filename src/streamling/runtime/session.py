"""The SparkSession: local by default, with the connector jars from our cache (``runtime.jars``)
passed to Spark as local paths; Ivy (``--packages``) is never relied on. Also how a standby's
cluster application waits idle, claims its executors and warms them up.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling import storage
from streamling.config import Settings
from streamling.errors import first_line
from streamling.runtime import class_archive
from streamling.runtime.jars import (
    CLASS_PATH,
    HOST_JARS,
    HOST_JARS_PLUGIN,
    NATIVE_JAR,
    driver_jars,
)
from streamling.runtime.jvm_output import launch_with_filtered_stderr

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def has_native_classes(spark: SparkSession) -> bool:
    """Whether ``spark`` was started with ``native_jar`` (a session built elsewhere may not be)."""
    conf = spark.sparkContext.getConf()
    return any(NATIVE_JAR in (conf.get(key) or "") for key in ("spark.jars", CLASS_PATH))


#: the Python data sources (by format name) each live session has had registered
_DATA_SOURCES: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
_DATA_SOURCES_LOCK = threading.Lock()


def register_data_source(spark: SparkSession, name: str, data_source: Callable[[], type]) -> None:
    """Register the Python data source ``name`` (its class built by ``data_source``) with ``spark``
    once: a registration is per session and costs a JVM round trip. Keyed by the session object
    itself, weakly, so a later session never passes for one that was stopped."""
    with _DATA_SOURCES_LOCK:
        names = _DATA_SOURCES.setdefault(spark, set())
        if name in names:
            return
        spark.dataSource.register(data_source())
        names.add(name)


def _executor_python() -> str:
    from streamling.runtime.environment import EXECUTOR_PYTHON

    return EXECUTOR_PYTHON


def build_session(settings: Settings, app_name: str = "streamling", ui: bool = False,
                  java_options: str = "", idle: bool = False, keep_executors: int = 0) -> SparkSession:
    """Create (or reuse) the process's SparkSession configured for streamling.

    ``ui`` turns Spark's web UI on (its Structured Streaming tab shows every query's progress) on
    the first free port from 4040, for long-running jobs; ``spark.conf`` can still set
    ``spark.ui.enabled`` either way. ``java_options`` are added to the driver JVM's (when this
    process launches it). ``idle``: a cluster application that holds no executor until
    ``claim_executors`` but ``keep_executors`` (``idle_conf``; a standby driver's)."""
    global _prelaunched
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        _apply_runtime_settings(active, settings)
        return active
    builder, shipped = _configure(settings, app_name, ui, java_options,
                                  first_launch=SparkContext._gateway is None or _prelaunched)
    for key, value in (idle_conf(settings, keep_executors) or {}).items() if idle else ():
        builder = builder.config(key, value)

    def launch() -> SparkSession:
        _own_session_gateway(builder)
        return builder.getOrCreate()

    spark = launch_with_filtered_stderr(launch)
    _prelaunched = False
    spark.sparkContext.setLogLevel("ERROR")
    if shipped is not None:
        from streamling.runtime import environment

        environment.publish(spark.sparkContext, shipped, settings.spark.python_environment_port)
    if spark.sparkContext.uiWebUrl:
        log.info("Spark UI (Structured Streaming tab) on %s", spark.sparkContext.uiWebUrl)
    _apply_runtime_settings(spark, settings)
    return spark


#: executors an idle application asks for when it is claimed: as many as the master will give (an
#: application without ``spark.cores.max`` takes every free core; the master caps it at its workers)
CLAIM_EXECUTORS = 1024
#: idle executors are never given back (a streaming job's executors wait between epochs)
_NEVER_IDLE = "3650d"


def chooses_executors(conf: Mapping[str, Any]) -> bool:
    """Whether Spark settings fix the number of an application's executors themselves (dynamic
    allocation, ``spark.executor.instances``): an idle application (``idle_conf``) would change it."""
    return "spark.executor.instances" in conf or any(str(key).startswith("spark.dynamicAllocation.") for key in conf)


def idle_conf(settings: Settings, keep: int = 0) -> dict[str, str] | None:
    """Spark settings under which a cluster application registers holding only ``keep`` executors
    (a waiting standby's ``job_runner.standby_executors``, none by default) and takes the rest
    when claimed (``claim_executors``), or None where that cannot be done without changing what
    the job's executors are: a local master, or Spark settings that already choose the number of
    executors (dynamic allocation or ``spark.executor.instances``).

    A standalone master gives an application executors when it registers, unless dynamic
    allocation starts it lower; nothing asks for more until ``claim_executors``, and with an idle
    timeout that never ends and shuffle tracking, the executors it then gets stay as a static
    application's would."""
    if settings.spark.master.startswith("local") or chooses_executors(settings.spark.conf):
        return None
    return {"spark.dynamicAllocation.enabled": "true",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true",
            "spark.dynamicAllocation.minExecutors": str(keep),
            "spark.dynamicAllocation.initialExecutors": str(keep),
            "spark.dynamicAllocation.executorIdleTimeout": _NEVER_IDLE}


#: the job group of a standby's warm-up job, cancelled if it still runs when the standby takes over
_WARM_UP_GROUP = "streamling-standby-warm-up"


def _import_in_worker(modules: tuple[str, ...], batches: Any) -> Any:
    """A warm-up task's function, in a Python worker of an executor: import what the job's own
    functions will (the worker is reused by the job's tasks), pass no row on."""
    import importlib

    for name in modules:
        importlib.import_module(name)
    for batch in batches:
        yield batch.slice(0, 0)


def _warm_up_job(spark: SparkSession, modules: tuple[str, ...]) -> int:
    """One small job with a task per core: code generation, and a Python worker per core that
    imports ``modules`` (Spark reuses it for the next tasks). Returns its number of tasks."""
    import functools

    cores = max(1, spark.sparkContext.defaultParallelism)
    (spark.range(0, cores, numPartitions=cores).selectExpr("id", "id * 2 AS twice")
     .mapInArrow(functools.partial(_import_in_worker, modules), "id bigint, twice bigint").collect())
    return cores


def warm_local_workers(spark: SparkSession, modules: tuple[str, ...]) -> None:
    """Run the warm-up job now in a local session (its executor is the driver): a standby's or a
    pooled driver's first epoch then finds its Python workers started, ``modules`` imported, and the
    first job's code generated. A failure only costs that head start: the first epoch does it."""
    import time

    started = time.monotonic()
    try:
        cores = _warm_up_job(spark, modules)
    except Exception as exc:  # noqa: BLE001 - only a head start; the first epoch says what fails
        log.info("the Python workers could not be warmed up (%s); the first epoch starts them", first_line(exc))
        return
    log.info("warmed up in %.1fs (%d task(s); Python workers with %s)", time.monotonic() - started, cores,
             ", ".join(modules))


def warm_executors(spark: SparkSession, count: int, modules: tuple[str, ...],
                   stop: threading.Event) -> threading.Thread:
    """In the background, once ``count`` executors have registered, run one small job with a task
    per executor core: each executor generates code and starts a Python worker that imports
    ``modules``, and Spark keeps that worker for the next task. A standby's first epoch then starts
    on executors that have done it all. ``stop`` (set at takeover) ends the wait; a warm-up job still
    running then is cancelled (its cores are the first epoch's)."""
    import time

    def run() -> None:
        sc = spark.sparkContext
        started = time.monotonic()
        try:
            while not stop.is_set() and sc._jsc.sc().getExecutorIds().size() < count:
                stop.wait(0.2)
            if stop.is_set():
                return
            registered = time.monotonic()
            sc.setJobGroup(_WARM_UP_GROUP, "warm-up of the standby's executors", interruptOnCancel=True)
            cores = _warm_up_job(spark, modules)
        except Exception as exc:  # noqa: BLE001 - only a head start; cancelled at takeover, or the job says why
            if not stop.is_set():
                log.info("the standby's executors could not be warmed up (%s); the first epoch does it",
                         first_line(exc))
            return
        log.info("%d executor(s) registered in %.1fs and warmed up in %.1fs (%d task(s); Python workers with %s)",
                 count, registered - started, time.monotonic() - registered, cores, ", ".join(modules))

    def cancel_on_stop() -> None:
        stop.wait()
        try:
            spark.sparkContext.cancelJobGroup(_WARM_UP_GROUP)
        except Exception:  # noqa: BLE001 - a standby released and stopped: nothing left to cancel
            pass

    worker = threading.Thread(target=run, name="streamling-warm-executors", daemon=True)
    worker.start()
    threading.Thread(target=cancel_on_stop, name="streamling-warm-executors-cancel", daemon=True).start()
    return worker


def claim_executors(spark: SparkSession) -> None:
    """Ask the master of an idle application (``build_session(idle=True)``) for its executors now,
    before the first query needs them: they start while the driver plans the query. A refusal only
    costs that head start: dynamic allocation asks for them anyway once the query's tasks wait."""
    try:
        spark.sparkContext._jsc.sc().requestExecutors(CLAIM_EXECUTORS)
    except Exception as exc:  # noqa: BLE001 - an early start of executors, not a condition of the run
        log.warning("could not ask the cluster's master for executors ahead of the first query (%s); they start "
                    "when its tasks wait", first_line(exc))


#: this process's driver JVM was launched by ``prelaunch``, for the session ``build_session`` makes next
_prelaunched = False
#: the jars of this process's local driver JVM when it started without a class archive for them
_archive_missing: list[Path] | None = None


def build_missing_class_archive() -> bool:
    """After a local run whose driver had no class archive: build one in the background for the
    next run (``class_archive.build_in_background``). Returns whether a build was started."""
    if _archive_missing is None or os.environ.get("STREAMLING_CLASS_ARCHIVE") == "0":
        return False
    try:
        return class_archive.build_in_background(_archive_missing)
    except OSError as exc:  # only start-up time depends on it
        log.debug("no background class archive build: %s", exc)
        return False


def session_key(settings: Settings, app_name: str = "streamling") -> str:
    """What fixes the session ``build_session(settings, app_name)`` makes: its master, its Spark
    settings (many take effect only at launch: jars, memory, plugins) and the Python it ships. A
    process whose session was built for one key serves a run with another only by launching again:
    ``build_session`` reuses the session it has as it is. (Whether Spark's web UI runs changes no
    row: a bounded run in a session that has it is served as well.)"""
    import json

    fixed = {"spark": settings.spark.model_dump(mode="json"), "plugin": settings.plugin.model_dump(mode="json"),
             "app": app_name}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prelaunch(settings: Settings, app_name: str = "streamling", ui: bool = False) -> None:
    """Launch this process's driver JVM as ``build_session(settings, app_name, ui)`` would, without
    a SparkContext: the JVM's start, its class loading and the packing of a shipped environment are
    paid now, while nothing registers with a cluster's master or holds its executors. The next
    ``build_session`` of this process creates its context in that JVM. For standby drivers on
    clusters, where a waiting SparkContext would be an application of its own."""
    global _prelaunched
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        return
    builder, _ = _configure(settings, app_name, ui, "", first_launch=True)
    launch_with_filtered_stderr(lambda: _own_session_gateway(builder))
    _prelaunched = True


def _configure(settings: Settings, app_name: str, ui: bool, java_options: str,
               first_launch: bool) -> tuple[Any, Any]:
    """The session builder for ``settings`` (and the shipped environment, if any), with the process
    environment PySpark and the JVM read at launch. ``first_launch``: this process launches (or has
    launched, see ``prelaunch``) its JVM for this builder, so launch-time settings still apply."""
    from pyspark.sql import SparkSession

    jars = driver_jars()
    log4j = Path(str(resources.files("streamling.runtime").joinpath("log4j2.properties")))
    # Python workers, here and on a cluster's executors, must run this interpreter (the venv with
    # streamling), not whatever ``python3`` is first on PATH. PySpark fixes the program every Python
    # function names from PYSPARK_PYTHON when the context starts (``spark.pyspark.python`` does not
    # choose it in classic PySpark), and the driver JVM runs that program too (Python data sources).
    master = settings.spark.master
    local = master.startswith("local")
    user_conf = dict(settings.spark.conf)
    archives = [a for a in [user_conf.pop("spark.archives", "")] if a]
    shipped = None
    if settings.spark.ships_environment() and not local:
        # Executors run the job's packed environment (see ``environment``): PySpark sends the
        # name in PYSPARK_PYTHON with every Python function; each side finds it on its PATH.
        from streamling.runtime import environment

        shipped = environment.packed_environment(settings.spark.python_packages)
        archives.append(f"{shipped.launcher}#{environment.ALIAS}")
        os.environ["PYSPARK_PYTHON"] = environment.EXECUTOR_PYTHON
        shim = str(environment.driver_python_dir())
        if os.environ.get("PATH", "").split(os.pathsep)[0] != shim:
            os.environ["PATH"] = os.pathsep.join([shim, os.environ.get("PATH", "")])
        theirs = user_conf.pop("spark.executorEnv.PATH", environment.SYSTEM_PATH)
        user_conf["spark.executorEnv.PATH"] = os.pathsep.join([environment.EXECUTOR_PATH, theirs])
    elif os.environ.get("PYSPARK_PYTHON") == _executor_python():
        os.environ["PYSPARK_PYTHON"] = sys.executable  # an earlier shipped session's: not this one's
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    driver_python = os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    loopback = not storage.is_multi_host(master)
    if loopback:
        # Bind the driver to loopback: no external interface is needed or wanted locally. With a
        # standalone master on loopback the driver runs in client mode on this host (Python apps
        # cannot use cluster deploy mode), and its executors there must reach it on 127.0.0.1 too.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark.master)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(settings.spark.shuffle_partitions))
        .config("spark.databricks.delta.snapshotPartitions", str(settings.spark.shuffle_partitions))
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.pyspark.python", python)
        .config("spark.pyspark.driver.python", driver_python)
    )
    if loopback:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    if not local:
        # One executor per worker with 1g; spark.cores.max stays unset, so the app takes every free
        # core. The local jar paths in spark.jars are served to executors by the driver.
        builder = builder.config("spark.executor.memory", "1g")
    if archives:
        builder = builder.config("spark.archives", ",".join(archives))
    options = [f"-Dlog4j2.configurationFile=file:{log4j}", java_options]
    # The user's jars (hadoop-aws for s3a://, say) join ours: set alone they would replace them.
    user_jars = [j.strip() for j in str(user_conf.pop("spark.jars", "")).split(",") if j.strip()]
    # On a cluster, executors take the jars that are files here from their host's cache (HostJars):
    # through spark.jars every executor of every application would copy each one (~20 MB of
    # connectors, ~700 MB with s3a's) before its first task. The plugin's class comes with the
    # native jar, so the driver's JVM must be launched by us with it on its class path.
    native = next((j for j in jars if j.name == NATIVE_JAR), None) if not local and first_launch else None
    cached = [j for j in [*(str(j) for j in jars), *user_jars] if _local_jar(j) is not None
              and Path(j).name != NATIVE_JAR] if native is not None else []
    if first_launch:
        # The driver's JVM gets the jars on its own class path, and with it the class archive built
        # for that class path (none yet while it is being built): classes loaded from spark.jars
        # come through Spark's own class loader, which the archive cannot serve (a cluster driver's
        # session took 13.6 s to start, a local one 4.3 s). Only while this process has not
        # launched its JVM yet: a class path is fixed at launch.
        archive = class_archive.java_options(jars)
        options.append(archive)
        global _archive_missing
        _archive_missing = list(jars) if local and not archive else None
        own = [str(j) for j in jars]
        paths = own + [str(_local_jar(j)) for j in cached if j not in own]
        paths += [p for p in [user_conf.pop(CLASS_PATH, "")] if p]
        builder = builder.config(CLASS_PATH, os.pathsep.join(paths))
    if cached:
        plugins = [p for p in str(user_conf.pop("spark.plugins", "")).split(",") if p.strip()]
        builder = (builder.config("spark.plugins", ",".join([*plugins, HOST_JARS_PLUGIN]))
                   .config(HOST_JARS, ",".join(str(_local_jar(j)) for j in cached))
                   .config("spark.jars", ",".join([str(native), *(j for j in user_jars if j not in cached)])))
    elif not (local and first_launch):
        # Executors get the jars from spark.jars (served by the driver). Locally the executor is in
        # the driver's JVM and has them already: through spark.jars it would also fetch a copy of
        # each (~20 MB) before its first task, ~0.2 s of every cold start.
        builder = builder.config("spark.jars", ",".join([*(str(j) for j in jars), *user_jars]))
    elif user_jars:
        builder = builder.config("spark.jars", ",".join(user_jars))
    options.append(user_conf.pop("spark.driver.extraJavaOptions", ""))  # the user's come last: they win
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(o for o in options if o))
    for key, value in user_conf.items():
        builder = builder.config(key, value)
    return builder, shipped


def _local_jar(entry: str) -> Path | None:
    """The file a ``spark.jars`` entry names on this host (a path or ``file:`` URI), or None for
    what executors must resolve themselves (``local:``, remote URIs, globs)."""
    if "*" in entry or "?" in entry:
        return None
    if not storage.is_local(entry):
        return None
    path = storage.local_path(entry)
    return path.resolve() if path.is_file() else None


def _own_session_gateway(builder: Any) -> None:
    """Launch the driver JVM as PySpark would, but deaf to the stop signals meant for this process.

    ``timeout``, shells and container runtimes signal a whole process group, and systemd's default
    ``KillMode=control-group`` every process of the unit: a SIGTERM meant to make the driver finish
    its epoch would also stop the JVM under it mid-epoch. So the JVM runs in a session of its own
    (out of the group) and starts with SIGTERM ignored (HotSpot installs no shutdown handler for a
    signal ignored at start, as ``nohup`` relies on for SIGHUP; PySpark already does so for SIGINT).
    It still ends with this process: PySpark's gateway exits when its stdin closes."""
    from pyspark import SparkConf, SparkContext, java_gateway

    with SparkContext._lock:
        if SparkContext._gateway is None:
            conf = SparkConf(loadDefaults=False)
            for key, value in builder._options.items():
                conf.set(key, value)
            module: Any = java_gateway
            popen = module.Popen
            # launch_gateway sets its own preexec_fn (SIGINT ignored): SIGTERM is added to it
            module.Popen = functools.partial(_popen_ignoring_sigterm, popen)
            try:
                SparkContext._gateway = module.launch_gateway(conf, popen_kwargs={"start_new_session": True})
            finally:
                module.Popen = popen
            SparkContext._jvm = SparkContext._gateway.jvm


def _popen_ignoring_sigterm(popen: Any, *args: Any, **kwargs: Any) -> Any:
    inner = kwargs.get("preexec_fn")

    def preexec() -> None:
        if inner is not None:
            inner()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    kwargs["preexec_fn"] = preexec
    return popen(*args, **kwargs)


def jvm_process_group() -> int | None:
    """The process group of this process's driver JVM when it runs in a session of its own."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return int(proc.pid) if proc is not None else None


def _apply_runtime_settings(spark: SparkSession, settings: Settings) -> None:
    """Settings that are Spark runtime confs, so a reused session follows the run's settings too.

    ``record_batch_size`` sizes the Arrow record batches Python-side operators receive (Spark's
    ``maxRecordsPerBatch``). Left at Streamling's default (1000) Spark keeps its own 10,000 rows,
    which moves the same rows in fewer, cheaper calls; set it to choose the size.
    """
    if settings.record_batch_size != 1000:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(settings.record_batch_size))
