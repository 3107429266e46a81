"""A connection pool per Postgres user (sink, state backend, dynamic table) on ``psycopg_pool``.

Three rules shape it:

- **One attempt per acquisition.** The flow owns retries (``runtime.retry``); the pool must not
  keep reconnecting in the background, or an outage would cost the flow's attempts × the pool's.
  Each ``connection()`` call grants exactly one network connection attempt; a failed attempt is
  raised at once (classified by ``postgres.errors``), not after ``pool_acquire_timeout_secs``.
- **Bounded statements.** Every round trip on a connection is bounded client-side at
  2 × ``statement_timeout_secs`` (0: no bound), on top of the server's own statement timeout and
  TCP keepalives: a server or network that stops answering without closing the socket would
  otherwise hang the flow forever. A bound hit closes the connection (the pool replaces it) and
  raises ``StatementBoundExceeded``, a transient error.
- **Idle hygiene.** Connections idle longer than ``pool_idle_timeout_secs`` or older than
  ``pool_max_lifetime_secs`` are closed by the pool; a pooled connection that died while idle is
  noticed at checkout and replaced by a fresh one within the same acquisition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from streamling.postgres.errors import StatementBoundExceeded

if TYPE_CHECKING:
    from streamling.config.sections import PostgresSinkSettings

log = logging.getLogger(__name__)

_POLL_SECS = 0.05
_NOT_GRANTED = "no connection attempt granted: the flow retries with its own policy"


class _QuietOwnPools(logging.Filter):
    """psycopg_pool warns about each failed or refused connection of our pools and each connection
    it discards; the caller already reports those failures with the node, so they are not repeated."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (_NOT_GRANTED in text or "streamling:" in text or "BoundedConnection" in text)


logging.getLogger("psycopg.pool").addFilter(_QuietOwnPools())
_attempts: Counter[str] = Counter()
_attempts_lock = threading.Lock()


def connect_attempts(target: str) -> int:
    """Network connection attempts made so far to ``host:port/db`` by this process and by the
    executor-side writers it ran (they report theirs back, ``count_connect_attempts``); for tests and
    benchmarks: an outage must cost exactly the retry policy's attempts."""
    with _attempts_lock:
        return _attempts[target]


def count_connect_attempts(target: str, attempts: int) -> None:
    """Add attempts made in another process on this one's behalf (a Spark task's writer reports
    them in its result row), so one counter tells what an outage cost wherever the writers ran."""
    if attempts:
        with _attempts_lock:
            _attempts[target] += attempts


@dataclass(frozen=True)
class PoolSettings:
    """The ``postgres_sink.*`` pool keys and the statement timeout, shared by every Postgres user."""

    acquire_timeout_secs: float = 30
    idle_timeout_secs: float = 600
    max_lifetime_secs: float = 1800
    statement_timeout_secs: float = 60
    max_size: int = 1

    @classmethod
    def from_sink(cls, sink: PostgresSinkSettings, *, statement_timeout_secs: float | None = None,
                  max_size: int = 1) -> PoolSettings:
        return cls(acquire_timeout_secs=sink.pool_acquire_timeout_secs, idle_timeout_secs=sink.pool_idle_timeout_secs,
                   max_lifetime_secs=sink.pool_max_lifetime_secs,
                   statement_timeout_secs=sink.statement_timeout_secs if statement_timeout_secs is None
                   else statement_timeout_secs, max_size=max(1, max_size))

    @property
    def bound_secs(self) -> float | None:
        """Client-side bound of one round trip: 2 × the statement timeout, None when it is 0."""
        return 2.0 * self.statement_timeout_secs if self.statement_timeout_secs > 0 else None


class _Gate:
    """Grants the pool's connection factory one network attempt per acquisition and remembers how
    the last attempt failed, so a refused connection is reported to the caller instead of retried."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets = 0
        self._failures = 0
        self._last: BaseException | None = None

    def grant(self) -> int:
        """One more attempt may be made; returns the failure count to compare against later."""
        with self._lock:
            self._tickets += 1
            return self._failures

    def revoke(self) -> None:
        """The acquisition ended without using its attempt (a pooled connection was free)."""
        with self._lock:
            self._tickets = max(0, self._tickets - 1)

    def take(self) -> bool:
        with self._lock:
            if self._tickets == 0:
                return False
            self._tickets -= 1
            return True

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failures += 1
            self._last = exc

    def failure_since(self, seen: int) -> BaseException | None:
        with self._lock:
            return self._last if self._failures > seen else None


class PostgresPool:
    """Connections to one database for one node; see the module docstring."""

    def __init__(self, conninfo: str, *, target: str, describe: str, application_name: str,
                 settings: PoolSettings, autocommit: bool = False,
                 configure: Callable[[psycopg.Connection[Any]], None] | None = None) -> None:
        self.target = target
        self.describe = describe
        self.settings = settings
        self._gate = _Gate()
        bound = settings.bound_secs
        keepalive_idle = max(1, int((bound or 60) / 4))
        options = "-c TimeZone=UTC"
        if settings.statement_timeout_secs > 0:
            options += f" -c statement_timeout={int(settings.statement_timeout_secs * 1000)}"
        kwargs: dict[str, Any] = {
            "autocommit": autocommit, "application_name": application_name[:63], "options": options,
            "connect_timeout": max(1, int(min(30, settings.acquire_timeout_secs))),
            "keepalives": 1, "keepalives_idle": keepalive_idle, "keepalives_interval": keepalive_idle,
            "keepalives_count": 3,
        }
        if bound is not None:
            kwargs["tcp_user_timeout"] = int(bound * 1000)
        self._pool: ConnectionPool[Any] = ConnectionPool(
            conninfo, kwargs=kwargs, connection_class=self._connection_class(), configure=configure,
            min_size=0, max_size=settings.max_size, open=False, timeout=settings.acquire_timeout_secs,
            max_idle=settings.idle_timeout_secs, max_lifetime=settings.max_lifetime_secs,
            reconnect_timeout=0, num_workers=1, name=f"streamling:{describe}"[:63])
        self._pool.open(wait=False)

    def _connection_class(self) -> type[psycopg.Connection[Any]]:
        gate, target, describe, bound = self._gate, self.target, self.describe, self.settings.bound_secs

        class BoundedConnection(psycopg.Connection[Any]):
            """A connection whose every round trip is bounded, made only with a granted attempt."""

            @classmethod
            def connect(cls, conninfo: str = "", **kwargs: Any) -> Any:  # type: ignore[override]
                if not gate.take():
                    raise psycopg.OperationalError(_NOT_GRANTED)
                with _attempts_lock:
                    _attempts[target] += 1
                try:
                    conn = super().connect(conninfo, **kwargs)
                except BaseException as exc:
                    gate.failed(exc)
                    raise
                conn._stl_fresh = True  # type: ignore[attr-defined]
                return conn

            def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
                limit = bound if timeout is None or (bound is not None and bound < timeout) else timeout
                try:
                    return super().wait(gen, interval=interval, timeout=limit)
                except pg_errors._WaitTimeout as exc:
                    if limit != bound:
                        raise
                    log.warning("postgres %s on %s: a statement did not complete within %g s; dropping the "
                                "connection and taking a fresh one", describe, target, bound)
                    try:
                        self.close()
                    except Exception:  # noqa: BLE001 - the connection is abandoned either way
                        pass
                    raise StatementBoundExceeded(
                        f"a statement did not complete within {bound:g} s (2 × statement_timeout_secs); the "
                        "connection was dropped") from exc

        return BoundedConnection

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A live connection for one unit of work, returned to the pool afterwards. A transaction
        left open by a failure is rolled back; a broken connection is discarded by the pool."""
        conn = self._acquire()
        try:
            yield conn
        except BaseException:
            if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                try:
                    conn.rollback()
                except Exception:  # noqa: BLE001 - a broken connection is discarded below
                    conn.close()
            raise
        finally:
            self._pool.putconn(conn)

    def _acquire(self) -> psycopg.Connection[Any]:
        """One connection: a pooled one that still answers, or one fresh attempt."""
        deadline = time.monotonic() + self.settings.acquire_timeout_secs
        fresh_tried = False
        while True:
            seen = self._gate.grant()
            try:
                conn = self._wait_for(seen, deadline)
            except PoolTimeout:
                self._gate.revoke()
                raise
            if not getattr(conn, "_stl_fresh", False):
                self._gate.revoke()  # a pooled connection was free: the attempt was not needed
            if self._alive(conn):
                return conn
            self._pool.putconn(conn)  # closed: the pool drops it
            if fresh_tried:
                raise psycopg.OperationalError("a fresh connection failed its first round trip")
            fresh_tried = True

    def _wait_for(self, seen: int, deadline: float) -> psycopg.Connection[Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolTimeout(f"no connection to {self.target} within {self.settings.acquire_timeout_secs:g} s "
                                  "(postgres_sink.pool_acquire_timeout_secs)")
            try:
                return self._pool.getconn(timeout=min(_POLL_SECS, left))
            except PoolTimeout:
                failure = self._gate.failure_since(seen)
                if failure is not None:
                    raise failure from None

    @staticmethod
    def _alive(conn: psycopg.Connection[Any]) -> bool:
        """A cheap empty query: a pooled connection may have died while idle (server restart)."""
        if conn.closed or conn.broken:
            return False
        if getattr(conn, "_stl_fresh", False):
            conn._stl_fresh = False  # type: ignore[attr-defined]
            return True
        try:
            if conn.autocommit:
                conn.execute("")
            else:
                conn.autocommit = True
                try:
                    conn.execute("")
                finally:
                    if not conn.closed:
                        conn.autocommit = False
            return True
        except psycopg.Error:
            if not conn.closed:
                conn.close()
            return False

    def close(self) -> None:
        self._pool.close(timeout=1.0)


_shared: dict[tuple[str, str, str, str, PoolSettings], PostgresPool] = {}
_shared_lock = threading.Lock()


def shared_pool(conninfo: str, *, target: str, describe: str, application_name: str,
                settings: PoolSettings) -> PostgresPool:
    """The pool of this process for these connection settings, created on first use.

    Spark reuses its Python workers across tasks: a writer running in a task takes its connection
    here instead of connecting per task, and the next task on the worker finds it warm."""
    key = (conninfo, target, describe, application_name, settings)
    with _shared_lock:
        pool = _shared.get(key)
        if pool is None:
            pool = PostgresPool(conninfo, target=target, describe=describe, application_name=application_name,
                                settings=settings)
            _shared[key] = pool
        return pool
