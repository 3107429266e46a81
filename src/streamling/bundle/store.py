"""Runs, task attempts, requests, notifications and the runner's lease of a deployed bundle.

The CLI and the job runner are separate processes: the CLI only *asks* (a row in ``requests``)
and reads; the runner is the one writer of run state. Two stores hold the same tables:

- ``SqliteStore``, a file under the bundle root (WAL mode, busy timeout): one host, the default.
- ``PostgresStore``, a schema in a Postgres database (``job_runner.store: postgres``): the store
  runners on several hosts reach. The runner that holds the **lease** supervises; another one
  takes it when it expires. Drivers heartbeat their attempt here and stop when it is **fenced**,
  so a checkpoint has one writer even when a runner's host is cut off rather than dead.

Lease and heartbeat times are the database's clock, never a host's: hosts need not agree.
SQL is written once, with ``?`` placeholders and ``{now}`` for the database clock; each store
translates it. The tables themselves, and the two stores that hold them, are
``streamling.bundle.store_backends``.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from streamling.errors import StreamlingError

log = logging.getLogger(__name__)

Row = Mapping[str, Any]

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
    parent_run: int | None = None  #: the run whose run-job or for-each task started this one

    @classmethod
    def of(cls, row: Row) -> Run:
        return cls(row["id"], row["job_key"], row["deployment"], row["state"], row["trigger"],
                   json.loads(row["params"]), row["created_at"], row["started_at"], row["ended_at"], row["message"],
                   row["parent_run"])

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_RUN_STATES


@dataclass
class Lease:
    """Who supervises the root's jobs, until when (database clock), and how often it changed hands."""

    holder: str
    host: str
    pid: int
    generation: int
    expires_at: float
    now: float

    @property
    def held(self) -> bool:
        return bool(self.holder) and self.expires_at > self.now


class Tx(Protocol):
    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]: ...


class StoreUnavailable(StreamlingError):
    """The run store did not answer; a runner tries again on its next tick."""


class Store(ABC):
    """Typed calls over the run tables; each is one short transaction. See the module docstring."""

    #: several hosts reach it: the runner holds a lease, drivers heartbeat and obey fences
    shared: ClassVar[bool] = False
    describe: str
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"

    @abstractmethod
    def close(self) -> None:
        """Release the connection(s)."""

    @abstractmethod
    def destroy(self) -> None:
        """Delete every run of the root (``bundle destroy``)."""

    @abstractmethod
    def tx(self) -> AbstractContextManager[Tx]:
        """One transaction: every ``execute`` in it commits together, or none does."""

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        with self.tx() as c:
            return c.execute(sql, args)

    # --- requests (CLI → runner) ----------------------------------------------------------------

    def request(self, kind: str, job_key: str | None = None, run_id: int | None = None,
                params: dict[str, str] | None = None) -> int:
        with self.tx() as c:
            rows = c.execute("INSERT INTO requests (kind, job_key, run_id, params, created_at) VALUES (?,?,?,?,?) "
                             "RETURNING id", (kind, job_key, run_id, json.dumps(params or {}), time.time()))
            return int(rows[0]["id"])

    def pending_requests(self) -> list[Row]:
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
                   task_keys: list[str], parent: tuple[int, str] | None = None) -> int:
        """A pending run; ``parent``: the run and task whose run_job_task starts it."""
        now = time.time()
        with self.tx() as c:
            rows = c.execute("INSERT INTO runs (job_key, deployment, state, trigger, params, created_at, parent_run, "
                             "parent_task) VALUES (?,?,?,?,?,?,?,?) RETURNING id",
                             (job_key, deployment, "pending", trigger, json.dumps(params), now,
                              parent[0] if parent else None, parent[1] if parent else None))
            run_id = int(rows[0]["id"])
            for ordinal, key in enumerate(task_keys):
                c.execute("INSERT INTO tasks (run_id, task_key, state, ordinal) VALUES (?,?,'pending',?)",
                          (run_id, key, ordinal))
        return run_id

    def child_runs(self, run_id: int, task_key: str | None = None) -> list[dict[str, Any]]:
        """Runs started by run ``run_id``'s run_job tasks (by ``task_key``), newest first."""
        sql, args = "SELECT id, job_key, state, message, parent_task FROM runs WHERE parent_run=?", list[Any]([run_id])
        if task_key is not None:
            sql += " AND parent_task=?"
            args.append(task_key)
        return [dict(r) for r in self.query(sql + " ORDER BY id DESC", tuple(args))]

    def run(self, run_id: int) -> Run | None:
        rows = self.query("SELECT * FROM runs WHERE id=?", (run_id,))
        return Run.of(rows[0]) if rows else None

    def runs(self, job_key: str | None = None, active_only: bool = False, limit: int = 50) -> list[Run]:
        sql, args = "SELECT * FROM runs WHERE 1=1", list[Any]()
        if job_key:
            sql += " AND job_key=?"
            args.append(job_key)
        if active_only:
            sql += " AND state IN ('pending','running')"
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(int(limit))
        return [Run.of(r) for r in self.query(sql, tuple(args))]

    def set_run(self, run_id: int, **fields: Any) -> None:
        if not fields:
            return
        names = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            c.execute(f"UPDATE runs SET {names} WHERE id=?", (*fields.values(), run_id))

    def tasks(self, run_id: int) -> list[Row]:
        return self.query("SELECT * FROM tasks WHERE run_id=? ORDER BY ordinal, task_key", (run_id,))

    def set_task(self, run_id: int, task_key: str, **fields: Any) -> None:
        names = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            c.execute(f"UPDATE tasks SET {names} WHERE run_id=? AND task_key=?", (*fields.values(), run_id, task_key))

    # --- attempts -------------------------------------------------------------------------------

    def start_attempt(self, run_id: int, task_key: str, number: int, deployment: int, log_path: str,
                      host: str | None = None) -> int:
        with self.tx() as c:
            rows = c.execute("INSERT INTO attempts (run_id, task_key, number, deployment, state, started_at, log_path, "
                             f"host, heartbeat_at) VALUES (?,?,?,?,'running',?,?,?,{self.NOW}) RETURNING id",
                             (run_id, task_key, number, deployment, time.time(), log_path, host))
            return int(rows[0]["id"])

    def set_attempt(self, attempt_id: int, **fields: Any) -> None:
        names = ", ".join(f"{k}=?" for k in fields)
        with self.tx() as c:
            c.execute(f"UPDATE attempts SET {names} WHERE id=?", (*fields.values(), attempt_id))

    def attempts(self, run_id: int) -> list[Row]:
        return self.query("SELECT * FROM attempts WHERE run_id=? ORDER BY id", (run_id,))

    def task_ran(self, job_key: str, task_key: str) -> bool:
        """Whether any attempt of the task was ever started (under any deployment)."""
        return bool(self.query("SELECT 1 AS ran FROM attempts a JOIN runs r ON r.id = a.run_id "
                               "WHERE r.job_key=? AND a.task_key=? LIMIT 1", (job_key, task_key)))

    def running_attempts(self) -> list[Row]:
        return self.query("SELECT * FROM attempts WHERE state='running' ORDER BY id")

    def heartbeat(self, attempt_id: int) -> Row | None:
        """A driver's sign of life; returns its attempt's ``fenced_at``/``fenced_by`` (None: no such attempt)."""
        with self.tx() as c:
            rows = c.execute(f"UPDATE attempts SET heartbeat_at={self.NOW} WHERE id=? RETURNING fenced_at, fenced_by",
                             (attempt_id,))
        return rows[0] if rows else None

    def fence(self, attempt_id: int, by: str) -> None:
        """Tell a driver its runner is gone and another took over: it must stop without committing more."""
        with self.tx() as c:
            c.execute(f"UPDATE attempts SET fenced_at={self.NOW}, fenced_by=? WHERE id=? AND fenced_at IS NULL",
                      (by, attempt_id))

    def heartbeat_age(self, attempt_id: int) -> float | None:
        """Seconds since the attempt's driver last heartbeat (database clock); None before its first."""
        rows = self.query(f"SELECT {self.NOW} - heartbeat_at AS age FROM attempts WHERE id=?", (attempt_id,))
        return float(rows[0]["age"]) if rows and rows[0]["age"] is not None else None

    # --- the runner's lease ---------------------------------------------------------------------

    def lease(self) -> Lease:
        rows = self.query(f"SELECT holder, host, pid, generation, expires_at, {self.NOW} AS now FROM runner_lease "
                          "WHERE id=1")
        if not rows:
            return Lease("", "", 0, 0, 0.0, time.time())
        r = rows[0]
        return Lease(r["holder"], r["host"], int(r["pid"]), int(r["generation"]), float(r["expires_at"]),
                     float(r["now"]))

    def acquire_lease(self, holder: str, host: str, pid: int, secs: float) -> int | None:
        """Take or renew the lease for ``secs``: its generation when ``holder`` has it now, else None.

        A renewal keeps the generation; a takeover (the lease was free or expired) increments it."""
        with self.tx() as c:
            c.execute("INSERT INTO runner_lease (id, holder, host, pid, generation, expires_at) "
                      "VALUES (1, '', '', 0, 0, 0) ON CONFLICT (id) DO NOTHING")
            rows = c.execute(
                f"UPDATE runner_lease SET generation = CASE WHEN holder=? THEN generation ELSE generation + 1 END, "
                f"holder=?, host=?, pid=?, expires_at={self.NOW} + ? "
                f"WHERE id=1 AND (holder=? OR holder='' OR expires_at < {self.NOW}) RETURNING generation",
                (holder, holder, host, pid, float(secs), holder))
        return int(rows[0]["generation"]) if rows else None

    def release_lease(self, holder: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE runner_lease SET holder='', expires_at=0 WHERE id=1 AND holder=?", (holder,))

    # --- scheduling state -----------------------------------------------------------------------

    def job_state(self, job_key: str) -> Row | None:
        rows = self.query("SELECT * FROM job_state WHERE job_key=?", (job_key,))
        return rows[0] if rows else None

    def set_job_state(self, job_key: str, **fields: Any) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO job_state (job_key) VALUES (?) ON CONFLICT (job_key) DO NOTHING", (job_key,))
            names = ", ".join(f"{k}=?" for k in fields)
            c.execute(f"UPDATE job_state SET {names} WHERE job_key=?", (*fields.values(), job_key))

    # --- notifications --------------------------------------------------------------------------

    def notification(self, run_id: int, event: str, channel: str, target: str, status: str, detail: str) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO notifications (run_id, event, channel, target, status, detail, created_at) "
                      "VALUES (?,?,?,?,?,?,?)", (run_id, event, channel, target, status, detail, time.time()))

    def set_task_values(self, run_id: int, task_key: str, values: dict[str, Any]) -> None:
        """What a succeeded attempt set (``dbutils.jobs.taskValues``); replaces an earlier attempt's."""
        with self.tx() as c:
            c.execute("DELETE FROM task_values WHERE run_id=? AND task_key=?", (run_id, task_key))
            for name, value in values.items():
                c.execute("INSERT INTO task_values (run_id, task_key, name, value) VALUES (?,?,?,?)",
                          (run_id, task_key, name, json.dumps(value)))

    def task_values(self, run_id: int) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for row in self.query("SELECT task_key, name, value FROM task_values WHERE run_id=? ORDER BY task_key, name",
                              (run_id,)):
            out.setdefault(row["task_key"], {})[row["name"]] = json.loads(row["value"])
        return out

    def notifications(self, run_id: int | None = None) -> list[Row]:
        if run_id is None:
            return self.query("SELECT * FROM notifications ORDER BY id")
        return self.query("SELECT * FROM notifications WHERE run_id=? ORDER BY id", (run_id,))
