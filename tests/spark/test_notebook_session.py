"""Notebook pipelines on the shared SparkSession: preview, background run, capture and debug."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from streamling.errors import StreamlingError
from streamling.notebook.session import NotebookPipeline
from streamling.state import InMemoryStateBackend

pytestmark = pytest.mark.spark


def _notebook(spark: Any, tmp_path: Path, source: dict[str, Any]) -> NotebookPipeline:
    nb = NotebookPipeline(application_id="nb_test", cwd=tmp_path, spark=spark)
    nb.define("source", "orders", source)
    nb.define("transform", "big", {"type": "sql", "from": ["orders"],
                                   "sql": "SELECT id, customer, amount FROM orders WHERE amount > 900"})
    nb.define("sink", "out", {"type": "blackhole", "from": ["big"]})
    return nb


def test_preview_runs_the_dag_up_to_the_node_on_a_bounded_sample(spark: Any, tmp_path: Path) -> None:
    nb = _notebook(spark, tmp_path, {"type": "generate", "rows": 5000})
    preview = nb.preview("big", rows=5)
    source_rows = preview.inputs["orders"]
    assert source_rows.num_rows == 1000  # preview_input_rows, so a selective filter has rows to show
    assert source_rows.column("id").to_pylist()[:3] == [0, 1, 2]
    out = preview.output
    assert out is not None and out.column_names == ["id", "customer", "amount", "_gs_op"]
    assert out.num_rows > 0 and all(a > 900 for a in out.column("amount").to_pylist())
    # The preview is what the same SQL gives on the same input rows.
    expected = [r["id"] for r in source_rows.to_pylist() if r["amount"] > 900]
    assert out.column("id").to_pylist() == expected
    assert "big" in nb.captures and nb.captures["big"].origin == "preview"
    assert not (tmp_path / ".streamling").exists()  # previews leave no checkpoint behind


def test_preview_of_an_unknown_node_names_it(spark: Any, tmp_path: Path) -> None:
    nb = _notebook(spark, tmp_path, {"type": "generate", "rows": 10})
    with pytest.raises(StreamlingError, match="there is no node 'nope'"):
        nb.preview("nope")


def test_debug_reruns_the_edited_transform_on_the_captured_batch_while_the_pipeline_runs(
        spark: Any, tmp_path: Path) -> None:
    nb = _notebook(spark, tmp_path, {"type": "generate", "rows_per_second": 4000, "rows_per_batch": 1000,
                                     "primary_key": "id"})
    run = nb.start(sample_rows=200)
    try:
        deadline = time.monotonic() + 120
        while not (nb._samples.get("orders") and nb._samples.get("orders").rows) and time.monotonic() < deadline:
            assert run.error is None, run.error
            time.sleep(0.2)
        capture = nb.capture("big")
        assert capture.origin == "run" and capture.epoch is not None
        captured = capture.inputs["orders"]
        assert 0 < captured.num_rows <= 200

        nb.define("transform", "big", {"type": "sql", "from": ["orders"],
                                       "sql": "SELECT id, upper(customer) AS customer, amount, amount * 2 AS twice "
                                              "FROM orders WHERE amount > 950"})
        result = nb.debug("big")
        assert run.active  # debugging did not restart or stop the pipeline
        before, after = result.before, result.after
        assert before is not None
        rows = captured.to_pylist()
        assert before.column("id").to_pylist() == [r["id"] for r in rows if r["amount"] > 900]
        assert after.column("id").to_pylist() == [r["id"] for r in rows if r["amount"] > 950]
        assert all(c == c.upper() for c in after.column("customer").to_pylist())
        changes = result.changes()
        assert changes["columns_added"] == ["twice"]
        assert changes["rows_removed"] == before.num_rows - after.num_rows
        assert changes["rows_changed"] == after.num_rows  # customer upper-cased on every kept key
    finally:
        nb.stop()
    status = nb.status()
    assert status["state"] == "stopped" and status["stop_reason"] == "stopped from the notebook"
    flow = status["flows"]["orders"]
    assert flow["last_epoch"] is not None and flow["rows_to_sinks"] > 0
    assert Path(nb.checkpoint_root()).exists()
    memory = InMemoryStateBackend(nb.settings().application_id)
    assert memory.list("streamling:checkpoint:")  # this kernel's checkpoint, resumed by its next run
    nb.reset()
    assert not Path(nb.checkpoint_root()).exists() and memory.list() == {}  # the next run starts over


def test_bounded_run_ends_by_itself_and_stops_after_n_rows(spark: Any, tmp_path: Path) -> None:
    nb = _notebook(spark, tmp_path, {"type": "generate", "rows": 3000, "rows_per_batch": 1000})
    run = nb.start()
    assert run.wait(180)
    assert run.error is None
    assert nb.status()["flows"]["orders"]["last_epoch"] == 2

    assert nb.status()["state"] == "stopped"
    nb.stop()  # nothing to stop: done at once, still stopped
    assert nb.status()["state"] == "stopped"


@pytest.mark.parametrize("where", ["planning", "starting"])
def test_a_run_that_fails_to_start_is_failed_at_once_and_stop_reset_and_run_work_after_it(
        spark: Any, tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamling.runtime.pipeline import PipelineRun

    nb = _notebook(spark, tmp_path, {"type": "generate", "rows": 300, "rows_per_batch": 100})
    shown: list[tuple[str, str | None]] = []

    class Monitor:  # what the monitor widget is told
        stats: Any = None

        def handle(self, event: Any) -> None:
            pass

        def show_state(self, state: str, detail: str | None) -> None:
            shown.append((state, detail))

    if where == "planning":  # Spark cannot analyse the SQL
        nb.define("transform", "big", {"type": "sql", "from": ["orders"], "sql": "SELECT id, versoin FROM orders"})
    else:  # the plan is fine; starting its queries fails
        def refuse(self: Any) -> None:
            raise StreamlingError("the checkpoint store refused the first write", code="test_refused")

        monkeypatch.setattr(PipelineRun, "start", refuse)
    started = time.monotonic()
    with pytest.raises(StreamlingError) as info:
        nb.start(monitor=Monitor())
    status = nb.status()
    assert status["state"] == "failed" and status["error"] == info.value.headline()
    assert shown[-1] == ("failed", info.value.headline())
    assert time.monotonic() - started < 30
    for _ in range(2):
        started = time.monotonic()
        nb.stop()  # nothing runs: at once
        assert time.monotonic() - started < 1 and nb.status()["state"] == "failed"
    nb.reset()
    monkeypatch.undo()
    nb.define("transform", "big", {"type": "sql", "from": ["orders"], "sql": "SELECT id FROM orders"})
    run = nb.start(monitor=Monitor())
    assert run.wait(180) and run.error is None
    assert nb.status()["state"] == "stopped" and nb.status()["error"] is None
    assert [s for s, _ in shown[-2:]] == ["running", "stopped"]
    assert nb.status()["flows"]["orders"]["rows_to_sinks"] == 300


def test_print_sink_rows_go_to_the_runs_own_stream(spark: Any, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import io

    nb = NotebookPipeline(application_id="nb_print", cwd=tmp_path, spark=spark)
    nb.define("source", "orders", {"type": "generate", "rows": 200})
    nb.define("transform", "big", {"type": "sql", "sql": "SELECT id FROM orders WHERE id < 3"})
    nb.define("sink", "screen", {"type": "print", "from": ["big"]})
    out = io.StringIO()
    run = nb.start(print_out=out)
    assert run.wait(180) and run.error is None
    assert out.getvalue().splitlines() == [f'{n} -> (sample_every=1) [Insert] {{"id":{n - 1},"_gs_op":"i"}}'
                                           for n in (1, 2, 3)]
    assert "sample_every" not in capsys.readouterr().out


def test_running_again_swaps_in_the_edited_pipeline_from_the_last_committed_epoch(spark: Any,
                                                                                  tmp_path: Path) -> None:
    nb = _notebook(spark, tmp_path, {"type": "generate", "rows_per_second": 2000, "rows_per_batch": 500,
                                     "primary_key": "id"})
    nb.define("transform", "big", {"type": "sql", "from": ["orders"], "sql": "SELECT id, 'v1' AS version FROM orders"})
    nb.sample_share = 0.0  # every epoch sampled: the test reads the rows each epoch produced

    def sample(node: str, version: str | None = None, timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = nb._samples.get(node)
            if got is not None and got.rows and (version is None or got.rows[0]["version"] == version):
                return got
            time.sleep(0.05)
        raise AssertionError(f"no sample of {node} {version or ''} within {timeout}s")

    first = nb.start(sample_rows=5)
    try:
        old = sample("big", "v1")
        # A broken edit is refused before anything stops: the running pipeline goes on.
        nb.define("transform", "big", {"type": "sql", "from": ["orders"], "sql": "SELECT id, versoin FROM orders"})
        with pytest.raises(StreamlingError, match="versoin"):
            nb.start(sample_rows=5, replace=True)
        assert first.active and nb.current is first

        nb.define("transform", "big", {"type": "sql", "from": ["orders"],
                                       "sql": "SELECT id, 'v2' AS version FROM orders"})
        swapped_at = time.monotonic()
        second = nb.start(sample_rows=5, replace=True)
        new = sample("big", "v2")
        print(f"edited SQL → first epoch of the new definition through the sink: {time.monotonic() - swapped_at:.2f}s")
        assert not first.active and first.error is None and second.active
        # Same checkpoint: the epochs and the source's rows go on from where the first run committed.
        assert new.epoch > old.epoch
        assert min(r["id"] for r in new.rows) > max(r["id"] for r in old.rows)
    finally:
        nb.stop()
