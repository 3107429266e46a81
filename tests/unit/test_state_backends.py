"""State backends without services: the in-memory and SQLite implementations and the factory."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The contract every backend passes (Postgres too, in tests/integration/postgres), run on both of these.
from state_contract import *  # noqa: F403 - the backend contract's tests, collected here with ``make`` below
from state_contract import Factory

from streamling.config import load_settings
from streamling.errors import StreamlingError
from streamling.state import (
    InMemoryStateBackend,
    SqliteStateBackend,
    StateBackend,
    create_state_backend,
)


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
