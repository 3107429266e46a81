"""The pieces of a notebook job that need no Spark: SQL cells split into statements, errors in one line."""

from __future__ import annotations

from typing import Any

from streamling.bundle.notebook_job import _describe, bind_parameters, split_sql
from streamling.errors import StreamlingError
from streamling.notebook.cells import PipelineError


def test_sql_cells_split_at_semicolons_outside_strings_and_comments() -> None:
    text = ("CREATE TABLE t AS SELECT 'a;b' AS s, \"x;y\" AS q; -- a comment; not a statement\n"
            "/* block; comment */ INSERT INTO t VALUES ('it''s; fine', `c;d`);\n\n;  SELECT * FROM t")
    assert split_sql(text) == [
        "CREATE TABLE t AS SELECT 'a;b' AS s, \"x;y\" AS q",
        "INSERT INTO t VALUES ('it''s; fine', `c;d`)",
        "SELECT * FROM t",
    ]
    assert split_sql("SELECT 'back\\'slash;' AS s") == ["SELECT 'back\\'slash;' AS s"]
    assert split_sql("-- only a comment\n") == []


def test_a_failed_cell_is_described_in_one_line() -> None:
    assert _describe(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert _describe(ValueError("first\nsecond")) == "ValueError: first"
    assert _describe(PipelineError("Node 'x': bad")) == "Node 'x': bad"
    assert _describe(StreamlingError("no such topic", hint="create it")) == "no such topic — create it"


def test_parameters_bind_as_literals_outside_strings_and_as_text_in_legacy_references() -> None:
    values = {"floor": "100", "who": "o'brien", "path": "/data/lake"}
    assert bind_parameters("SELECT * FROM delta.`${path}` WHERE amount >= :floor AND who = :who "
                           "AND note = ':floor' AND x::int = 1 AND y = :unknown", values) == (
        "SELECT * FROM delta.`/data/lake` WHERE amount >= '100' AND who = 'o\\'brien' "
        "AND note = ':floor' AND x::int = 1 AND y = :unknown")


def test_a_child_notebooks_timeout_reaches_a_thread_other_than_the_main_one() -> None:
    """``dbutils.notebook.run`` called from a worker thread (notebooks run in parallel): no signal
    can reach that thread, so its deadline raises ``TimeoutError`` in it; a cancelled one does not."""
    import threading
    import time

    from streamling.bundle.notebook_job import _deadline

    outcome: list[str] = []

    def child(timeout: float, work_secs: float) -> None:
        deadline = _deadline(timeout, "child")
        try:
            end = time.monotonic() + work_secs
            while time.monotonic() < end:
                time.sleep(0.01)
            outcome.append("finished")
        except TimeoutError:
            outcome.append("timed out")
        finally:
            if deadline is not None:
                deadline.cancel()

    for timeout, work in ((0.2, 5.0), (5.0, 0.2)):
        worker = threading.Thread(target=child, args=(timeout, work))
        worker.start()
        worker.join(10)
        assert not worker.is_alive()
    assert outcome == ["timed out", "finished"]


def test_the_task_waits_for_and_stops_the_streaming_queries_of_its_child_notebooks_too(tmp_path: Any) -> None:
    """A child of ``dbutils.notebook.run`` has its own SparkSession, hence its own query manager: a
    query it started is the task's to wait for and to stop, as one the notebook started itself."""
    from types import SimpleNamespace

    from streamling.bundle.notebook_job import NotebookJob
    from streamling.config import load_settings

    stopped: list[str] = []

    def query(name: str) -> Any:
        return SimpleNamespace(name=name, stop=lambda: stopped.append(name))

    def session(*names: str) -> Any:
        return SimpleNamespace(streams=SimpleNamespace(active=[query(n) for n in names]))

    job = NotebookJob(tmp_path / "n.py", "n.py", tmp_path, load_settings(None))
    job.spark = session("own")
    job._child_sessions = [session(), session("child's")]
    assert [q.name for q in job._streaming_queries()] == ["own", "child's"]
    job._stop_all()
    assert stopped == ["own", "child's"]
