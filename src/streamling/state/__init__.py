"""State backends: where sources keep their positions between runs (``state_backend.*``).

``create_state_backend(settings)`` picks the backend named by ``state_backend.backend_type``
(``InMemory``, ``Sqlite`` or ``Postgres``, case and punctuation ignored) and namespaces it by
``application_id``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.errors import StreamlingError
from streamling.state.base import StateBackend
from streamling.state.memory import InMemoryStateBackend
from streamling.state.sqlite import SqliteStateBackend

if TYPE_CHECKING:
    from streamling.config import Settings
    from streamling.state.postgres import PostgresStateBackend

__all__ = [
    "InMemoryStateBackend",
    "PostgresStateBackend",
    "SqliteStateBackend",
    "StateBackend",
    "create_state_backend",
    "is_durable",
]


def is_durable(settings: Settings) -> bool:
    """Whether the configured backend keeps positions between runs, so a new run resumes its
    checkpoint (``streamling.runtime.checkpoints``); ``InMemory`` starts every run over."""
    from streamling.config.sections import normalize_backend

    return normalize_backend(settings.state_backend.backend_type) != "inmemory"


def create_state_backend(settings: Settings, namespace: str | None = None) -> StateBackend:
    """The configured backend for ``namespace`` (default: ``settings.application_id``)."""
    from streamling.config.sections import normalize_backend

    ns = namespace or settings.application_id
    cfg = settings.state_backend
    kind = normalize_backend(cfg.backend_type)
    if kind == "inmemory":
        return InMemoryStateBackend(ns)
    if kind == "sqlite":
        return SqliteStateBackend(cfg.sqlite.database_path, ns)
    if kind == "postgres":
        from streamling.postgres import PoolSettings
        from streamling.runtime.retry import call_with_retry
        from streamling.state.postgres import PostgresStateBackend

        # Pool keys and the statement bound are postgres_sink's: one place configures Postgres clients.
        # The backend only classifies; opening it follows the same retry policy as the flows.
        pool = PoolSettings.from_sink(settings.postgres_sink)
        return call_with_retry(lambda: PostgresStateBackend(cfg.postgres, ns, pool=pool), settings.retry,
                               f"opening the Postgres state backend at {cfg.postgres.host}:{cfg.postgres.port}")
    raise StreamlingError(f"unknown state backend {cfg.backend_type!r}", code="config_invalid",
                          hint="set state_backend.backend_type to InMemory, Sqlite or Postgres")


def __getattr__(name: str) -> object:
    """``PostgresStateBackend`` without importing psycopg until it is used."""
    if name == "PostgresStateBackend":
        from streamling.state.postgres import PostgresStateBackend

        return PostgresStateBackend
    raise AttributeError(name)
