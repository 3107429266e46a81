"""``InMemory`` state: a dict that lives as long as the process (tests, demos, stateless runs)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from streamling.state.base import decode, encode

# One store per process, so several backends with one namespace (a source and its finalizer hook)
# see the same keys, as Streamling's shared HashMap does.
_STORES: dict[str, dict[str, str]] = {}
_LOCK = threading.Lock()


class InMemoryStateBackend:
    """Keys in a process-wide dict per namespace; nothing survives a restart."""

    durable = False

    def __init__(self, namespace: str, *, shared: bool = True) -> None:
        self.namespace = namespace
        with _LOCK:
            self._data = _STORES.setdefault(namespace, {}) if shared else {}

    def get(self, key: str) -> dict[str, Any] | None:
        with _LOCK:
            text = self._data.get(key)
        return None if text is None else decode(text)

    def put(self, key: str, data: dict[str, Any]) -> None:
        text = encode(key, data)
        with _LOCK:
            self._data[key] = text

    def put_many(self, items: Mapping[str, dict[str, Any]]) -> None:
        encoded = {key: encode(key, data) for key, data in items.items()}
        with _LOCK:
            self._data.update(encoded)

    def delete(self, key: str) -> None:
        with _LOCK:
            self._data.pop(key, None)

    def list(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        with _LOCK:
            items = [(k, v) for k, v in self._data.items() if k.startswith(prefix)]
        return {k: decode(v) for k, v in sorted(items)}

    def clear(self) -> None:
        with _LOCK:
            self._data.clear()

    def close(self) -> None:
        """Nothing to release; the data stays for other backends of the namespace."""
