"""The run tables of a deployed bundle, and the two stores that hold them (see ``streamling.bundle.store``
for what is asked of them).

``SqliteStore`` is a file under the bundle root (WAL mode, busy timeout): one host, the default.
``PostgresStore`` is a schema in a Postgres database (``job_runner.store: postgres``), which runners
on several hosts reach. Each creates the tables when it opens (``SCHEMA``, typed for its database)
and adds the columns a later release added (``ADDED_COLUMNS``) to a store an older one made.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamling.bundle.store import Row, Store, StoreUnavailable, Tx

if TYPE_CHECKING:
    from streamling.config.sections import JobRunnerSettings

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
ADDED_COLUMNS = {"tasks": {"ordinal": "INTEGER NOT NULL DEFAULT 0",
                           "iterations": "TEXT"},  # a for-each task's inputs (JSON), once resolved
                 "attempts": {"host": "TEXT", "heartbeat_at": "{real}", "fenced_at": "{real}", "fenced_by": "TEXT"},
                 # a run started by another run's run_job_task: that run and task
                 "runs": {"parent_run": "INTEGER", "parent_task": "TEXT"}}


def _statements(id_type: str, real_type: str) -> list[str]:
    """``SCHEMA``'s statements, with the database's types for ids and times."""
    text = re.sub(r"--[^\n]*", "", SCHEMA.format(id=id_type, real=real_type))
    return [stmt.strip() for stmt in text.split(";") if stmt.strip()]


class SqliteStore(Store):
    """The run store of one host: ``runs.db`` under the bundle root."""

    _ID = "INTEGER PRIMARY KEY AUTOINCREMENT"
    _REAL = "REAL"

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
            for stmt in _statements(self._ID, self._REAL):
                c.execute(stmt)
            for table, columns in ADDED_COLUMNS.items():
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
            for stmt in _statements(self._ID, self._REAL):
                c.execute(stmt.encode())
            for table, columns in ADDED_COLUMNS.items():
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
