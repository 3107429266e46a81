"""``Sqlite`` state: one local file, created on first use (single-machine runs that must resume)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from streamling.errors import StreamlingError
from streamling.state.base import SqlStateBackend, decode

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (namespace, key)
)
"""
UPSERT = ("INSERT INTO state (namespace, key, data) VALUES (?, ?, ?) "
          "ON CONFLICT (namespace, key) DO UPDATE SET data = excluded.data")


class SqliteStateBackend(SqlStateBackend):
    """Keys in ``state(namespace, key, data, created_at)``; ``created_at`` is kept on update."""

    durable = True

    def __init__(self, path: str | Path, namespace: str) -> None:
        self.namespace = namespace
        self.path = Path(path).expanduser().resolve()  # relative paths: against the current directory
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Finalizer hooks may run on another thread than the one that opened the backend.
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StreamlingError(f"cannot open the SQLite state backend at {self.path}: {exc}",
                                  code="state_backend_unavailable",
                                  hint="fix state_backend.sqlite.database_path or its directory's permissions"
                                  ) from exc

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM state WHERE namespace = ? AND key = ?",
                                   (self.namespace, key)).fetchone()
        return None if row is None else decode(row[0])

    def upsert_rows(self, rows: list[tuple[str, str, str]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(UPSERT, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def delete(self, key: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM state WHERE namespace = ? AND key = ?", (self.namespace, key))

    def list(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT key, data FROM state WHERE namespace = ? AND substr(key, 1, ?) = ? ORDER BY key",
                (self.namespace, len(prefix), prefix)).fetchall()
        return {key: decode(data) for key, data in rows}

    def clear(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM state WHERE namespace = ?", (self.namespace,))

    def close(self) -> None:
        with self._lock:
            self._db.close()
