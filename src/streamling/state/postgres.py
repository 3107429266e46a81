"""``Postgres`` state: a table shared by every process of an application (clusters, restarts on
another machine). Values are JSONB so operators can inspect positions with plain SQL.

Connections come from a ``streamling.postgres`` pool; failures are classified (transient or not)
and raised, never retried here: the flow retries with its one policy."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from streamling.errors import StreamlingError
from streamling.postgres import PoolSettings, PostgresPool, first_line, is_transient, mask, sqlstate_prefix
from streamling.state.base import SqlStateBackend

if TYPE_CHECKING:
    import psycopg

    from streamling.config.sections import PostgresStateSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


class PostgresStateBackend(SqlStateBackend):
    """Keys in ``<state_schema_name>.<state_table_name>``, created on first use."""

    durable = True

    def __init__(self, settings: PostgresStateSettings, namespace: str, pool: PoolSettings | None = None) -> None:
        from psycopg import sql

        self.namespace = namespace
        self.settings = settings
        self.target = f"{settings.host}:{settings.port}/{settings.db}"
        self._ready = False
        self._ready_lock = threading.Lock()
        pool = pool or PoolSettings()
        self._pool = PostgresPool(
            _conninfo(settings), target=self.target, describe="state backend", application_name="streamling:state",
            settings=PoolSettings(acquire_timeout_secs=pool.acquire_timeout_secs,
                                  idle_timeout_secs=pool.idle_timeout_secs, max_lifetime_secs=pool.max_lifetime_secs,
                                  statement_timeout_secs=pool.statement_timeout_secs,
                                  max_size=max(1, settings.max_connections)),
            autocommit=True)
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
        self._clear = sql.SQL("DELETE FROM {} WHERE namespace = %s").format(table)
        self._list = sql.SQL("SELECT key, data FROM {} WHERE namespace = %s AND left(key, %s) = %s "
                             "ORDER BY key").format(table)
        try:
            self._run("creating the state table", lambda conn: None)
        except BaseException:
            self._pool.close()
            raise

    # -- the contract ------------------------------------------------------------------------------

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._run(f"reading {key!r}", lambda c: c.execute(self._get, (self.namespace, key)).fetchone())
        return None if row is None else dict(row[0])

    def upsert_rows(self, rows: list[tuple[str, str, str]]) -> None:
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

    def clear(self) -> None:
        self._run("clearing the namespace", lambda c: c.execute(self._clear, (self.namespace,)))

    def close(self) -> None:
        self._pool.close()

    # -- connection and errors -----------------------------------------------------------------------

    def _run(self, what: str, action: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``action`` on a pooled connection (the table is created on first use); failures are
        raised as ``StreamlingError`` with ``retriable`` set by ``is_transient``."""
        import psycopg

        try:
            with self._pool.connection() as conn:
                if not self._ready:
                    with self._ready_lock:
                        for statement in self._create:
                            conn.execute(statement)
                        self._ready = True
                return action(conn)
        except psycopg.Error as exc:
            detail = mask(first_line(exc), [self.settings.password])
            if is_transient(exc):
                raise StreamlingError(
                    f"state backend at {self.target} failed while {what}: {sqlstate_prefix(exc)}{detail}",
                    retriable=True, code="state_backend_unavailable",
                    hint="check that Postgres is running and reachable (state_backend.postgres host, port, db, "
                         "sslmode)") from exc
            raise StreamlingError(
                f"state backend at {self.target} rejected {what}: {sqlstate_prefix(exc)}{detail}",
                code="state_backend_error",
                hint="check state_backend.postgres (user, password, db, sslmode) and the table's permissions") from exc


def _conninfo(s: PostgresStateSettings) -> str:
    """libpq keywords for the state database (the password never lands in a log line)."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(host=s.host, port=s.port, dbname=s.db, user=s.user, password=s.password or None,
                         sslmode=s.sslmode)
