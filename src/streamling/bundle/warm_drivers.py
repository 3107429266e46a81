"""The job runner's warm drivers: driver processes started ahead of need, so that a task's next attempt
skips the JVM start and a SparkSession's warm-up.

Two kinds share one record (``Standby``) and one process protocol (``bundle.standby.Standby``): a task's
**standby** (``job_runner.standby``), warmed for the definition of one continuous job's pipeline task
and handed its next attempt when the active driver ends; and **pooled** warm drivers
(``job_runner.warm_drivers``), warmed for the target's settings and handed to the first task without a
standby of its own. ``WarmDrivers`` owns both and the back-off of those that die while they wait; the
runner calls it once per tick with what it needs to decide (the live deployment, the running attempts,
whether the target is being destroyed) and asks it for a driver when it launches an attempt.
``bundle summary`` reads what runs on this host through ``pool_state`` and ``standby_state``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.model import unpaused
from streamling.bundle.workspace import Workspace
from streamling.util import process_alive

if TYPE_CHECKING:
    from streamling.bundle.attempts import Attempt

# what warm drivers do is part of the runner's log
log = logging.getLogger("streamling.bundle.runner")

#: a driver younger than this that has not committed an epoch is still starting: no warm driver is
#: started beside it (two JVM starts on the same cores slow both)
STARTING_SECS = 60.0
#: the file stem of pooled warm drivers under ``logs/standby/`` (a standby's is ``<job>.<task>``)
POOL_STEM = "_pool"


@dataclass
class Standby:
    """A warm driver waiting to replace a task's active one (see ``bundle.standby.Standby``)."""

    job_key: str
    task_key: str
    fingerprint: str  #: the task definition it was warmed for: another one needs another JVM
    proc: subprocess.Popen[bytes]
    log_path: Path
    go_file: Path
    started: float

    @property
    def ready(self) -> bool:
        return Path(f"{self.go_file}.ready").exists()

    def release(self) -> None:
        """Ask it to leave (it stops its SparkSession and exits); reaped by ``WarmDrivers.keep_standbys``."""
        try:
            self.proc.send_signal(signal.SIGTERM)
        except OSError:
            pass
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def hand_over(self, log_path: Path, go: dict[str, Any]) -> None:
        """Make it an attempt's driver: its log becomes the attempt's ``log_path`` (the process keeps
        writing to the same file), then the go file hands it the attempt ``go`` describes."""
        self.log_path.rename(log_path)
        tmp = self.go_file.with_name(self.go_file.name + ".tmp")
        tmp.write_text(json.dumps(go))
        tmp.replace(self.go_file)
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # it is the task's driver now: it outlives this runner, as a cold one would

    def forget(self) -> None:
        """Remove the files of a standby that left unused."""
        for path in (self.log_path, Path(f"{self.go_file}.ready"), self.go_file):
            path.unlink(missing_ok=True)


class WarmDrivers:
    """The runner's standbys and pooled warm drivers on this host: which to keep, start, release, and
    which one takes an attempt."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.standbys: dict[tuple[str, str], Standby] = {}
        self.pool: list[Standby] = []  #: pooled warm drivers (job_runner.warm_drivers), for any task
        self._released: list[Standby] = []  # asked to leave, not reaped yet
        self._standby_retry: dict[tuple[str, str], tuple[int, float]] = {}  # failures, not before
        self._pool_retry: tuple[int, float] = (0, 0.0)  # failures, not before

    def release_all(self) -> None:
        """Ask every warm driver to leave: the target is being destroyed, or the runner stops."""
        for standby in [*self.standbys.values(), *self.pool]:
            standby.release()
            self._released.append(standby)
        self.standbys.clear()
        self.pool.clear()

    # --- warm standby drivers -----------------------------------------------------------------------

    def keep_standbys(self, now: float, deployment: dict[str, Any] | None, version: int | None,
                      attempts: Iterable[Attempt], draining: bool) -> None:
        """A ready standby for each task that wants one once its first driver runs; kept while the
        deployed definition is the one it was warmed for (it is needed exactly when that driver has
        ended), replaced when it changes or dies. None starts while the target is ``draining``."""
        eligible: dict[tuple[str, str], dict[str, Any]] = {}
        for job_key, job in ((deployment or {}).get("jobs") or {}).items():
            for record in job.get("tasks") or []:
                if _standby_wanted(deployment, job_key, record):
                    eligible[(job_key, str(record["task_key"]))] = record
        # once the task's driver has committed an epoch: a standby started beside a cold driver would
        # slow its start (and, on a cluster, could take the executors it waits for)
        running: set[tuple[str, str]] = set()
        for a in attempts:
            if (a.job_key, a.task_key) in eligible and not a.remote and a.stopping is None:
                a.committed = a.committed or _committed(a.log_path)
                if a.committed:
                    running.add((a.job_key, a.task_key))
        for key, standby in list(self.standbys.items()):
            code = standby.proc.poll()
            if code is not None:
                del self.standbys[key]
                self._standby_retry[key] = _died(standby, code, self._standby_retry.get(key, (0, 0.0))[0], now,
                                                 f"job '{key[0]}' task '{key[1]}': its warm standby driver")
            elif key not in eligible or eligible[key]["fingerprint"] != standby.fingerprint:
                del self.standbys[key]
                standby.release()
                self._released.append(standby)
        for gone in [s for s in self._released if s.proc.poll() is not None]:
            self._released.remove(gone)
            gone.forget()
        for key, record in eligible.items():
            if draining or key not in running or key in self.standbys:
                continue
            if now >= self._standby_retry.get(key, (0, 0.0))[1]:
                self.standbys[key] = self._start(key[0], key[1], record, version)

    def _start(self, job_key: str, task_key: str, record: dict[str, Any], version: int | None) -> Standby:
        """A warm standby for one task (or, with no job and task, a pooled warm driver) of deployment
        ``version``."""
        assert version is not None
        folder = self.ws.logs / "standby"
        folder.mkdir(parents=True, exist_ok=True)
        stem = f"{job_key}.{task_key}.{time.time_ns()}" if job_key else f"{POOL_STEM}.{time.time_ns()}"
        log_path, go_file = folder / f"{stem}.log", folder / f"{stem}.go"
        python, fingerprint = record.get("python") or sys.executable, str(record["fingerprint"])
        cmd = [python, "-m", "streamling.bundle.driver", "--root", str(self.ws.root), "--deployment",
               str(version), *(["--job", job_key, "--task", task_key] if job_key else []), "--standby",
               str(go_file)]
        with open(log_path, "ab") as out:
            # stdin is a pipe this runner holds: when the runner dies, however, the standby sees EOF and leaves
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                    start_new_session=True, cwd=str(self.ws.root))
        if job_key:
            log.info("job '%s' task '%s': warm standby driver started (pid %d, deployment %d)", job_key, task_key,
                     proc.pid, version)
        else:
            log.info("pooled warm driver started (pid %d, deployment %d): the next task without a standby takes it",
                     proc.pid, version)
        return Standby(job_key, task_key, fingerprint, proc, log_path, go_file, time.time())

    def take_standby(self, job_key: str, task_key: str, record: dict[str, Any]) -> Standby | None:
        """The task's standby for this definition, if it has one (else it starts cold). One still
        warming up takes the attempt when it is ready: sooner than a cold driver started now."""
        standby = self.standbys.get((job_key, task_key))
        if standby is None or standby.proc.poll() is not None or standby.fingerprint != record.get("fingerprint"):
            return None
        del self.standbys[(job_key, task_key)]
        self._standby_retry.pop((job_key, task_key), None)
        return standby

    # --- pooled warm drivers ------------------------------------------------------------------------

    def keep_pool(self, now: float, deployment: dict[str, Any] | None, version: int | None,
                  attempts: Iterable[Attempt], draining: bool) -> None:
        """Keep ``_pool_size`` pooled drivers, warmed for the live deployment's settings: reap the dead,
        release those warmed for other settings, and start new ones, not beside a driver that is still
        starting (it would slow that start), nor while the target is ``draining``."""
        key = _pool_key(deployment)
        for driver in list(self.pool):
            code = driver.proc.poll()
            if code is not None:
                self.pool.remove(driver)
                self._pool_retry = _died(driver, code, self._pool_retry[0], now, "a pooled warm driver")
            elif driver.fingerprint != key:
                self.pool.remove(driver)
                driver.release()
                self._released.append(driver)
        size = _pool_size(deployment)
        while len(self.pool) > size:
            driver = self.pool.pop()
            driver.release()
            self._released.append(driver)
        starting = False
        for a in attempts:
            if not a.remote and a.stopping is None and not a.committed and now - a.started < STARTING_SECS:
                a.committed = _committed(a.log_path)
                starting = starting or not a.committed
        if draining or starting or len(self.pool) >= size or now < self._pool_retry[1]:
            return
        self.pool.append(self._start("", "", {"fingerprint": key}, version))

    def take_pooled(self, record: dict[str, Any], python: str, deployment: dict[str, Any] | None) -> Standby | None:
        """A pooled warm driver for a task that has no standby of its own: a notebook pipeline task
        on streamling's own interpreter (a task with libraries runs on its own environment's). The
        first ready one, else one still warming up (sooner than a cold start)."""
        if record.get("kind") != "notebook" or record.get("executes") or python != sys.executable:
            return None
        key = _pool_key(deployment)
        alive = [d for d in self.pool if d.proc.poll() is None and d.fingerprint == key]
        if not alive:
            return None
        driver = next((d for d in alive if d.ready), alive[0])
        self.pool.remove(driver)
        self._pool_retry = (0, 0.0)
        return driver


def _standby_wanted(deployment: dict[str, Any] | None, job_key: str, record: dict[str, Any]) -> bool:
    """A continuous job's pipeline task gets a warm standby when ``job_runner.standby`` says so
    (``auto``: on a production-mode target; off in development, where a second JVM per job costs
    memory on a laptop and a restart's delay matters less). On a cluster the standby is a driver
    JVM without a SparkContext: no application of its own, no executors held."""
    deployment = deployment or {}
    job = deployment.get("jobs", {}).get(job_key) or {}
    if not unpaused(job.get("continuous")) or record.get("kind") != "notebook" or record.get("executes"):
        return False
    config = deployment.get("config") or {}
    wanted = (config.get("job_runner") or {}).get("standby", "auto")
    if wanted == "auto":
        return deployment.get("mode") == "production"
    return bool(wanted)


def _pool_size(deployment: dict[str, Any] | None) -> int:
    """How many pooled warm drivers the live deployment wants (``job_runner.warm_drivers``;
    ``auto``: one on a production-mode target that has a task one can serve — a notebook of
    ``%%streamling`` cells —, none in development, as for standbys)."""
    deployment = deployment or {}
    wanted = ((deployment.get("config") or {}).get("job_runner") or {}).get("warm_drivers", "auto")
    if wanted != "auto":
        return int(wanted)
    servable = any(t.get("kind") == "notebook" and not t.get("executes")
                   for job in (deployment.get("jobs") or {}).values() for t in job.get("tasks") or [])
    return 1 if deployment.get("mode") == "production" and servable else 0


def _pool_key(deployment: dict[str, Any] | None) -> str:
    """The target-level settings a pooled driver is warmed for: another deployment's config needs
    another JVM (its tasks would not fit the session), the same one does not."""
    config = (deployment or {}).get("config") or {}
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _committed(log_path: Path) -> bool:
    """Whether an attempt's driver has committed an epoch (its figures file says so): until then it
    is still starting, and no warm driver is started beside it."""
    try:
        figures = json.loads(Path(f"{log_path}.stats.json").read_text())
        return int(figures["checkpoint"]["epochs_succeeded"]) > 0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _died(driver: Standby, code: int, failures: int, now: float, what: str) -> tuple[int, float]:
    """A warm driver (standby or pooled) that exited before it was needed: said once with its log
    (which stays: it says why), and the next one not before a back-off that doubles per failure
    (5 s up to 5 min). Returns the failures so far and the time the next may start."""
    Path(f"{driver.go_file}.ready").unlink(missing_ok=True)
    log.warning("%s exited (code %s) before it was needed; see %s", what, code, driver.log_path)
    return failures + 1, now + min(300.0, 5.0 * 2 ** failures)


# --- what ``bundle summary`` shows ----------------------------------------------------------------------

def pool_state(ws: Workspace) -> list[str]:
    """What ``bundle summary`` says of the target's pooled warm drivers on this host
    (``job_runner.warm_drivers``): one ``ready (pid, memory)`` or ``warming up`` each."""
    return [state for state in (_warm_state(log_path) for log_path in
                                sorted((ws.logs / "standby").glob(f"{POOL_STEM}.*.log"))) if state is not None]


def _warm_state(log_path: Path) -> str | None:
    ready = log_path.with_name(log_path.name.removesuffix(".log") + ".go.ready")
    try:
        pid = int(ready.read_text())
    except (OSError, ValueError):
        return "warming up"
    if not process_alive(pid):
        return None
    return f"ready (pid {pid}, {group_rss_mb(pid):.0f} MB)"


def standby_state(ws: Workspace, job_key: str, task_key: str) -> str | None:
    """What ``bundle summary`` says of a task's warm standby on this host: ``ready (pid, memory)``,
    ``warming up``, or None when it has none (its files are removed when it leaves)."""
    for log_path in sorted((ws.logs / "standby").glob(f"{job_key}.{task_key}.*.log")):
        state = _warm_state(log_path)
        if state is not None:
            return state
    return None


def group_rss_mb(pgid: int) -> float:
    """Resident memory of the processes of group ``pgid`` (a driver: its Python and its JVM), in MB."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024
