"""A Postgres outage during a run, on a private cluster (loopback, stopped and started with pg_ctl
on the same port): the flow's retry policy alone decides how many connection attempts it costs,
and no row is lost or written twice when Postgres returns.

1. Postgres stops after the first epoch and stays down: the flow makes exactly ``max_attempts``
   connection attempts, then fails with a retriable error naming the sink.
2. The rerun resumes from the checkpoint; Postgres stops again after its first epoch and comes back
   while the flow is backing off: the same run carries on and the table holds every row once.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from harness import Runner
from test_stop_during_outage import own_postgres  # noqa: F401 - the private cluster fixture

from streamling.errors import StreamlingError
from streamling.postgres import connect_attempts
from streamling.runtime import events as ev
from streamling.sources.generate import generate_batch

pytestmark = [pytest.mark.postgres, pytest.mark.spark]
ROWS, PER_EPOCH = 600, 100
POLICY = {"max_attempts": 5, "initial_backoff_ms": 300, "max_backoff_ms": 1200}


class Cluster:
    """Stops and starts the private cluster in place (``pg_ctl``, same data directory and port)."""

    def __init__(self, exports: dict[str, str], data: Path) -> None:
        self.exports, self.data = exports, data
        self.port = exports["STREAMLING__POSTGRES_SINK__PORT"]
        self.target = f"127.0.0.1:{self.port}/{exports['STREAMLING__POSTGRES_SINK__DB']}"
        self.bindir = next(p for p in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
                           if (p / "pg_ctl").exists())
        self.sockets = Path(tempfile.mkdtemp(prefix="sl-pg-sock-", dir="/tmp"))
        self.sockets.chmod(0o777)

    def _pg_ctl(self, *args: str) -> None:
        cmd = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", *args]
        if os.getuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=90, cwd="/")

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "fast")

    def start(self) -> None:
        self._pg_ctl("-l", str(self.data.parent / "postgres.log"), "-o",
                     f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.sockets} -c fsync=off", "start")

    def ids(self) -> list[int]:
        with psycopg.connect(self.exports["STREAMLING_TEST_POSTGRES_DSN"]) as conn:
            return [r[0] for r in conn.execute("SELECT id FROM outage.orders ORDER BY id").fetchall()]


@pytest.fixture
def cluster(own_postgres: tuple[Callable[[], dict[str, str]], Callable[[], None]]) -> Iterator[Cluster]:  # noqa: F811
    up, _down = own_postgres
    exports = up()
    with psycopg.connect(exports["STREAMLING_TEST_POSTGRES_DSN"]) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None and "sl-outage-pg-" in row[0]  # the private cluster, never the shared one
    yield Cluster(exports, Path(row[0]))


def test_outage_costs_the_retry_policy_and_recovers_without_loss(tmp_path: Path, spark: Any,
                                                                 cluster: Cluster) -> None:
    pipeline = f"""
        sources:
          orders: {{type: generate, rows: {ROWS}, rows_per_batch: {PER_EPOCH}}}
        transforms: {{}}
        sinks:
          db: {{type: postgres, from: orders, schema: outage, table: orders}}
        """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    environ.update({k: v for k, v in cluster.exports.items() if k.startswith("STREAMLING__POSTGRES_SINK__")})
    runner = Runner(spark, tmp_path, environ=environ)
    expected = sorted(generate_batch("orders", 0, ROWS, 0, 0).column("id").to_pylist())

    # 1. Down for good after the first epoch: exactly max_attempts connection attempts, then a retriable failure.
    down = threading.Event()
    attempts_at_stop: list[int] = []
    stopped_at: list[float] = []

    def stop_once(event: ev.Event) -> None:
        if isinstance(event, ev.EpochFlushed) and not down.is_set():
            cluster.stop()
            attempts_at_stop.append(connect_attempts(cluster.target))
            stopped_at.append(time.monotonic())
            down.set()

    run = runner.pipeline(pipeline, retry=POLICY)
    run.bus.subscribe(stop_once)
    run.start()
    try:
        with pytest.raises(StreamlingError) as info:
            run.wait(timeout_secs=120)
        failed_after = time.monotonic() - stopped_at[0]
    finally:
        run.stop("test finished")
    attempts = connect_attempts(cluster.target) - attempts_at_stop[0]
    print(f"outage 1: {attempts} connection attempts (policy {POLICY['max_attempts']}), failed "
          f"{failed_after:.1f}s after Postgres stopped")
    assert attempts == POLICY["max_attempts"]
    err = info.value
    assert err.retriable and err.node == "db", err.describe()
    assert f"gave up after {POLICY['max_attempts']} attempts" in str(err)

    # 2. Back, then down again after the rerun's first epoch and back while the flow backs off.
    cluster.start()
    down.clear()
    back: dict[str, float] = {}

    def restart_during_backoff() -> None:
        down.wait(60)
        base = attempts_at_stop[-1]
        deadline = time.monotonic() + 60
        while connect_attempts(cluster.target) - base < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        cluster.start()
        back["at"] = time.monotonic()

    helper = threading.Thread(target=restart_during_backoff, daemon=True)
    helper.start()
    run = runner.pipeline(pipeline, retry=POLICY)
    flushed_at: list[float] = []
    run.bus.subscribe(stop_once)
    run.bus.subscribe(lambda e: flushed_at.append(time.monotonic()) if isinstance(e, ev.EpochFlushed) else None)
    run.start()
    try:
        run.wait(timeout_secs=120)
    finally:
        run.stop("test finished")
    helper.join(timeout=60)
    attempts = connect_attempts(cluster.target) - attempts_at_stop[-1]
    recovery = min(t for t in flushed_at if t >= back["at"]) - back["at"]
    print(f"outage 2: {attempts} connection attempts, first epoch written {recovery:.2f}s after Postgres was back")
    assert 3 <= attempts <= POLICY["max_attempts"]  # two refused, then one (rarely two) until it is up
    assert cluster.ids() == expected  # none lost, none twice
