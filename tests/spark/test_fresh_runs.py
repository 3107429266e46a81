"""A new process under the ``InMemory`` backend reads its sources again and its sinks write again:
epoch ids start over at 0 under the same ``application_id``, and a Delta sink's idempotent-write ids
(``txnAppId``, ``txnVersion``) must not make those epochs look already written. A durable backend
resumes instead. A new process is what the in-memory backend forgets, so clearing it stands for one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Runner

from streamling.runtime import events as ev
from streamling.state import InMemoryStateBackend

APPEND = """
    sources:
      orders: {{type: generate, rows: 30, rows_per_batch: 10}}
    sinks:
      lake: {{type: delta, from: orders, path: "{path}"}}
"""


def test_a_new_process_appends_every_row_again_and_a_durable_backend_resumes(
        runner: Runner, tmp_path: Path, read_delta: Callable[[Path], list[dict[str, Any]]]) -> None:
    lake = tmp_path / "lake"
    pipeline = APPEND.format(path=lake)
    app = "restart_semantics"
    runner.run(pipeline, application_id=app)
    assert len(read_delta(lake)) == 30
    runner.events.clear()
    runner.run(pipeline, application_id=app)  # the same process: its checkpoint resumes, nothing new
    assert runner.of_type(ev.EpochFlushed) == [] and len(read_delta(lake)) == 30

    InMemoryStateBackend(app).clear()  # a new process
    runner.run(pipeline, application_id=app)
    assert [e.epoch for e in runner.of_type(ev.EpochFlushed)] == [0, 1, 2]
    ids = [r["id"] for r in read_delta(lake)]
    assert len(ids) == 60 and all(ids.count(i) == 2 for i in set(ids))  # every row again, none skipped

    sqlite = {"backend_type": "Sqlite", "sqlite": {"database_path": str(tmp_path / "state.db")}}
    durable = "restart_semantics_durable"
    runner.run(pipeline, application_id=durable, state_backend=sqlite)
    assert len(read_delta(lake)) == 90
    InMemoryStateBackend(durable).clear()
    runner.events.clear()
    runner.run(pipeline, application_id=durable, state_backend=sqlite)  # a new process resumes
    assert runner.of_type(ev.EpochFlushed) == [] and len(read_delta(lake)) == 90
