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
translates it.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from streamling.errors import StreamlingError

if TYPE_CHECKING:
    from streamling.config.settings import JobRunnerSettings

log = logging.getLogger(__name__)

Row = Mapping[str, Any]

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id {id},
  job_key TEXT NOT NULL,
  deployment INTEGER NOT NULL,
  state TEXT NOT NULL,             -- pending | running | succeeded | failed | cancelled
  trigger TEXT NOT NULL,           -- manual | schedule | periodic | continuous
  params TEXT NOT NULL DEFAULT '{{}}',
  created_at {real} NOT NULL,
  started_at {real},
  ended_at {real},
  message TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_job ON runs (job_key, state);
CREATE TABLE IF NOT EXISTS tasks (
  run_id INTEGER NOT NULL,
  task_key TEXT NOT NULL,
  state TEXT NOT NULL,             -- pending | running | waiting_retry | succeeded | failed | cancelled | skipped
  attempts INTEGER NOT NULL DEFAULT 0,
  retry_at {real},
  started_at {real},
  ended_at {real},
  message TEXT,
  ordinal INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, task_key)
);
CREATE TABLE IF NOT EXISTS attempts (
  id {id},
  run_id INTEGER NOT NULL,
  task_key TEXT NOT NULL,
  number INTEGER NOT NULL,
  deployment INTEGER NOT NULL,
  pid INTEGER,
  state TEXT NOT NULL,             -- running | succeeded | failed | cancelled | timed_out | redeployed | fenced
  started_at {real} NOT NULL,
  ended_at {real},
  exit_code INTEGER,
  log_path TEXT NOT NULL,
  reason TEXT,
  host TEXT,                       -- where its driver runs (the runner's host)
  heartbeat_at {real},             -- the driver's last sign of life (database clock; shared stores only)
  fenced_at {real},                -- set by a runner that took over: the driver must stop at once
  fenced_by TEXT
);
CREATE TABLE IF NOT EXISTS requests (
  id {id},
  kind TEXT NOT NULL,              -- run | cancel | cancel_job | shutdown
  job_key TEXT,
  run_id INTEGER,
  params TEXT NOT NULL DEFAULT '{{}}',
  created_at {real} NOT NULL,
  handled_at {real},
  result TEXT
);
CREATE TABLE IF NOT EXISTS job_state (
  job_key TEXT PRIMARY KEY,
  last_fire {real},
  failures INTEGER NOT NULL DEFAULT 0,
  not_before {real}
);
CREATE TABLE IF NOT EXISTS notifications (
  id {id},
  run_id INTEGER NOT NULL,
  event TEXT NOT NULL,             -- on_start | on_success | on_failure
  channel TEXT NOT NULL,           -- webhook | email
  target TEXT NOT NULL,
  status TEXT NOT NULL,            -- sent | failed | recorded
  detail TEXT,
  created_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS task_values (
  run_id INTEGER NOT NULL,
  task_key TEXT NOT NULL,
  name TEXT NOT NULL,
  value TEXT NOT NULL,             -- JSON, as dbutils.jobs.taskValues.set got it
  PRIMARY KEY (run_id, task_key, name)
);
CREATE TABLE IF NOT EXISTS runner_lease (
  id INTEGER PRIMARY KEY,          -- one row: 1
  holder TEXT NOT NULL,            -- host:pid:start of the runner holding it ('' when free)
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  generation INTEGER NOT NULL,     -- grows by one each time the lease changes hands
  expires_at {real} NOT NULL
);
"""
#: columns added after a store's first release: an older runs.db gains them when opened
_ADDED_COLUMNS = {"tasks": {"ordinal": "INTEGER NOT NULL DEFAULT 0",
                            "iterations": "TEXT"},  # a for-each task's inputs (JSON), once resolved
                  "attempts": {"host": "TEXT", "heartbeat_at": "{real}", "fenced_at": "{real}", "fenced_by": "TEXT"},
                  # a run started by another run's run_job_task: that run and task
                  "runs": {"parent_run": "INTEGER", "parent_task": "TEXT"}}

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
    _ID = "INTEGER PRIMARY KEY AUTOINCREMENT"
    _REAL = "REAL"
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

    def _schema(self) -> list[str]:
        text = re.sub(r"--[^\n]*", "", SCHEMA.format(id=self._ID, real=self._REAL))
        return [stmt.strip() for stmt in text.split(";") if stmt.strip()]

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


class SqliteStore(Store):
    """The run store of one host: ``runs.db`` under the bundle root."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.describe = str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = _dict_row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._lock = threading.RLock()  # one connection, used by the runner's notification threads too
        with self.tx() as c:
            for stmt in self._schema():
                c.execute(stmt)
            for table, columns in _ADDED_COLUMNS.items():
                have = {r["name"] for r in c.execute(f"PRAGMA table_info({table})")}
                for name, kind in columns.items():
                    if name not in have:
                        c.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind.format(real=self._REAL)}")

    def close(self) -> None:
        self._conn.close()

    def destroy(self) -> None:
        """Nothing to do here: the file goes with the root folder."""

    @contextmanager
    def tx(self) -> Iterator[Tx]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        return list(self._conn.execute(sql, args))


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {col[0]: value for col, value in zip(cursor.description, row, strict=True)}


class PostgresStore(Store):
    """The run store runners on several hosts share: one schema per bundle root in a Postgres database."""

    shared = True
    _ID = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    _REAL = "DOUBLE PRECISION"
    NOW = "extract(epoch from clock_timestamp())::double precision"

    def __init__(self, settings: JobRunnerSettings, schema: str) -> None:
        from streamling.postgres import PoolSettings, PostgresPool

        conn = settings.postgres
        self.schema = schema
        self.describe = f"{conn.describe()} (schema {schema})"
        # Short bounds: the runner ticks twice a second and its lease lasts lease_secs; a store that
        # does not answer within a few seconds is an outage to ride out, not a statement to wait for.
        from psycopg import sql

        bound = max(1.0, settings.lease_secs / 4)
        search_path = sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))

        def configure(connection: Any) -> None:
            connection.execute(search_path)

        # Each pooled connection is set to the root's schema once, when it is made (not per transaction).
        self._pool = PostgresPool(conn.conninfo(), target=conn.describe(), describe="job runner store",
                                  application_name="streamling job runner",
                                  settings=PoolSettings(acquire_timeout_secs=bound, statement_timeout_secs=bound,
                                                        max_size=4),
                                  autocommit=True, configure=configure)
        with self._connection() as c, c.transaction():
            c.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (schema,))  # two first opens at once
            c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            for stmt in self._schema():
                c.execute(stmt.encode())
            for table, columns in _ADDED_COLUMNS.items():
                for name, kind in columns.items():
                    c.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {kind.format(real=self._REAL)}"
                              .encode())

    def close(self) -> None:
        self._pool.close()

    def destroy(self) -> None:
        from psycopg import sql

        with self._connection() as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.schema)))

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        import psycopg

        from streamling.postgres import first_line, is_transient, mask

        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise StoreUnavailable(f"the job runner's store {self.describe}: {mask(first_line(exc))}",
                                   code="bundle_store", retriable=is_transient(exc),
                                   hint="check job_runner.postgres.* of the target (and that the database is "
                                        "reachable from this host)") from exc

    @contextmanager
    def tx(self) -> Iterator[Tx]:
        with self._connection() as conn, conn.transaction():
            yield _PostgresTx(conn)

    @contextmanager
    def exclusive(self, name: str, wait: bool) -> Iterator[bool]:
        """Hold lock ``name`` of this store, for every host, while the block runs (a session advisory
        lock: it ends with the holder's connection, so a dead holder leaves no stale lock). Yields
        False at once when another holds it and ``wait`` is False."""
        key = f"{self.schema}:{name}"
        with self._connection() as conn:
            got = bool(conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0])
            while not got and wait:  # polled: the pool's statement timeout bounds a blocking wait
                time.sleep(0.5)
                got = bool(conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0])
            try:
                yield got
            finally:
                if got:
                    conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))


class _PostgresTx:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[Row]:
        from psycopg.rows import dict_row

        cur = self._conn.cursor(row_factory=dict_row)
        cur.execute(sql.replace("%", "%%").replace("?", "%s").encode(), args)
        return list(cur.fetchall()) if cur.description is not None else []


def open_store(root: Path, settings: JobRunnerSettings, schema: str) -> Store:
    """The root's run store: SQLite under ``root`` or Postgres, as the target's ``job_runner`` says."""
    if settings.store == "postgres":
        return PostgresStore(settings, schema)
    return SqliteStore(root / "runs.db")
