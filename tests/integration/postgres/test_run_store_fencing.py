"""When supervision fails over, the old side stops before the new one may act: a fenced driver dies at
its next heartbeat, a driver cut off from the run store dies within half a lease of its last heartbeat
(a taker waits a whole lease of silence), and a runner whose lease passed to another stops supervising.
Real Postgres; the cut is host B's link going down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from streamling.bundle.lease import LeaseLost
from streamling.bundle.runner import Runner
from streamling.bundle.workspace import Workspace
from streamling.config.sections import JobRunnerSettings

pytestmark = [pytest.mark.postgres]
LEASE_SECS = 4.0
FENCE = """
import logging, sys, time
from pathlib import Path
from streamling.bundle.fence import Fence
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
Fence(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
time.sleep(120)
"""


def _root(tmp_path: Path, service: Mapping[str, str], host: str, schema: str) -> Workspace:
    ws = Workspace(str(tmp_path / "root"))
    ws.root.mkdir(parents=True)
    ws.record_store(JobRunnerSettings.model_validate({
        "store": "postgres", "lease_secs": LEASE_SECS,
        "postgres": {"host": host, "port": int(service["STREAMLING__POSTGRES_SINK__PORT"]),
                     "user": service["STREAMLING__POSTGRES_SINK__USER"],
                     "db": service["STREAMLING__POSTGRES_SINK__DB"]}}),
        schema)
    return ws


@pytest.fixture
def store_env(postgres_service: Mapping[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("STREAMLING__JOB_RUNNER__POSTGRES__PASS", postgres_service["STREAMLING__POSTGRES_SINK__PASS"])
    return {**os.environ}


@pytest.fixture
def cleanup() -> Iterator[list[Workspace]]:
    roots: list[Workspace] = []
    yield roots
    for ws in roots:
        store = ws.open_store()
        store.destroy()
        store.close()


def _driver(ws: Workspace, env: dict[str, str], tmp_path: Path, prefix: list[str]) -> tuple[subprocess.Popen[str], int,
                                                                                            Path]:
    store = ws.open_store()
    run_id = store.create_run("job", 1, "continuous", {}, ["t"])
    attempt = store.start_attempt(run_id, "t", 1, 1, str(tmp_path / "t-1.log"), "host-a")
    store.set_attempt(attempt, heartbeat_at=None)  # the driver's own heartbeats from now on
    exit_file = tmp_path / "t-1.log.exit"
    proc = subprocess.Popen([*prefix, sys.executable, "-c", FENCE, str(ws.root), str(attempt), str(exit_file)],
                            env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while store.heartbeat_age(attempt) is None:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the driver never heartbeat"
        time.sleep(0.2)
    store.close()
    return proc, attempt, exit_file


def test_a_fenced_driver_stops_at_its_next_heartbeat(tmp_path: Path, postgres_service: Mapping[str, str],
                                                     store_env: dict[str, str], unique_name: str,
                                                     cleanup: list[Workspace]) -> None:
    ws = _root(tmp_path, postgres_service, "127.0.0.1", unique_name)
    cleanup.append(ws)
    proc, attempt, exit_file = _driver(ws, store_env, tmp_path, [])
    store = ws.open_store()
    store.fence(attempt, "host-b:7:0")
    fenced = time.monotonic()
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - fenced < 3, err
    assert exit_file.read_text() == "75"
    assert "this driver stops now: runner host-b:7:0 took over supervision" in err
    store.close()


def test_a_driver_cut_off_from_the_store_stops_before_a_taker_may_start_its_task(
        tmp_path: Path, postgres_service: Mapping[str, str], store_env: dict[str, str], unique_name: str,
        cleanup: list[Workspace]) -> None:
    address = postgres_service.get("STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS")
    if not address:
        pytest.fail("postgres does not listen on host A's end of the two-host pair: restart it as root")
    ws = _root(tmp_path, postgres_service, address, unique_name)
    cleanup.append(ws)
    proc, attempt, exit_file = _driver(ws, store_env, tmp_path, ["ip", "netns", "exec", "streamling-hostb"])
    store = ws.open_store()
    try:
        subprocess.run(["ip", "link", "set", "sl-hosta", "down"], check=True)  # host B is cut off
        cut = time.monotonic()
        err = proc.communicate(timeout=60)[1]
        stopped = time.monotonic() - cut
    finally:
        subprocess.run(["ip", "link", "set", "sl-hosta", "up"], check=True)
    assert proc.returncode == -signal.SIGKILL and exit_file.read_text() == "75", err
    assert "the run store has not answered for" in err
    # At most half a lease (and a watchdog tick) after its last heartbeat, which came before the cut;
    # a runner taking over waits for a whole lease of silence.
    assert stopped < LEASE_SECS * 0.75, (stopped, err)
    age = store.heartbeat_age(attempt)
    assert age is not None and age >= stopped
    store.close()


def test_a_runner_whose_lease_passed_to_another_stops_supervising(
        tmp_path: Path, postgres_service: Mapping[str, str], store_env: dict[str, str], unique_name: str,
        cleanup: list[Workspace]) -> None:
    ws = _root(tmp_path, postgres_service, "127.0.0.1", unique_name)
    cleanup.append(ws)
    runner = Runner(ws.root)
    try:
        assert runner.lease.take()
        runner.lease.renew()  # held: renewing works
        time.sleep(LEASE_SECS + 0.3)  # it stalled past its lease (a long GC, a frozen VM)
        other = ws.open_store()
        assert other.acquire_lease("host-b:9:0", "host-b", 9, LEASE_SECS) is not None
        other.close()
        with pytest.raises(LeaseLost, match="another runner holds the lease now"):
            runner.lease.renew()
    finally:
        runner.store.close()
