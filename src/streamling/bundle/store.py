"""Runs, task attempts, requests and notifications of a deployed bundle, in one SQLite file.

The CLI and the job runner are separate processes: the CLI only *asks* (a row in ``requests``)
and reads; the runner is the one writer of run state. SQLite in WAL mode with a busy timeout
makes that safe and durable, and a run's history outlives both processes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_key TEXT NOT NULL,
  deployment INTEGER NOT NULL,
  state TEXT NOT NULL,             -- pending | running | succeeded | failed | cancelled
  trigger TEXT NOT NULL,           -- manual | schedule | periodic | continuous
  params TEXT NOT NULL DEFAULT '{}',
  created_at REAL NOT NULL,
  started_at REAL,
  ended_at REAL,
  message TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_job ON runs (job_key, state);
CREATE TABLE IF NOT EXISTS tasks (
  run_id INTEGER NOT NULL,
  task_key TEXT NOT NULL,
  state TEXT NOT NULL,             -- pending | running | waiting_retry | succeeded | failed | cancelled | skipped
  attempts INTEGER NOT NULL DEFAULT 0,
  retry_at REAL,
  started_at REAL,
  ended_at REAL,
  message TEXT,
  PRIMARY KEY (run_id, task_key)
);
CREATE TABLE IF NOT EXISTS attempts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id INTEGER NOT NULL,
  task_key TEXT NOT NULL,
  number INTEGER NOT NULL,
  deployment INTEGER NOT NULL,
  pid INTEGER,
  state TEXT NOT NULL,             -- running | succeeded | failed | cancelled | timed_out | redeployed
  started_at REAL NOT NULL,
  ended_at REAL,
  exit_code INTEGER,
  log_path TEXT NOT NULL,
  reason TEXT
);
CREATE TABLE IF NOT EXISTS requests (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  kind TEXT NOT NULL,              -- run | cancel | cancel_job | shutdown
  job_key TEXT,
  run_id INTEGER,
  params TEXT NOT NULL DEFAULT '{}',
  created_at REAL NOT NULL,
  handled_at REAL,
  result TEXT
);
CREATE TABLE IF NOT EXISTS job_state (
  job_key TEXT PRIMARY KEY,
  last_fire REAL,
  failures INTEGER NOT NULL DEFAULT 0,
  not_before REAL
);
CREATE TABLE IF NOT EXISTS notifications (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id INTEGER NOT NULL,
  event TEXT NOT NULL,             -- on_start | on_success | on_failure
  channel TEXT NOT NULL,           -- webhook | email
  target TEXT NOT NULL,
  status TEXT NOT NULL,            -- sent | failed | recorded
  detail TEXT,
  created_at REAL NOT NULL
);
"""

ACTIVE_RUN_STATES = ("pending", "running")
FINAL_RUN_STATES = ("succeeded", "failed", "cancelled")


@dataclass
class Run:
    id: int
    job_key: str
    deployment: int
    state: str
    trigger: str
    params: dict[str, str]
    created_at: float
    started_at: float | None
    ended_at: float | None
    message: str | None

    @classmethod
    def of(cls, row: sqlite3.Row) -> Run:
        return cls(row["id"], row["job_key"], row["deployment"], row["state"], row["trigger"],
                   json.loads(row["params"]), row["created_at"], row["started_at"], row["ended_at"], row["message"])

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_RUN_STATES


class Store:
    """A thin typed layer over the SQLite file; each call is one short transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._conn.executescript(SCHEMA)
        self._lock = threading.RLock()  # one connection, used by the runner's notification threads too

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._conn.execute(sql, args))

    # --- requests (CLI → runner) ----------------------------------------------------------------

    def request(self, kind: str, job_key: str | None = None, run_id: int | None = None,
                params: dict[str, str] | None = None) -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO requests (kind, job_key, run_id, params, created_at) VALUES (?,?,?,?,?)",
                            (kind, job_key, run_id, json.dumps(params or {}), time.time()))
            return int(cur.lastrowid or 0)

    def pending_requests(self) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM requests WHERE handled_at IS NULL ORDER BY id")

    def handled(self, request_id: int, result: dict[str, Any]) -> None:
        with self.tx() as c:
            c.execute("UPDATE requests SET handled_at=?, result=? WHERE id=?",
                      (time.time(), json.dumps(result), request_id))

    def request_result(self, request_id: int) -> dict[str, Any] | None:
        rows = self.query("SELECT handled_at, result FROM requests WHERE id=?", (request_id,))
        if not rows or rows[0]["handled_at"] is None:
            return None
        return dict(json.loads(rows[0]["result"] or "{}"))

    # --- runs -----------------------------------------------------------------------------------

    def create_run(self, job_key: str, deployment: int, trigger: str, params: dict[str, str],
                   task_keys: list[str]) -> int:
        now = time.time()
        with self.tx() as c:
            cur = c.execute("INSERT INTO runs (job_key, deployment, state, trigger, params, created_at) "
                            "VALUES (?,?,?,?,?,?)", (job_key, deployment, "pending", trigger, json.dumps(params), now))
            run_id = int(cur.lastrowid or 0)
            c.executemany("INSERT INTO tasks (run_id, task_key, state) VALUES (?,?,'pending')",
                          [(run_id, key) for key in task_keys])
        return run_id

    def run(self, run_id: int) -> Run | None:
        rows = self.query("SELECT * FROM runs WHERE id=?", (run_id,))
        return Run.of(rows[0]) if rows else None

    def runs(self, job_key: str | None = None, active_only: bool = False, limit: int = 50) -> list[Run]:
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if job_key:
            sql += " AND job_key=?"
            args.append(job_key)
        if active_only:
            sql += " AND state IN ('pending','running')"
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(str(limit))
        return [Run.of(r) for r in self.query(sql, tuple(args))]

    def set_run(self, run_id: int, **fields: Any) -> None:
        if not fields:
            return
        names = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            c.execute(f"UPDATE runs SET {names} WHERE id=?", (*fields.values(), run_id))

    def tasks(self, run_id: int) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM tasks WHERE run_id=? ORDER BY rowid", (run_id,))

    def set_task(self, run_id: int, task_key: str, **fields: Any) -> None:
        names = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            c.execute(f"UPDATE tasks SET {names} WHERE run_id=? AND task_key=?", (*fields.values(), run_id, task_key))

    # --- attempts -------------------------------------------------------------------------------

    def start_attempt(self, run_id: int, task_key: str, number: int, deployment: int, log_path: str) -> int:
        with self.tx() as c:
            cur = c.execute("INSERT INTO attempts (run_id, task_key, number, deployment, state, started_at, log_path) "
                            "VALUES (?,?,?,?,'running',?,?)", (run_id, task_key, number, deployment, time.time(),
                                                               log_path))
            return int(cur.lastrowid or 0)

    def set_attempt(self, attempt_id: int, **fields: Any) -> None:
        names = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            c.execute(f"UPDATE attempts SET {names} WHERE id=?", (*fields.values(), attempt_id))

    def attempts(self, run_id: int) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM attempts WHERE run_id=? ORDER BY id", (run_id,))

    def running_attempts(self) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM attempts WHERE state='running' ORDER BY id")

    # --- scheduling state -----------------------------------------------------------------------

    def job_state(self, job_key: str) -> sqlite3.Row | None:
        rows = self.query("SELECT * FROM job_state WHERE job_key=?", (job_key,))
        return rows[0] if rows else None

    def set_job_state(self, job_key: str, **fields: Any) -> None:
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO job_state (job_key) VALUES (?)", (job_key,))
            names = ", ".join(f"{k}=?" for k in fields)
            c.execute(f"UPDATE job_state SET {names} WHERE job_key=?", (*fields.values(), job_key))

    # --- notifications --------------------------------------------------------------------------

    def notification(self, run_id: int, event: str, channel: str, target: str, status: str, detail: str) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO notifications (run_id, event, channel, target, status, detail, created_at) "
                      "VALUES (?,?,?,?,?,?,?)", (run_id, event, channel, target, status, detail, time.time()))

    def notifications(self, run_id: int | None = None) -> list[sqlite3.Row]:
        if run_id is None:
            return self.query("SELECT * FROM notifications ORDER BY id")
        return self.query("SELECT * FROM notifications WHERE run_id=? ORDER BY id", (run_id,))
