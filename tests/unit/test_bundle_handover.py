"""The job runner's side of a hot redeploy, without a JVM: what it asks a running driver, what it
records from the driver's answers, and that a runner restarted in between picks up where the
handshake stands. The driver here is a sleeping process that writes nothing by itself; the test
writes its answers as a driver would (tests/integration/bundle has the real driver)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamling.bundle import handover
from streamling.bundle.runner import Runner
from streamling.bundle.workspace import Workspace
from streamling.config import Settings


def _deploy(ws: Workspace, version: int, fingerprint: str, kind: str = "notebook") -> None:
    folder = ws.deployment_dir(version)
    folder.mkdir(parents=True)
    task = {"task_key": "main", "kind": kind, "fingerprint": fingerprint, "max_retries": 0}
    (folder / "deployment.json").write_text(json.dumps({
        "version": version, "created_at": time.time(), "jobs": {"stream": {"tasks": [task]}}}))
    ws.set_current(version)


@pytest.fixture
def driver() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def started(tmp_path: Path, driver: subprocess.Popen[bytes]) -> tuple[Workspace, Path, int]:
    """Deployment 1 live, one run whose attempt (the sleeping 'driver') runs it."""
    ws = Workspace(str(tmp_path / "root"))
    _deploy(ws, 1, "v1")
    store = ws.open_store()
    run_id = store.create_run("stream", 1, "manual", {}, ["main"])
    store.set_run(run_id, state="running")
    log_path = ws.logs / f"run-{run_id}" / "main-1.log"
    log_path.parent.mkdir(parents=True)
    attempt_id = store.start_attempt(run_id, "main", 1, 1, str(log_path))
    store.set_attempt(attempt_id, pid=driver.pid)
    store.close()
    return ws, log_path, run_id


def _answer(log_path: Path, running: int, request: int | None, state: str = handover.RUNNING,
            message: str | None = None) -> None:
    handover.write(handover.status_file(log_path), {"running": running, "request": request, "state": state,
                                                    "message": message})


def _runner(ws: Workspace) -> Runner:
    """A runner as it starts: adopts the running attempts (no runs are launched or triggered here)."""
    runner = Runner(ws.root)
    runner._adopt()
    return runner


def _step(runner: Runner) -> None:
    runner.load_deployment()
    runner.swaps.poll(runner.attempts.values())
    runner.reaper.reap(time.time(), runner.attempts, runner.deployment, runner.version)


def _records(ws: Workspace, run_id: int) -> tuple[Any, list[Any]]:
    store = ws.open_store()
    return store.run(run_id), [dict(a) for a in store.attempts(run_id)]


def test_a_changed_notebook_task_is_swapped_in_its_driver_across_a_runner_restart(
        started: tuple[Workspace, Path, int], driver: subprocess.Popen[bytes]) -> None:
    ws, log_path, run_id = started
    _answer(log_path, running=1, request=None)  # the driver can swap
    runner = _runner(ws)
    _step(runner)
    _deploy(ws, 2, "v2")
    _step(runner)
    assert handover.read(handover.request_file(log_path))["deployment"] == 2  # type: ignore[index]
    run, attempts = _records(ws, run_id)
    assert run.deployment == 1, "the run shows deployment 2 only once the driver runs it"

    # The runner restarts; meanwhile the driver swapped. The new runner records it.
    _answer(log_path, running=2, request=2)
    runner = _runner(ws)
    _step(runner)
    run, attempts = _records(ws, run_id)
    assert (run.deployment, run.message) == (2, "moved to deployment 2 in its running driver (no restart)")
    assert [(a["state"], a["pid"], a["deployment"]) for a in attempts] == [("running", driver.pid, 2)]
    assert driver.poll() is None, "the driver was not stopped"


def test_a_revert_deployed_before_the_driver_answered_supersedes_the_swap(
        started: tuple[Workspace, Path, int]) -> None:
    ws, log_path, run_id = started
    _answer(log_path, running=1, request=None)
    runner = _runner(ws)
    _step(runner)
    _deploy(ws, 2, "v2")
    _step(runner)
    _deploy(ws, 3, "v1")  # back to what the driver runs, before it picked up deployment 2
    _step(runner)
    assert handover.read(handover.request_file(log_path))["deployment"] == 3  # type: ignore[index]


def _swap_requested(ws: Workspace, log_path: Path) -> Runner:
    """A runner that saw the driver run deployment 1, then asked it to swap to deployment 2."""
    _answer(log_path, running=1, request=None)
    runner = _runner(ws)
    _step(runner)
    _deploy(ws, 2, "v2")
    _step(runner)
    return runner


def test_a_refused_swap_keeps_the_run_on_its_version_with_the_error(
        started: tuple[Workspace, Path, int], driver: subprocess.Popen[bytes]) -> None:
    ws, log_path, run_id = started
    runner = _swap_requested(ws, log_path)
    _answer(log_path, running=1, request=2, state=handover.FAILED,
            message="sql transform 'tagged': column `no_such_column` does not exist")
    _step(runner)
    _step(runner)  # answered once: nothing more happens
    run, attempts = _records(ws, run_id)
    assert run.message == ("deployment 2 was not applied, the run goes on with deployment 1: sql transform 'tagged': "
                           "column `no_such_column` does not exist")
    assert run.deployment == 1 and [(a["state"], a["deployment"]) for a in attempts] == [("running", 1)]
    assert driver.poll() is None
    # A restarted runner does not ask again for the deployment the driver refused.
    request = handover.read(handover.request_file(log_path))
    runner = _runner(ws)
    _step(runner)
    assert handover.read(handover.request_file(log_path)) == request and driver.poll() is None


def test_a_change_that_needs_a_new_jvm_stops_the_driver_and_says_why(
        started: tuple[Workspace, Path, int], driver: subprocess.Popen[bytes]) -> None:
    ws, log_path, run_id = started
    runner = _swap_requested(ws, log_path)
    _answer(log_path, running=1, request=2, state=handover.NEEDS_RESTART, message="spark.conf changed (spark.x)")
    _step(runner)
    assert driver.wait(10) == -15  # SIGTERM: it finishes its epoch and exits
    _step(runner)
    _, attempts = _records(ws, run_id)
    assert [(a["state"], a["reason"]) for a in attempts] == [
        ("redeployed", "stopped to move to deployment 2 (deployment 2 needs a new driver JVM: spark.conf changed "
                       "(spark.x))")]


@pytest.mark.parametrize(("status", "kind", "why"), [
    (False, "notebook", "its driver does not take new definitions while it runs (an older streamling started it)"),
    (True, "spark_python", "only a notebook task's pipeline can be swapped in a running driver"),
])
def test_a_driver_that_cannot_swap_is_restarted(started: tuple[Workspace, Path, int], driver: subprocess.Popen[bytes],
                                                status: bool, kind: str, why: str) -> None:
    ws, log_path, run_id = started
    if status:
        _answer(log_path, running=1, request=None)
    runner = _runner(ws)
    _step(runner)
    _deploy(ws, 2, "v2", kind=kind)
    _step(runner)
    assert driver.wait(10) == -15
    assert not handover.request_file(log_path).exists()
    _step(runner)
    _, attempts = _records(ws, run_id)
    assert [(a["state"], a["reason"]) for a in attempts] == [("redeployed", f"stopped to move to deployment 2 ({why})")]


def test_spark_and_plugin_settings_need_a_new_jvm_the_rest_does_not() -> None:
    base = Settings(spark={"master": "local[2]", "conf": {"spark.a": "1", "spark.secret.key": "s3cr3t"}})
    same = base.model_copy(update={"application_id": "other", "checkpoint_interval_sec": 1,
                                   "plugin": base.plugin.model_copy(update={"side_output_ids": ["audit"]})})
    assert handover.restart_reasons(base, same) == []
    changed = Settings(spark={"master": "local[1]", "shuffle_partitions": 4, "conf": {"spark.a": "2"}},
                       plugin={"path": "/plugins", "side_output_ids": ["audit"]})
    reasons = handover.restart_reasons(base, changed)
    assert reasons == ["spark.master changed (local[2] → local[1])", "spark.shuffle_partitions changed (2 → 4)",
                       "spark.conf changed (spark.a, spark.secret.key)", "plugin.path changed (None → /plugins)"]
    assert "s3cr3t" not in " ".join(reasons)
