"""The runner's warm standby drivers when things go wrong, without a JVM: a standby that dies
before it is needed is dropped with a warning pointing at its log and retried only after a back-off
(the task restarts cold meanwhile), and one warmed for a definition that changed is released and
leaves no files behind."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamling.bundle.runner import Attempt, Runner
from streamling.bundle.warm_drivers import Standby

RECORD = {"task_key": "main", "kind": "notebook", "fingerprint": "f1"}


def _runner(tmp_path: Path) -> Runner:
    runner = Runner(tmp_path / "root")
    runner.version = 1
    runner.deployment = {"version": 1, "mode": "production", "config": {"spark": {"master": "local[2]"}},
                         "jobs": {"stream": {"continuous": {"pause_status": "UNPAUSED"}, "tasks": [dict(RECORD)]}}}
    attempt = Attempt(1, 1, "stream", "main", 1, 1, 0, tmp_path / "main-1.log", time.time(), committed=True)
    runner.attempts[attempt.id] = attempt
    return runner


def _keep_standbys(runner: Runner, now: float) -> None:
    """What a tick of the runner asks of its warm drivers, with the runner's state."""
    runner.warm.keep_standbys(now, runner.deployment, runner.version, runner.attempts.values(), runner._draining)


def _keep_pool(runner: Runner, now: float) -> None:
    runner.warm.keep_pool(now, runner.deployment, runner.version, runner.attempts.values(), runner._draining)


def _take_pooled(runner: Runner, record: dict[str, object], python: str) -> Standby | None:
    return runner.warm.take_pooled(record, python, runner.deployment)


def _fake(runner: Runner, tmp_path: Path, command: str) -> list[Standby]:
    started: list[Standby] = []

    def start(job_key: str, task_key: str, record: dict[str, object], version: int | None) -> Standby:
        go = tmp_path / f"standby-{len(started)}.go"
        log_path = tmp_path / f"standby-{len(started)}.log"
        log_path.write_text("warming up\n")
        standby = Standby(job_key, task_key, str(record["fingerprint"]),
                          subprocess.Popen(["sh", "-c", command]), log_path, go, time.time())
        started.append(standby)
        return standby

    runner.warm._start = start  # type: ignore[method-assign]
    return started


def test_a_standby_that_dies_is_dropped_and_retried_after_a_back_off(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runner = _runner(tmp_path)
    started = _fake(runner, tmp_path, "exit 3")
    now = time.time()
    _keep_standbys(runner, now)
    assert len(started) == 1
    started[0].proc.wait()
    assert runner.warm.take_standby("stream", "main", RECORD) is None  # dead: the task starts cold
    with caplog.at_level(logging.WARNING, logger="streamling.bundle.runner"):
        _keep_standbys(runner, now + 0.1)
    assert "its warm standby driver exited (code 3) before it was needed; see" in caplog.text
    assert str(started[0].log_path) in caplog.text and started[0].log_path.exists()  # its log says why
    assert runner.warm.standbys == {}
    _keep_standbys(runner, now + 2)
    assert len(started) == 1  # not again before the back-off
    _keep_standbys(runner, now + 6)
    assert len(started) == 2
    runner.store.close()


def test_a_standby_for_a_changed_definition_is_released_and_forgotten(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    started = _fake(runner, tmp_path, "exec sleep 30")
    _keep_standbys(runner, time.time())
    [old] = started
    runner.deployment["jobs"]["stream"]["tasks"][0]["fingerprint"] = "f2"  # type: ignore[index]
    _keep_standbys(runner, time.time())
    assert runner.warm.standbys["stream", "main"].fingerprint == "f2" and len(started) == 2
    assert old.proc.wait(timeout=10) == -signal.SIGTERM  # asked to leave
    _keep_standbys(runner, time.time())
    assert not old.log_path.exists()  # a standby that left unused leaves no files
    # a draining runner (bundle destroy) starts none
    runner._draining = True
    runner.warm.standbys["stream", "main"].release()
    runner.warm.standbys.clear()
    _keep_standbys(runner, time.time())
    assert runner.warm.standbys == {}
    for standby in started:
        standby.proc.kill()
        standby.proc.wait()
    runner.store.close()


_WATCH = ("import sys, time; from pathlib import Path; from streamling.bundle.standby import leave_with_runner; "
          "leave_with_runner(Path(sys.argv[1]), 1); print('took the attempt', flush=True); time.sleep(30)")


def test_a_waiting_standby_leaves_when_its_runner_is_gone_even_while_its_parent_lives(tmp_path: Path) -> None:
    # The runner's end of the stdin pipe closes when it dies (a SIGKILL included). Here the parent stays
    # alive, as a subreaper or a PID namespace would make it look: the standby leaves all the same.
    proc = subprocess.Popen([sys.executable, "-c", _WATCH, str(tmp_path / "go")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdin is not None
    time.sleep(0.3)
    assert proc.poll() is None  # waits while the runner lives
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert proc.stdout is not None and proc.stdout.read() == b""


def test_a_standby_handed_its_attempt_keeps_it_when_the_runner_then_dies(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text("{}")
    proc = subprocess.Popen([sys.executable, "-c", _WATCH, str(go)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    try:
        assert proc.stdout.readline() == b"took the attempt\n"
    finally:
        proc.kill()
        proc.wait()


def test_one_pooled_warm_driver_is_kept_for_the_target_and_replaced_when_its_settings_change(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    started = _fake(runner, tmp_path, "exec sleep 30")
    try:
        for _ in range(5):  # kept, not started again on every tick
            _keep_pool(runner, time.time())
        [pooled] = started
        assert runner.warm.pool == [pooled] and pooled.job_key == ""
        # a task of the same target takes it; another interpreter (a task's own environment) does not
        assert _take_pooled(runner, RECORD, "/elsewhere/python") is None
        assert _take_pooled(runner, {**RECORD, "executes": True}, sys.executable) is None
        assert _take_pooled(runner, RECORD, sys.executable) is pooled and runner.warm.pool == []
        _keep_pool(runner, time.time())
        [_, second] = started
        # the target's settings change: the driver warmed for the old ones leaves and a new one comes
        runner.deployment["config"] = {"spark": {"master": "local[2]", "conf": {"spark.x": "1"}}}  # type: ignore[index]
        assert _take_pooled(runner, RECORD, sys.executable) is None  # never handed a stale session
        _keep_pool(runner, time.time())
        assert second.proc.wait(timeout=10) == -signal.SIGTERM
        assert len(started) == 3 and runner.warm.pool == [started[2]]
        runner.deployment["config"] = {"job_runner": {"warm_drivers": 0}}  # type: ignore[index]
        _keep_pool(runner, time.time())
        assert runner.warm.pool == [] and started[2].proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        for standby in started:
            standby.proc.kill()
            standby.proc.wait()
        runner.store.close()


def test_a_pooled_driver_that_cannot_warm_up_is_named_with_its_log_and_retried_after_a_back_off(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runner = _runner(tmp_path)
    started = _fake(runner, tmp_path, "exit 2")  # e.g. a target config its session cannot start with
    now = time.time()
    _keep_pool(runner, now)
    started[0].proc.wait()
    assert _take_pooled(runner, RECORD, sys.executable) is None  # dead: the task starts cold
    with caplog.at_level(logging.WARNING, logger="streamling.bundle.runner"):
        _keep_pool(runner, now + 0.1)
    assert f"a pooled warm driver exited (code 2) before it was needed; see {started[0].log_path}" in caplog.text
    assert runner.warm.pool == [] and len(started) == 1  # not again before the back-off
    _keep_pool(runner, now + 6)
    assert len(started) == 2
    for standby in started:
        standby.proc.kill()
        standby.proc.wait()
    runner.store.close()


def test_a_continuous_jobs_first_failure_restarts_at_once_and_later_ones_back_off() -> None:
    from streamling.bundle.triggers import continuous_backoff

    # a killed driver is replaced at once (by its warm standby); a crash loop backs off, doubling
    assert [continuous_backoff(n, 0.0) for n in range(6)] == [0.0, 0.0, 1.0, 2.0, 4.0, 8.0]
    assert continuous_backoff(30, 0.0) == 300.0
    # an interval the job asks for (min_retry_interval_millis) applies from the first failure
    assert [continuous_backoff(n, 5.0) for n in range(4)] == [0.0, 5.0, 10.0, 20.0]
