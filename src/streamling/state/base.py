"""The state backend contract: small JSON documents keyed by string, namespaced per application.

Sources keep their positions here (Kafka ``{reference_name}:{topic}:{partition}`` → ``{offset,
updated_at}``, ``clickhouse_source:…``, ``hybrid_source_<name>_v1``) so that a restart resumes where
the last finalized epoch ended. The namespace is the ``application_id``: two applications sharing a
database never see each other's keys.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class StateBackend(Protocol):
    """What every backend offers; values are JSON objects (``dict``), returned as fresh copies."""

    namespace: str
    #: whether what is stored outlives the process; a flow resumes its checkpoint in a new
    #: process only then (``streamling.runtime.checkpoints``)
    durable: bool

    def get(self, key: str) -> dict[str, Any] | None:
        """The value stored under ``key`` in this namespace, or None."""
        ...

    def put(self, key: str, data: dict[str, Any]) -> None:
        """Insert or replace ``key``; the first write's ``created_at`` is kept."""
        ...

    def put_many(self, items: Mapping[str, dict[str, Any]]) -> None:
        """Several puts that land together (one transaction where the backend has them)."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is fine."""
        ...

    def list(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        """Every key of this namespace starting with ``prefix`` and its value."""
        ...

    def clear(self) -> None:
        """Remove every key of this namespace (a notebook's ``%streamling reset``)."""
        ...

    def close(self) -> None:
        """Release files or connections."""
        ...


class SqlStateBackend(ABC):
    """What the SQL backends (SQLite, Postgres) share: a put is a ``put_many`` of one, and both store
    the same ``(namespace, key, JSON)`` rows, each value checked by ``encode`` before any is written."""

    namespace: str

    def put(self, key: str, data: dict[str, Any]) -> None:
        self.put_many({key: data})

    def put_many(self, items: Mapping[str, dict[str, Any]]) -> None:
        rows = [(self.namespace, key, encode(key, data)) for key, data in items.items()]
        if rows:
            self.upsert_rows(rows)

    @abstractmethod
    def upsert_rows(self, rows: list[tuple[str, str, str]]) -> None:
        """Insert or replace ``(namespace, key, JSON)`` rows in one transaction."""


def encode(key: str, data: Mapping[str, Any]) -> str:
    """JSON text for a value. Every backend goes through JSON, so a value that works in memory also
    works in SQLite and Postgres, and callers never share mutable state with the backend."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"state key must be a non-empty string, got {key!r}")
    if not isinstance(data, Mapping):
        raise TypeError(f"state value for {key!r} must be a dict, got {type(data).__name__}")
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"state value for {key!r} is not JSON-serialisable: {exc}") from exc


def decode(text: str | bytes) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"stored state is not a JSON object: {text!r:.80}")
    return value
