"""The Postgres state backend against a real server: the contract every backend passes, then what only
Postgres has (its table layout, a dropped connection, an unreachable server, a wrong password)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from state_contract import *  # noqa: F403 - the backend contract's tests, collected here with ``make`` below
from state_contract import Factory

from streamling.config import Settings, load_settings
from streamling.errors import StreamlingError
from streamling.state import PostgresStateBackend, StateBackend, create_state_backend

pytestmark = pytest.mark.postgres


class Opener:
    """Backends over one unique state table; closed at the end of the test."""

    def __init__(self, environ: Mapping[str, str], cwd: Path, table: str) -> None:
        self.environ, self.cwd, self.table = environ, cwd, table
        self.opened: list[StateBackend] = []

    def settings(self, app: str = "app", **postgres: Any) -> Settings:
        overrides = {"application_id": app, "state_backend": {
            "backend_type": "Postgres",
            "postgres": {"state_schema_name": f"s_{self.table}", "state_table_name": self.table, **postgres}}}
        return load_settings(environ=self.environ, cwd=self.cwd, overrides=overrides)

    def __call__(self, app: str = "app") -> StateBackend:
        backend = create_state_backend(self.settings(app))
        self.opened.append(backend)
        return backend


@pytest.fixture()
def open_state(pg_environ: Mapping[str, str], tmp_path: Path, unique_name: str) -> Iterator[Opener]:
    opener = Opener(pg_environ, tmp_path, unique_name)
    yield opener
    for backend in opener.opened:
        backend.close()


@pytest.fixture()
def make(open_state: Opener) -> Factory:
    """The contract's factory: Postgres backends over one state table, a namespace per application."""
    return open_state


def test_table_is_created_with_the_streamling_layout(open_state: Opener, pg: Any) -> None:
    state = open_state()
    assert isinstance(state, PostgresStateBackend) and isinstance(state, StateBackend)
    schema, table = f"s_{open_state.table}", open_state.table
    cols = pg.execute("SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                      "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                      (schema, table)).fetchall()
    assert cols == [("namespace", "text", "NO"), ("key", "text", "NO"), ("data", "jsonb", "NO"),
                    ("created_at", "timestamp with time zone", "NO")]
    pk = pg.execute("SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey, a.attnum)) "
                    "FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                    "WHERE i.indrelid = %s::regclass AND i.indisprimary", (f'"{schema}"."{table}"',)).fetchone()
    assert pk == (["namespace", "key"],)


def test_created_at_is_kept_on_update_and_data_is_jsonb(open_state: Opener, pg: Any) -> None:
    state = open_state()
    table = f'"s_{open_state.table}"."{open_state.table}"'
    state.put("k", {"v": 1})
    created = pg.execute(f"SELECT created_at FROM {table} WHERE key = 'k'").fetchone()
    time.sleep(0.01)
    state.put("k", {"v": 2})
    row = pg.execute(f"SELECT created_at, data->>'v' FROM {table} WHERE key = 'k'").fetchone()
    assert row == (created[0], "2")


def test_a_namespace_survives_a_reopen(open_state: Opener) -> None:
    a = open_state("app_a")
    a.put("k", {"who": "a"})
    a.close()
    assert open_state("app_a").get("k") == {"who": "a"}  # a restart reads what the last run wrote


def test_recovers_from_a_dropped_connection(open_state: Opener, pg: Any) -> None:
    state = open_state()
    state.put("k", {"v": 1})
    pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
               "WHERE application_name = 'streamling:state' AND pid <> pg_backend_pid()")
    assert state.get("k") == {"v": 1}


def test_unreachable_server_is_a_retriable_error(open_state: Opener, pg_environ: Mapping[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = open_state.settings(port=port)
    settings.retry.max_attempts, settings.retry.initial_backoff_ms = 2, 10
    with pytest.raises(StreamlingError) as info:
        create_state_backend(settings)
    assert info.value.retriable and f"127.0.0.1:{port}/" in str(info.value)
    assert pg_environ["STREAMLING__STATE_BACKEND__POSTGRES__PASSWORD"] not in info.value.describe(debug=True)


def test_wrong_password_is_not_retried(open_state: Opener) -> None:
    settings = open_state.settings(password="wrong")
    settings.retry.max_attempts, settings.retry.initial_backoff_ms = 5, 5000
    started = time.monotonic()
    with pytest.raises(StreamlingError, match="authentication failed") as info:
        create_state_backend(settings)
    assert not info.value.retriable and time.monotonic() - started < 3
