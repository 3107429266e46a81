"""Which Postgres failures are worth another attempt, and how they read without secrets.

One rule set for every Postgres user (sink, state backend, dynamic tables), so an outage is
retried the same way everywhere and a bad password or a constraint violation is never retried.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import psycopg

from streamling.errors import is_retriable

# SQLSTATE classes worth retrying: connection exceptions (08), insufficient resources (53),
# operator intervention: admin shutdown, cannot connect now, statement timeout (57).
_TRANSIENT_CLASSES = ("08", "53", "57")
# Serialization failure, deadlock, lock not available, read-only transaction after a failover.
_TRANSIENT_CODES = frozenset({"40001", "40P01", "55P03", "25006"})
# Connection failures that carry no SQLSTATE but that no retry can fix.
_TERMINAL_TEXT = ("authentication failed", "does not exist", "pg_hba.conf", "permission denied",
                  "does not support ssl", "invalid sslmode", "invalid connection option", "certificate",
                  "invalid port", "invalid integer value", "no password supplied")
# Invalid authorization specification / invalid password, and how libpq words them before a session
# exists (a refused login carries no SQLSTATE in psycopg).
_AUTH_CODES = frozenset({"28000", "28P01"})
_AUTH_TEXT = ("password authentication failed", "no password supplied", "authentication failed")
_PASSWORD_IN_TEXT = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


class StatementBoundExceeded(psycopg.OperationalError):
    """A statement outlived the client-side bound (2 × ``statement_timeout_secs``): the server or
    the network stopped answering without closing the connection. The connection was dropped."""


def is_transient(exc: BaseException) -> bool:
    """True when the same work may succeed later on a fresh connection (outage, failover, lock
    conflict, a statement bound hit); False for errors in the data, the schema or the settings."""
    if isinstance(exc, StatementBoundExceeded):
        return True
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state:
            return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            text = str(exc).lower()
            return not any(marker in text for marker in _TERMINAL_TEXT)
        return False
    return is_retriable(exc)


#: What a sink says when Postgres refuses its login: the keys to fix (the main and the aggregate sink
#: read the same connection settings).
SINK_LOGIN_HINT = ("check postgres_sink.user/pass (STREAMLING__POSTGRES_SINK__PASS, or "
                   "STREAMLING__POSTGRES_SINK_CONNECTIONS__<SINK>__PASS for this sink); this error is not retried")


def is_authentication_failure(exc: BaseException) -> bool:
    """True when Postgres refused the login itself: the fix is the credentials, not the data."""
    state = getattr(exc, "sqlstate", None)
    if state:
        return state in _AUTH_CODES
    return isinstance(exc, psycopg.Error) and any(marker in str(exc).lower() for marker in _AUTH_TEXT)




def mask(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret and any ``password=…`` pair replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _PASSWORD_IN_TEXT.sub(r"\1***", text)


def sqlstate_prefix(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None)
    return f"SQLSTATE {state}: " if state else ""
