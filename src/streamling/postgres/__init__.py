"""Postgres plumbing shared by the sink, the state backend and dynamic tables.

``PostgresPool`` connects with the configured settings (pool keys, statement timeout, keepalives,
a client-side bound per round trip); ``is_transient`` tells a failure worth another attempt from
one that is not, and ``mask`` keeps passwords out of messages. Nothing here retries: callers raise
``StreamlingError(retriable=is_transient(exc))`` and the flow retries with one policy. The sinks'
column types and the fit of an existing table are ``streamling.postgres.columns``.
"""

from streamling.errors import first_line  # the one helper; callers here import it from this package
from streamling.postgres.errors import (
    SINK_LOGIN_HINT,
    StatementBoundExceeded,
    is_authentication_failure,
    is_transient,
    mask,
    sqlstate_prefix,
)
from streamling.postgres.pool import (
    PoolSettings,
    PostgresPool,
    connect_attempts,
    count_connect_attempts,
    shared_pool,
)

__all__ = [
    "SINK_LOGIN_HINT",
    "PoolSettings",
    "PostgresPool",
    "StatementBoundExceeded",
    "connect_attempts",
    "count_connect_attempts",
    "first_line",
    "is_authentication_failure",
    "is_transient",
    "mask",
    "shared_pool",
    "sqlstate_prefix",
]
