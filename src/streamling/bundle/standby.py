"""A driver started before it is needed: a task's warm standby, or a pooled warm driver.

It prepares what the deployment fixes (JVM, SparkSession, plugins, the analysed plan), then waits
for the runner to hand it an attempt, which the driver's ``main`` then runs in this process. Apart
from the driver's task kinds because all of it happens before there is an attempt to run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.references import RunContext
from streamling.bundle.task_definition import target_settings, task_definition
from streamling.errors import first_line

if TYPE_CHECKING:
    from streamling.config import Settings

#: the driver process logs as one logger, whichever module speaks: its log lines name it
log = logging.getLogger("streamling.bundle.driver")


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
        definition = task_definition(ws, self.version, self.job, self.task, {})
        os.chdir(definition.cwd)
        load_plugins(definition.settings.plugin.path)
        check_configured_plugins(definition.settings)
        plan = build_plan(definition.spec, definition.settings, dry_run=True)
        return definition.settings, not plan.bounded, f"warm standby for job '{self.job}' task '{self.task}'", plan

    def wait(self) -> dict[str, Any] | None:
        """Warm up, then the attempt to run once the go file appears; None when released first."""
        import signal

        from streamling.runtime.session import (
            build_session,
            claim_executors,
            idle_conf,
            prelaunch,
            session_key,
            warm_executors,
            warm_local_workers,
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
        if plan is None:  # a pooled driver: warmed with a pipeline like most tasks'
            plan = self._warm_up_plan(settings)
        spark, idle, holds, warming, kept = None, False, "a SparkSession", None, 0
        if settings.spark.master.startswith("local"):
            spark = build_session(settings, ui=ui)
            # the first job's one-time costs (code generation, the first tasks' Python workers) paid now
            warm_local_workers(spark, self._modules(plan))
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
        """The modules of the plan's nodes (their functions run in the executors' Python workers): the
        task's, or the warm-up pipeline's for a pooled driver, which has no task yet; streamling's own
        nodes module without a plan."""
        nodes = plan.nodes.values() if plan is not None else ()
        return tuple(sorted({type(node).__module__ for node in nodes} or {"streamling.runtime.nodes"}))

    #: what a pooled driver analyses while it waits (it has no task yet): a source, a SQL transform
    #: and a sink, so that the planner and Spark's analyser have loaded what most tasks need
    WARM_UP_PIPELINE = """
sources:
  numbers: {type: generate, rows: 1, primary_key: id}
transforms:
  shaped: {type: sql, sql: "SELECT id, customer, amount * quantity AS total FROM numbers WHERE amount > 0"}
sinks:
  out: {type: blackhole, from: shaped}
"""

    @classmethod
    def _warm_up_plan(cls, settings: Settings) -> Any:
        """The warm-up pipeline planned for the target's settings; None (nothing analysed, the Python
        workers import streamling's own nodes module) when those settings do not plan it: only a head
        start is lost, and the task that takes the driver says what is wrong with its settings."""
        from streamling.runtime.planner import build_plan
        from streamling.spec.pipeline import parse_pipeline

        try:
            return build_plan(parse_pipeline(cls.WARM_UP_PIPELINE, "<warm-up>"), settings, dry_run=True)
        except Exception as exc:  # noqa: BLE001 - a head start, not a condition of the task
            log.info("pooled warm driver: the warm-up pipeline does not plan (%s); it warms without it",
                     first_line(exc))
            return None

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
            definition = task_definition(Workspace(str(self.root)), int(attempt["deployment"]), self.job, self.task,
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
