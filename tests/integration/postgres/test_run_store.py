"""The job runner's store on Postgres (several hosts) and on SQLite (one host): the same calls, the same
answers; the lease passes only when it expires, and a fenced attempt learns it on its next heartbeat."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from streamling.bundle.store import Store, StoreUnavailable
from streamling.bundle.store_backends import PostgresStore, SqliteStore
from streamling.config.sections import JobRunnerSettings

pytestmark = [pytest.mark.postgres]


def _pg_settings(service: Mapping[str, str], **over: Any) -> JobRunnerSettings:
    conn = {"host": service["STREAMLING__POSTGRES_SINK__HOST"], "port": int(service["STREAMLING__POSTGRES_SINK__PORT"]),
            "user": service["STREAMLING__POSTGRES_SINK__USER"], "pass": service["STREAMLING__POSTGRES_SINK__PASS"],
            "db": service["STREAMLING__POSTGRES_SINK__DB"], **over}
    return JobRunnerSettings.model_validate({"store": "postgres", "postgres": conn, "lease_secs": 2})


@pytest.fixture(params=["postgres", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str) -> Iterator[Store]:
    if request.param == "postgres":
        service = request.getfixturevalue("postgres_service")
        opened: Store = PostgresStore(_pg_settings(service), unique_name)
    else:
        opened = SqliteStore(tmp_path / "runs.db")
    yield opened
    opened.destroy()
    opened.close()


def test_runs_tasks_and_requests_round_trip(store: Store) -> None:
    run_id = store.create_run("job", 3, "manual", {"p": "1"}, ["b", "a"])
    assert [t["task_key"] for t in store.tasks(run_id)] == ["b", "a"]  # the job's order, not the keys'
    store.set_run(run_id, state="running", started_at=time.time())
    run = store.run(run_id)
    assert run is not None and run.state == "running" and run.params == {"p": "1"} and run.active
    assert [r.id for r in store.runs("job", active_only=True)] == [run_id]
    request = store.request("cancel", run_id=run_id)
    assert [r["id"] for r in store.pending_requests()] == [request]
    store.handled(request, {"cancelled": True})
    assert store.request_result(request) == {"cancelled": True} and not store.pending_requests()
    store.set_job_state("job", failures=2, not_before=1.5)
    state = store.job_state("job")
    assert state is not None and state["failures"] == 2 and state["not_before"] == 1.5
    # a retried task's values replace its earlier attempt's
    store.set_task_values(run_id, "a", {"rows": 1, "stale": True})
    store.set_task_values(run_id, "a", {"rows": 3, "meta": {"tables": ["x"]}})
    assert store.task_values(run_id) == {"a": {"meta": {"tables": ["x"]}, "rows": 3}}


def test_the_lease_is_renewed_by_its_holder_and_passes_only_once_it_expired(store: Store) -> None:
    assert not store.lease().held
    first = store.acquire_lease("a:1:0", "a", 1, 2.0)
    assert first is not None
    assert store.acquire_lease("b:2:0", "b", 2, 2.0) is None  # held: the other host stands by
    assert store.acquire_lease("a:1:0", "a", 1, 2.0) == first  # a renewal keeps the generation
    lease = store.lease()
    assert lease.held and lease.host == "a" and 1.5 < lease.expires_at - lease.now <= 2.0
    time.sleep(2.2)
    assert not store.lease().held
    second = store.acquire_lease("b:2:0", "b", 2, 2.0)
    assert second == first + 1  # another holder: a new generation
    assert store.acquire_lease("a:1:0", "a", 1, 2.0) is None  # the old holder cannot renew any more
    store.release_lease("b:2:0")
    assert not store.lease().held and store.acquire_lease("a:1:0", "a", 1, 2.0) == second + 1


def test_a_fenced_attempt_learns_it_on_its_next_heartbeat(store: Store) -> None:
    run_id = store.create_run("job", 1, "continuous", {}, ["t"])
    attempt = store.start_attempt(run_id, "t", 1, 1, "/logs/t-1.log", "host-a")
    beat = store.heartbeat(attempt)
    assert beat is not None and beat["fenced_at"] is None
    age = store.heartbeat_age(attempt)
    assert age is not None and 0 <= age < 1
    store.fence(attempt, "host-b:7:0")
    beat = store.heartbeat(attempt)
    assert beat is not None and beat["fenced_at"] is not None and beat["fenced_by"] == "host-b:7:0"
    assert store.heartbeat(attempt + 1000) is None  # no such attempt: its driver stops too


def test_two_roots_in_one_database_keep_their_runs_apart(postgres_service: Mapping[str, str],
                                                         unique_name: str) -> None:
    one = PostgresStore(_pg_settings(postgres_service), f"{unique_name}_1")
    two = PostgresStore(_pg_settings(postgres_service), f"{unique_name}_2")
    try:
        one.create_run("job", 1, "manual", {}, ["t"])
        assert one.runs() and not two.runs()
    finally:
        for s in (one, two):
            s.destroy()
            s.close()


def test_an_unreachable_or_refused_store_is_one_clear_masked_error(postgres_service: Mapping[str, str],
                                                                   unique_name: str) -> None:
    from streamling.util import free_port

    with pytest.raises(StoreUnavailable) as down:
        PostgresStore(_pg_settings(postgres_service, port=free_port()), unique_name)
    assert down.value.retriable and "job runner's store postgres://" in down.value.headline()
    with pytest.raises(StoreUnavailable) as refused:
        PostgresStore(_pg_settings(postgres_service, **{"pass": "wrong-password-123"}), unique_name)
    text = refused.value.headline()
    assert not refused.value.retriable and "wrong-password-123" not in text and "password" in text, text
    assert "job_runner.postgres" in (refused.value.hint or "")
