"""Torture: 1.2M CDC events through the CLI into a private Postgres, with random SIGKILLs of the
driver and a Postgres restart mid-run, rerun until the run completes. The table must then equal
the state the events imply, with no event lost or applied twice.

Two sinks share the flow, so both must come out exact from every crash point:

- ``accounts`` upserts/deletes by ``id``: its final rows are checked against the last event of
  every key (every 5th key ends deleted);
- ``audit`` appends ``(id, version)`` of every non-delete event without a key, so an epoch written
  twice or skipped shows up as a duplicated or missing row (the key would hide it in ``accounts``).

Each kill lands at a random moment after the attempt wrote something (so every attempt makes
progress); the JVM the killed driver started must exit by itself (no orphan). The seed is printed
so a failing schedule can be replayed with ``STREAMLING_TORTURE_SEED``.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pyarrow.compute as pc
import pytest
from test_outage import Cluster, cluster  # noqa: F401 - the private cluster, stopped and started in place
from test_stop_during_outage import own_postgres  # noqa: F401 - used by the cluster fixture

from streamling.sources.generate import generate_batch

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]
EVENTS, PER_EPOCH, SEED = 1_200_000, 60_000, 7  # 400k keys: 1 insert + 2 updates, or an update and a delete
KILLS = 5
MAX_ATTEMPTS = 15
ATTEMPT_SECS = 240
ORPHAN_SECS = 30


def _pipeline(path: Path) -> None:
    path.write_text(f"""
sources:
  changes: {{type: generate, profile: cdc, rows: {EVENTS}, rows_per_batch: {PER_EPOCH}, seed: {SEED}}}
transforms:
  audit: {{type: sql, sql: "SELECT id, version FROM changes"}}
sinks:
  accounts: {{type: postgres, from: changes, primary_key: id, schema: torture, table: accounts}}
  audit_log: {{type: postgres, from: audit, schema: torture, table: audit}}
""")


def _env(exports: dict[str, str], tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    env.update({k: v for k, v in exports.items() if k.startswith("STREAMLING__POSTGRES_SINK__")})
    env.update(STREAMLING_CACHE_DIR=str(ROOT / ".cache"), STREAMLING__APPLICATION_ID="torture",
               STREAMLING__STATE_DIR=str(tmp_path / "state"),
               # each rerun resumes the last one's checkpoint, as with any state backend that keeps positions
               STREAMLING__STATE_BACKEND__BACKEND_TYPE="Sqlite",
               STREAMLING__STATE_BACKEND__SQLITE__DATABASE_PATH=str(tmp_path / "state" / "state.db"),
               # A restart takes ~1 s; the policy's attempts must outlast it, never end the run.
               STREAMLING__RETRY__MAX_ATTEMPTS="30", STREAMLING__RETRY__INITIAL_BACKOFF_MS="200",
               STREAMLING__RETRY__MAX_BACKOFF_MS="1000")
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (the JVM PySpark launched, through spark-submit)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
        children = [int(p) for p in found]
        out += children
        todo += children
    return out


def _is_java(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


class Attempt:
    """One CLI run with its stderr on a queue, so every wait has a deadline."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, done: Callable[[list[str]], bool], secs: float) -> bool:
        """True once ``done(lines)``; False if the process ended first."""
        deadline = time.monotonic() + secs
        while not done(self.lines):
            assert time.monotonic() < deadline, "timed out; last lines:\n" + "".join(self.lines[-30:])
            try:
                line = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                return False
            self.lines.append(line)
        return True

    def finish(self, secs: float) -> int:
        self.wait_for(lambda _lines: False, secs)
        return self.proc.wait(timeout=30)


def _flushed(lines: list[str]) -> int:
    return sum(" flushed {" in line for line in lines)


def _expected() -> tuple[list[tuple[int, int, str, float]], np.ndarray]:
    """The final ``accounts`` rows and the sorted ``id * 4 + version`` of every audited event."""
    events = generate_batch("cdc", 0, EVENTS, SEED, 0)
    last = events.filter(pc.equal(events.column("version"), 3))
    alive = last.filter(pc.not_equal(last.column("_gs_op"), "d"))
    rows = list(zip(*(alive.column(c).to_pylist() for c in ("id", "version", "customer", "amount")), strict=True))
    kept = events.filter(pc.not_equal(events.column("_gs_op"), "d"))
    audit = kept.column("id").to_numpy() * 4 + kept.column("version").to_numpy().astype(np.int64)
    return rows, np.sort(audit)


def test_sigkills_and_a_postgres_restart_lose_nothing_and_write_nothing_twice(
        tmp_path: Path, cluster: Cluster) -> None:  # noqa: F811
    seed = int(os.environ.get("STREAMLING_TORTURE_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    restart_in = rng.randrange(KILLS)  # the run that lives through a Postgres restart (then is killed)
    print(f"torture seed {seed}: {EVENTS:,} events, {KILLS} kills, Postgres restart in attempt {restart_in}")
    pipeline = tmp_path / "pipeline.yaml"
    _pipeline(pipeline)
    cmd, env = [sys.executable, "-m", "streamling.cli", str(pipeline)], _env(cluster.exports, tmp_path)
    started = time.monotonic()
    kills, restarts, jvms, orphans, codes = 0, 0, 0, [], []
    for number in range(MAX_ATTEMPTS):
        attempt = Attempt(cmd, tmp_path, env)
        try:
            if kills < KILLS and attempt.wait_for(lambda lines: _flushed(lines) >= 1, ATTEMPT_SECS):
                if number == restart_in:  # this run must write on after Postgres came back
                    cluster.stop()
                    time.sleep(rng.uniform(0.5, 2.0))
                    cluster.start()
                    restarts += 1
                    before = _flushed(attempt.lines)
                    attempt.wait_for(lambda lines, n=before: _flushed(lines) > n, ATTEMPT_SECS)
                time.sleep(rng.uniform(0.0, 1.5))
                if attempt.proc.poll() is None:
                    children = _descendants(attempt.proc.pid)  # the JVM and Python workers
                    attempt.proc.send_signal(signal.SIGKILL)
                    attempt.proc.wait(timeout=30)
                    kills += 1
                    jvms += sum(_is_java(pid) for pid in children)
                    deadline = time.monotonic() + ORPHAN_SECS
                    while _alive(children) and time.monotonic() < deadline:
                        time.sleep(0.2)
                    left = _alive(children)
                    orphans += left
                    for pid in left:  # do not let one failure slow down the rest of the suite
                        os.kill(pid, signal.SIGKILL)
                    codes.append(-9)
                    continue
            code = attempt.finish(ATTEMPT_SECS)
            codes.append(code)
            if code == 0 and kills >= KILLS:
                break
        finally:
            if attempt.proc.poll() is None:
                attempt.proc.kill()
                attempt.proc.wait(timeout=30)
    wall = time.monotonic() - started
    assert codes and codes[-1] == 0, f"exit codes {codes}; last lines:\n" + "".join(attempt.lines[-40:])

    want_rows, want_audit = _expected()
    with psycopg.connect(cluster.exports["STREAMLING_TEST_POSTGRES_DSN"]) as conn:
        got_rows = conn.execute("SELECT id, version, customer, amount FROM torture.accounts ORDER BY id").fetchall()
        audit = conn.execute("SELECT id * 4 + version FROM torture.audit").fetchall()
    got_audit = np.sort(np.fromiter((r[0] for r in audit), dtype=np.int64, count=len(audit)))
    values, counts = np.unique(got_audit, return_counts=True)
    duplicated = int((counts - 1).sum())
    lost = int(np.setdiff1d(want_audit, values, assume_unique=True).size)
    unexpected = int(np.setdiff1d(values, want_audit, assume_unique=True).size)
    print(f"torture: {EVENTS:,} events, {kills} SIGKILLs survived ({jvms} JVMs, {len(orphans)} orphaned), "
          f"{restarts} Postgres restart, {len(codes)} runs (exit codes {codes}), audit rows lost {lost}, "
          f"duplicated {duplicated}, unexpected {unexpected}; accounts {len(got_rows):,} rows "
          f"(expected {len(want_rows):,}); wall {wall:.0f}s")
    assert kills == KILLS and restarts == 1, codes
    assert not orphans, f"JVMs outlived their killed driver: {orphans}"
    assert (lost, duplicated, unexpected) == (0, 0, 0)
    assert len(got_audit) == len(want_audit)
    assert got_rows == want_rows
