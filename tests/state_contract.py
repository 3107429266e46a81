"""The state backend contract: one test body that every backend passes (in-memory, SQLite and
Postgres), imported by each backend's test module with a ``make`` fixture of its own, so a backend
cannot drift from what the sources and the flow rely on.

``make(namespace)`` opens a backend of the module's kind over one shared store (one process-wide
dict, one SQLite file, one Postgres table): two calls with the same namespace see the same keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from streamling.state import StateBackend

Factory = Callable[[str], StateBackend]

__all__ = ["test_get_put_overwrite_delete", "test_values_are_copies", "test_put_many_and_list_by_prefix",
           "test_namespaces_are_isolated", "test_same_namespace_shares_keys", "test_rejects_non_json_values",
           "test_put_many_is_all_or_nothing", "test_concurrent_writers"]


def test_get_put_overwrite_delete(make: Factory) -> None:
    state = make("app")
    assert isinstance(state, StateBackend)
    assert state.get("kafka_source:orders:0") is None
    state.put("kafka_source:orders:0", {"offset": 41, "updated_at": "2024-01-01T00:00:00Z"})
    assert state.get("kafka_source:orders:0") == {"offset": 41, "updated_at": "2024-01-01T00:00:00Z"}
    state.put("kafka_source:orders:0", {"offset": 42, "nested": {"a": [1, None, "x"]}})
    assert state.get("kafka_source:orders:0") == {"offset": 42, "nested": {"a": [1, None, "x"]}}
    state.delete("kafka_source:orders:0")
    state.delete("kafka_source:orders:0")  # missing keys are fine
    assert state.get("kafka_source:orders:0") is None


def test_values_are_copies(make: Factory) -> None:
    state = make("app")
    items = [1]
    value = {"offset": 1, "list": items}
    state.put("k", value)
    items.append(2)
    got = state.get("k")
    assert got == {"offset": 1, "list": [1]}
    assert got is not None
    got["offset"] = 99
    assert state.get("k") == {"offset": 1, "list": [1]}


def test_put_many_and_list_by_prefix(make: Factory) -> None:
    state = make("app")
    state.put_many({f"src:topic:{p}": {"offset": p} for p in range(3)})
    state.put_many({"src_other:x": {"offset": 9}, "100%_done": {"ok": True}})
    state.put_many({})
    assert state.list("src:topic:") == {f"src:topic:{p}": {"offset": p} for p in range(3)}
    assert list(state.list("src")) == ["src:topic:0", "src:topic:1", "src:topic:2", "src_other:x"]
    assert state.list("100%") == {"100%_done": {"ok": True}}  # no LIKE wildcards
    assert state.list("src_") == {"src_other:x": {"offset": 9}}
    assert len(state.list()) == 5
    assert state.list("nothing") == {}


def test_namespaces_are_isolated(make: Factory) -> None:
    a, b = make("app_a"), make("app_b")
    a.put("k", {"who": "a"})
    b.put("k", {"who": "b"})
    assert a.get("k") == {"who": "a"} and b.get("k") == {"who": "b"}
    a.delete("k")
    assert b.get("k") == {"who": "b"}
    assert list(a.list()) == [] and list(b.list()) == ["k"]


def test_same_namespace_shares_keys(make: Factory) -> None:
    """A source and its finalizer hook may hold separate backends of one application."""
    first, second = make("app"), make("app")
    first.put("k", {"v": 1})
    assert second.get("k") == {"v": 1}


def test_rejects_non_json_values(make: Factory) -> None:
    state = make("app")
    with pytest.raises(TypeError, match="'k'"):
        state.put("k", {"when": object()})
    with pytest.raises(TypeError):
        state.put("k", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        state.put("", {"v": 1})
    assert state.get("k") is None


def test_put_many_is_all_or_nothing(make: Factory) -> None:
    state = make("app")
    with pytest.raises(TypeError):
        state.put_many({"good": {"v": 1}, "bad": {"v": object()}})
    assert state.list() == {}


def test_concurrent_writers(make: Factory) -> None:
    state = make("app")

    def writer(n: int) -> None:
        for i in range(50):
            state.put(f"w{n}:{i}", {"i": i})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(state.list("w")) == 200
