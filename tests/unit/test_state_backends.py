"""State backends without services: the in-memory and SQLite implementations and the factory."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streamling.config import load_settings
from streamling.errors import StreamlingError
from streamling.state import (
    InMemoryStateBackend,
    SqliteStateBackend,
    StateBackend,
    create_state_backend,
)

Factory = Callable[[str], StateBackend]


@pytest.fixture(params=["memory", "sqlite"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Backends of one kind that share storage (one dict or one file), for any namespace."""
    opened: list[StateBackend] = []
    suffix = uuid.uuid4().hex[:8]

    def factory(namespace: str) -> StateBackend:
        ns = f"{namespace}_{suffix}"  # the in-memory store is process-wide
        backend: StateBackend = (InMemoryStateBackend(ns) if request.param == "memory"
                                 else SqliteStateBackend(tmp_path / "state.db", ns))
        opened.append(backend)
        return backend

    yield factory
    for backend in opened:
        backend.close()


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
    value = {"offset": 1, "list": [1]}
    state.put("k", value)
    value["list"].append(2)
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


# --- SQLite specifics --------------------------------------------------------------------------------

def test_sqlite_file_and_directories_are_created_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "state.db"
    state = SqliteStateBackend(path, "app")
    state.put("k", {"offset": 7})
    state.close()
    assert path.is_file()
    again = SqliteStateBackend(path, "app")
    assert again.get("k") == {"offset": 7}
    again.close()


def test_sqlite_table_layout_and_created_at_kept_on_update(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    state = SqliteStateBackend(path, "app")
    state.put("k", {"v": 1})
    db = sqlite3.connect(path)
    columns = [row[1] for row in db.execute("PRAGMA table_info(state)")]
    assert columns == ["namespace", "key", "data", "created_at"]
    pk = [row[1] for row in sorted(db.execute("PRAGMA table_info(state)"), key=lambda r: r[5]) if row[5]]
    assert pk == ["namespace", "key"]
    created = db.execute("SELECT created_at, data FROM state WHERE key = 'k'").fetchone()
    time.sleep(0.01)
    state.put("k", {"v": 2})
    updated = db.execute("SELECT created_at, data FROM state WHERE key = 'k'").fetchone()
    assert updated[0] == created[0] and updated[1] == '{"v":2}'
    db.close()
    state.close()


def test_sqlite_relative_path_resolves_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = SqliteStateBackend("rel/state.db", "app")
    state.put("k", {"v": 1})
    state.close()
    assert (tmp_path / "rel" / "state.db").is_file()


def test_sqlite_unusable_path_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StreamlingError, match="cannot open the SQLite state backend"):
        SqliteStateBackend(blocker / "state.db", "app")


# --- factory -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["InMemory", "inmemory", "IN_MEMORY", "in-memory"])
def test_factory_in_memory_spellings(spelling: str, tmp_path: Path) -> None:
    settings = load_settings(environ={"STREAMLING__STATE_BACKEND__BACKEND_TYPE": spelling,
                                      "STREAMLING__APPLICATION_ID": f"app_{uuid.uuid4().hex[:6]}"}, cwd=tmp_path)
    state = create_state_backend(settings)
    assert isinstance(state, InMemoryStateBackend)
    assert state.namespace == settings.application_id


@pytest.mark.parametrize("spelling", ["Sqlite", "sqlite", "SQLITE"])
def test_factory_sqlite_uses_configured_path(spelling: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={}, cwd=tmp_path, overrides={
        "application_id": "my_app", "state_backend": {"backend_type": spelling, "sqlite": {"database_path": "s.db"}}})
    state = create_state_backend(settings)
    assert isinstance(state, SqliteStateBackend)
    assert state.path == tmp_path / "s.db" and state.namespace == "my_app"
    state.put("k", {"v": 1})
    state.close()
    other = create_state_backend(settings, namespace="other_app")
    assert other.get("k") is None
    other.close()


def test_factory_default_is_in_memory(tmp_path: Path) -> None:
    assert isinstance(create_state_backend(load_settings(environ={}, cwd=tmp_path)), InMemoryStateBackend)


def test_unknown_backend_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(StreamlingError, match="unknown state backend"):
        load_settings(environ={"STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Redis"}, cwd=tmp_path)
