"""``Postgres`` state: a table shared by every process of an application (clusters, restarts on
another machine). Values are JSONB so operators can inspect positions with plain SQL."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from streamling.errors import StreamlingError
from streamling.state.base import encode

if TYPE_CHECKING:
    import psycopg

    from streamling.config.settings import PostgresStateSettings, RetrySettings

log = logging.getLogger(__name__)
T = TypeVar("T")


class PostgresStateBackend:
    """Keys in ``<state_schema_name>.<state_table_name>``, created on first use."""

    def __init__(self, settings: PostgresStateSettings, namespace: str,
                 retry: RetrySettings | None = None) -> None:
        from psycopg import sql

        self.namespace = namespace
        self.settings = settings
        self.target = f"{settings.host}:{settings.port}/{settings.db}"
        self._max_attempts = retry.max_attempts if retry else 3
        self._backoff_ms = float(retry.initial_backoff_ms if retry else 200)
        self._max_backoff_ms = float(retry.max_backoff_ms if retry else 2000)
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        table = sql.Identifier(settings.state_schema_name, settings.state_table_name)
        self._create = [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(settings.state_schema_name)),
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (namespace TEXT NOT NULL, key TEXT NOT NULL, "
                    "data JSONB NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
                    "PRIMARY KEY (namespace, key))").format(table),
        ]
        self._get = sql.SQL("SELECT data FROM {} WHERE namespace = %s AND key = %s").format(table)
        self._upsert = sql.SQL("INSERT INTO {} (namespace, key, data) VALUES (%s, %s, %s::jsonb) "
                               "ON CONFLICT (namespace, key) DO UPDATE SET data = EXCLUDED.data").format(table)
        self._delete = sql.SQL("DELETE FROM {} WHERE namespace = %s AND key = %s").format(table)
        self._list = sql.SQL("SELECT key, data FROM {} WHERE namespace = %s AND left(key, %s) = %s "
                             "ORDER BY key").format(table)
        self._run("creating the state table", lambda conn: None)

    # -- the contract ------------------------------------------------------------------------------

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._run(f"reading {key!r}", lambda c: c.execute(self._get, (self.namespace, key)).fetchone())
        return None if row is None else dict(row[0])

    def put(self, key: str, data: dict[str, Any]) -> None:
        self.put_many({key: data})

    def put_many(self, items: Mapping[str, dict[str, Any]]) -> None:
        rows = [(self.namespace, key, encode(key, data)) for key, data in items.items()]
        if not rows:
            return

        def write(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(self._upsert, rows)

        self._run(f"writing {len(rows)} key(s)", write)

    def delete(self, key: str) -> None:
        self._run(f"deleting {key!r}", lambda c: c.execute(self._delete, (self.namespace, key)))

    def list(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        found = self._run(f"listing {prefix!r}",
                          lambda c: c.execute(self._list, (self.namespace, len(prefix), prefix)).fetchall())
        return {key: dict(data) for key, data in found}

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- connection and retries ----------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        import psycopg

        s = self.settings
        conn = psycopg.connect(host=s.host, port=s.port, dbname=s.db, user=s.user, password=s.password or None,
                               sslmode=s.sslmode, connect_timeout=10, autocommit=True,
                               application_name="streamling:state")
        for statement in self._create:
            conn.execute(statement)
        self._conn = conn
        return conn

    def _run(self, what: str, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``action``; a dropped connection or refused connect is retried with backoff."""
        import psycopg

        delay = self._backoff_ms
        for attempt in range(1, self._max_attempts + 1):
            with self._lock:
                try:
                    return action(self._connect())
                except psycopg.OperationalError as exc:
                    retriable = _retriable(exc)
                    if self._conn is not None and self._conn.closed:
                        self._conn = None
                    if not retriable or attempt == self._max_attempts:
                        raise StreamlingError(
                            f"state backend at {self.target} failed while {what}: {_first_line(exc)}",
                            retriable=retriable, code="state_backend_unavailable",
                            hint="check state_backend.postgres (host, port, db, user, sslmode) and that "
                                 "Postgres is running") from exc
                except psycopg.Error as exc:
                    raise StreamlingError(
                        f"state backend at {self.target} rejected {what}: "
                        f"{'SQLSTATE ' + exc.sqlstate + ': ' if exc.sqlstate else ''}{_first_line(exc)}",
                        code="state_backend_error") from exc
            sleep = min(delay, self._max_backoff_ms) / 1000
            log.warning("state backend at %s: %s failed (attempt %d/%d); retrying in %.2fs", self.target, what,
                        attempt, self._max_attempts, sleep)
            time.sleep(sleep)
            delay *= 2
        raise AssertionError("unreachable")


def _retriable(exc: BaseException) -> bool:
    text = str(exc).lower()
    return not any(marker in text for marker in ("authentication failed", "does not exist", "pg_hba.conf",
                                                 "does not support ssl", "certificate", "permission denied"))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
