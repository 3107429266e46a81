"""SIGTERM while the Postgres sink retries an outage: the process stops within the shutdown budget
with exit code 3 (the epoch was not committed) instead of retrying on; a rerun once Postgres is back
leaves the table exactly right.

The outage is real: the test starts its own throwaway Postgres cluster (the fixture script with a
private cache dir, so the shared server is never touched) and stops it after the first epoch.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from services import parse_exports

from streamling.sources.generate import generate_batch

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]
SERVICES = ROOT / "fixtures" / "services"
ROWS, PER_EPOCH = 4000, 200  # 20 epochs: plenty left when the server goes away after epoch 0
BUDGET_SECS = 25  # shutdown_budget_secs default
MARGIN_SECS = 5


@pytest.fixture
def own_postgres() -> Iterator[tuple[Callable[[], dict[str, str]], Callable[[], None]]]:
    """``(up, down)`` for a Postgres cluster private to this test (state in a fresh cache dir)."""
    home = Path(tempfile.mkdtemp(prefix="sl-outage-pg-", dir="/tmp"))
    home.chmod(0o755)  # the server runs as the postgres OS user when we are root
    env = {**os.environ, "STREAMLING_CACHE_DIR": str(home)}

    def script(name: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(SERVICES / name), "postgres"], env=env, capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, f"{name} postgres failed:\n{proc.stderr[-2000:]}"
        return proc

    def up() -> dict[str, str]:
        return parse_exports(script("up").stdout)

    def down() -> None:
        assert (home / "services" / "postgres" / "data" / "PG_VERSION").exists()  # ours, never the shared one
        script("down")

    try:
        yield up, down
    finally:
        if (home / "services" / "postgres" / "data" / "PG_VERSION").exists():
            subprocess.run([str(SERVICES / "down"), "postgres"], env=env, capture_output=True, timeout=180)
        shutil.rmtree(home, ignore_errors=True)


def _cli_env(exports: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    env.update({k: v for k, v in exports.items() if k.startswith("STREAMLING__POSTGRES_SINK__")})
    env.update(STREAMLING_CACHE_DIR=str(ROOT / ".cache"), STREAMLING__APPLICATION_ID="stop_during_outage",
               STREAMLING__STATE_DIR=str(tmp_path / "state"), STREAMLING__RETRY__MAX_ATTEMPTS="1000",
               # the rerun resumes the stopped run's checkpoint: a backend that keeps positions
               STREAMLING__STATE_BACKEND__BACKEND_TYPE="Sqlite",
               STREAMLING__STATE_BACKEND__SQLITE__DATABASE_PATH=str(tmp_path / "state" / "state.db"))
    return env


def _lines(stream: object) -> queue.Queue[str | None]:
    """stderr lines on a queue (``None`` at EOF), so every wait below has a deadline."""
    out: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            out.put(line)
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def _wait_for(lines: queue.Queue[str | None], seen: list[str], done: Callable[[], bool], secs: float) -> None:
    deadline = time.monotonic() + secs
    while not done():
        left = deadline - time.monotonic()
        assert left > 0, "timed out; last lines:\n" + "".join(seen[-30:])
        try:
            line = lines.get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
        assert line is not None, "the process ended early; last lines:\n" + "".join(seen[-30:])
        seen.append(line)


Wait = Callable[[Callable[[], bool], float], None]


def _sigterm_after_fault(cmd: list[str], cwd: Path, env: dict[str, str], fault: Callable[[list[str], Wait], None],
                         wait_secs: float) -> tuple[int, float, list[str], list[str]]:
    """Run the CLI until epoch 0 is finalized, apply ``fault`` (given the lines so far and a way to wait
    for more), then SIGTERM: the exit code, seconds from SIGTERM to exit, the lines before and after it."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = _lines(proc.stderr)
    seen: list[str] = []
    try:
        _wait_for(lines, seen, lambda: any("epoch 0 finalized" in line for line in seen), 300)
        fault(seen, lambda done, secs: _wait_for(lines, seen, done, secs))
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(timeout=wait_secs)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    rest = []
    while (line := lines.get(timeout=10)) is not None:
        rest.append(line)
    return proc.returncode, elapsed, seen, rest


def test_sigterm_during_postgres_outage_exits_3_within_budget_then_rerun_is_exact(tmp_path, own_postgres):
    up, down = own_postgres
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
sources:
  orders: {{type: generate, rows: {ROWS}, rows_per_batch: {PER_EPOCH}}}
sinks:
  db: {{type: postgres, from: orders, schema: outage, table: orders}}
""")
    cmd = [sys.executable, "-m", "streamling.cli", str(pipeline)]

    def outage(seen: list[str], wait: Wait) -> None:
        down()  # nothing listens on the sink's port any more
        wait(lambda: sum("retrying in" in line for line in seen) >= 3, 120)

    code, elapsed, seen, rest = _sigterm_after_fault(cmd, tmp_path, _cli_env(up(), tmp_path), outage,
                                                     BUDGET_SECS + 60)
    output = "".join(seen + rest)
    print(f"SIGTERM to exit during the outage: {elapsed:.1f}s, exit code {code}")
    assert code == 3, output[-3000:]
    assert elapsed < BUDGET_SECS + MARGIN_SECS, f"{elapsed:.1f}s\n{output[-3000:]}"
    verdict = [line for line in rest if "(exit code 3)" in line]
    assert len(verdict) == 1, output[-3000:]
    assert " ERROR " in verdict[0] and "postgres sink 'db': stop requested while retrying: epoch " in verdict[0]
    assert "was not committed; it is replayed on the next start" in verdict[0]
    assert "Traceback" not in output

    rerun = subprocess.run(cmd, cwd=tmp_path, env=_cli_env(exports := up(), tmp_path), capture_output=True,
                           text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    import psycopg

    with psycopg.connect(exports["STREAMLING_TEST_POSTGRES_DSN"]) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM outage.orders ORDER BY id").fetchall()]
    assert ids == sorted(generate_batch("orders", 0, ROWS, 0, 0).column("id").to_pylist())  # none lost, none twice


def test_sigterm_with_a_stuck_epoch_exits_3_when_the_budget_runs_out(tmp_path, pg_environ, pg_dsn, unique_name):
    """An epoch that cannot be interrupted ends with the budget: a ``postgres_aggregate`` sink writes
    from the driver, where a statement waiting for a table lock ignores the query's stop (the
    ``postgres`` sink's writers run in Spark tasks, which the stop cancels)."""
    import psycopg

    budget = 4
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
sources:
  orders: {{type: generate, rows: {ROWS}, rows_per_batch: {PER_EPOCH}, primary_key: id}}
sinks:
  db:
    type: postgres_aggregate
    from: orders
    schema: {unique_name}
    landing_table: orders
    agg_table: per_customer
    group_by: {{customer: {{}}}}
    aggregate: {{n: {{fn: count}}}}
""")
    env = {**_cli_env(pg_environ, tmp_path), "STREAMLING__SHUTDOWN_BUDGET_SECS": str(budget)}
    with psycopg.connect(pg_dsn) as locker:
        def stuck(_seen: list[str], _wait: Wait) -> None:
            # The next epoch's write now waits for this lock, past any reasonable budget.
            locker.execute(f'LOCK TABLE "{unique_name}".orders IN ACCESS EXCLUSIVE MODE')
            time.sleep(2)

        try:
            code, elapsed, seen, rest = _sigterm_after_fault([sys.executable, "-m", "streamling.cli", str(pipeline)],
                                                             tmp_path, env, stuck, budget + 60)
        finally:
            locker.rollback()
    output = "".join(seen + rest)
    print(f"SIGTERM to exit with a stuck epoch: {elapsed:.1f}s, exit code {code}")
    assert code == 3, output[-3000:]
    assert budget - 1 < elapsed < budget + MARGIN_SECS, f"{elapsed:.1f}s\n{output[-3000:]}"
    [verdict] = [line for line in rest if "did not end within shutdown_budget_secs" in line]
    assert " ERROR " in verdict and "exiting with code 3; the epoch in flight was not committed" in verdict
