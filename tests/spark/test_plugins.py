"""Plugins on Spark: a plugin source, transform and sink in one pipeline, their hooks in order,
transient failures retried by the flow, and a failing plugin named with its node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from harness import Runner

from streamling.errors import StreamlingError
from streamling.plugins.discovery import load_plugins

PLUGINS = Path(__file__).resolve().parents[2] / "fixtures" / "plugins" / "journal_plugins.py"


@pytest.fixture(autouse=True, scope="module")
def journal_plugins() -> None:
    assert not load_plugins(str(PLUGINS))


def _journal(directory: Path) -> list[dict[str, Any]]:
    path = directory / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _written(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for file in sorted((directory / "out").glob("*.jsonl")):
        rows += [json.loads(line) for line in file.read_text().splitlines()]
    return rows


def _pipeline(directory: Path, rows: int, extra: str = "", parallelism: int = 2) -> str:
    return f"""
    sources:
      counter:
        type: journal.counter
        dir: {directory}
        options: {{rows: {rows}, batch: 250}}
    transforms:
      doubled:
        type: journal.flaky
        from: counter
        primary_key: id
        dir: {directory}
        {extra}
      odd:
        type: sql
        sql: SELECT id, doubled, payload, _gs_op FROM doubled WHERE id % 2 = 1
    sinks:
      out:
        type: journal.files
        from: odd
        parallelism: {parallelism}
        dir: {directory}
    """


def test_plugin_source_transform_and_sink_run_in_one_flow_with_hooks_in_order(runner: Runner,
                                                                                tmp_path: Path) -> None:
    run = runner.run(_pipeline(tmp_path, rows=1000))
    assert run.runners[0].failure is None
    rows = _written(tmp_path)
    assert sorted(r["id"] for r in rows) == list(range(1, 1000, 2))
    assert all(r["doubled"] == 2 * r["id"] and r["payload"] == f"row-{r['id']}" and r["_gs_op"] == "i"
               for r in rows)
    journal = _journal(tmp_path)
    epochs = sorted({e["epoch"] for e in journal if e["hook"] == "source_finalized"})
    assert epochs == [0, 1, 2, 3]
    assert [e["end"] for e in journal if e["hook"] == "source_finalized"] == [250, 500, 750, 1000]
    for epoch in epochs:
        order = [e["hook"] for e in journal if e.get("epoch") == epoch]
        # two writers flushed the epoch, then the source saw it flushed; finalized after Spark's commit
        assert order[:3] == ["sink_flushed", "sink_flushed", "source_flushed"], order
        assert sorted(order[3:]) == ["sink_finalized", "source_finalized"], order
    assert {e["partition"] for e in journal if e["hook"] == "sink_flushed"} == {0, 1}
    assert [e["key"] for e in journal if e["hook"] == "sink_open"] == [["id"]]


def test_a_transient_plugin_failure_is_retried_by_the_flow(runner: Runner, tmp_path: Path) -> None:
    run = runner.run(_pipeline(tmp_path, rows=500, extra="fail_times: 2"),
                     retry={"initial_backoff_ms": 10, "max_backoff_ms": 20, "max_attempts": 5})
    assert run.runners[0].failure is None
    assert (tmp_path / "failures").read_text() == "xx"
    assert sorted(r["id"] for r in _written(tmp_path)) == list(range(1, 500, 2))


def test_a_failing_plugin_stops_the_flow_naming_plugin_and_node(runner: Runner, tmp_path: Path) -> None:
    with pytest.raises(StreamlingError) as info:
        runner.run(_pipeline(tmp_path, rows=1000, extra="poison: 600"))
    err = info.value
    assert err.node == "doubled"
    assert err.headline().startswith(
        "journal.flaky transform 'doubled': process_batch() failed: ValueError: cannot handle id 600")
    assert not err.retriable
    # epochs before the poison batch were written; the failing one (500..749) was not
    assert max(r["id"] for r in _written(tmp_path)) == 499


def test_plugin_nodes_preview_and_debug_in_a_notebook_like_built_ins(spark: Any, tmp_path: Path) -> None:
    from streamling.notebook.session import NotebookPipeline

    nb = NotebookPipeline(application_id="nb_plugins", cwd=tmp_path, spark=spark)
    nb.define("source", "rnd", {"type": "basic_plugin.random_source", "max_rows": 3000, "record_batch_size": 500})
    nb.define("transform", "inserts", {"type": "basic_plugin.filter_transform", "from": ["rnd"], "_gs_op": "i"})
    nb.define("transform", "masked", {"type": "sql", "from": ["inserts"],
                                      "sql": "SELECT alphanumeric_field, mask_email(alphanumeric_field || '@x.io') "
                                             "AS mail, num_field, _gs_op FROM inserts WHERE num_field > 500"})
    nb.define("sink", "out", {"type": "blackhole", "from": ["masked"]})
    first = nb.preview("inserts")
    assert first.inputs["rnd"].num_rows == 500  # the plugin source's first epoch
    assert first.output is not None and first.output.equals(first.inputs["rnd"])  # all inserts
    preview = nb.preview("masked", rows=5)
    source_rows = preview.inputs["inserts"]
    out = preview.output
    assert out is not None and out.column_names == ["alphanumeric_field", "mail", "num_field", "_gs_op"]
    assert out.column("alphanumeric_field").to_pylist() == [
        r["alphanumeric_field"] for r in source_rows.to_pylist() if r["num_field"] > 500]
    assert all(m == a[0] + "***@x.io" for a, m in zip(out.column("alphanumeric_field").to_pylist(),
                                                       out.column("mail").to_pylist(), strict=True))

    nb.preview("inserts")
    nb.define("transform", "inserts", {"type": "basic_plugin.filter_transform", "from": ["rnd"], "_gs_op": "u"})
    result = nb.debug("inserts")
    assert result.before is not None and result.before.num_rows == 500
    assert result.after.num_rows == 0  # every generated row is an insert
    assert result.changes()["rows_removed"] == 500


def test_a_side_output_sees_every_source_batch_before_the_epoch_commits(runner: Runner, tmp_path: Path) -> None:
    counts = tmp_path / "counts.jsonl"
    run = runner.run(_pipeline(tmp_path, rows=1000),
                     plugin={"side_output_ids": ["basic_plugin.row_counter"],
                             "side_output_options": {"basic_plugin.row_counter": {"path": str(counts)}}})
    assert run.runners[0].failure is None
    seen = [json.loads(line) for line in counts.read_text().splitlines()]
    assert {s["source"] for s in seen} == {"counter"}
    assert sum(s["rows"] for s in seen) == 1000  # each epoch's source rows, once
    assert sorted(r["id"] for r in _written(tmp_path)) == list(range(1, 1000, 2))


def test_a_partitioned_plugin_source_is_read_in_parallel_one_instance_per_partition(
        runner: Runner, tmp_path: Path) -> None:
    pipeline = f"""
    sources:
      counter:
        type: journal.counter
        dir: {tmp_path}
        options: {{rows: 300, batch: 20, partitions: 3}}
    sinks:
      out: {{type: journal.files, from: counter, dir: {tmp_path}}}
    """
    run = runner.pipeline(pipeline)
    run.start()
    try:  # stopped after its second epoch: the next run in this process resumes every partition
        deadline = time.monotonic() + 120
        while not [e for e in _journal(tmp_path) if e["hook"] == "source_finalized"][1:] \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        run.request_stop("test")
        run.wait(60)
    finally:
        run.stop("test")
    stopped = [e["end"] for e in _journal(tmp_path) if e["hook"] == "source_finalized"][-1]
    assert len(stopped) == 3 and 0 < sum(stopped) < 300  # one offset per partition
    runner.run(pipeline)
    assert sorted(r["id"] for r in _written(tmp_path)) == list(range(300))  # every row once, across both runs
    journal = _journal(tmp_path)
    reads = [e for e in journal if e["hook"] == "read_between"]
    assert {e["partition"] for e in reads} == {0, 1, 2} and {e["role"] for e in reads} == {"executor"}
    # each epoch's partitions read by tasks of their own, written by a sink writer each
    flushed = [e for e in journal if e["hook"] == "sink_flushed" and e["epoch"] == 0]
    assert sorted(e["partition"] for e in flushed) == [0, 1, 2] and all(e["rows"] == 20 for e in flushed)
    assert [e["end"] for e in journal if e["hook"] == "source_finalized"][-1] == [100, 100, 100]


def test_a_partitioned_plugin_source_without_latest_offset_is_refused_before_it_runs(runner: Runner) -> None:
    from streamling.plugins import SourcePlugin, source

    @source("journal.no_plan")
    class NoPlan(SourcePlugin[Any]):
        @classmethod
        def preferred_partitions(cls, options: Any) -> int:
            return 2

        def output_schema(self) -> pa.Schema:
            return pa.schema([("id", pa.int64())])

        def read(self, start: Any) -> tuple[pa.RecordBatch | None, Any]:
            return None, start

    with pytest.raises(StreamlingError) as info:
        runner.pipeline("""
            sources: {s: {type: journal.no_plan}}
            sinks: {out: {type: blackhole, from: s}}
        """)
    assert "declares 2 partitions but does not define latest_offset()" in info.value.headline()


def test_a_partitioned_source_whose_partition_count_changed_under_its_checkpoint_stops_with_both_counts(
        runner: Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamling.plugins.registry import find

    pipeline = f"""
    sources:
      counter: {{type: journal.counter, dir: {tmp_path}, options: {{rows: 60, batch: 20, partitions: 3}}}}
    sinks:
      out: {{type: blackhole, from: counter}}
    """
    runner.run(pipeline, application_id="repartitioned")
    # a new version of the plugin declares another count for the same options
    info_ = find("source", "journal.counter")
    assert info_ is not None
    counter = info_.cls
    monkeypatch.setattr(counter, "preferred_partitions", classmethod(lambda cls, options: 2))
    with pytest.raises(StreamlingError) as info:
        runner.run(pipeline, application_id="repartitioned")
    assert "the checkpoint holds offsets of 3 partition(s), but the source now reads 2" in str(info.value)


def _sink_pipeline(directory: Path, extra: str = "") -> str:
    return f"""
    sources:
      counter:
        type: journal.counter
        dir: {directory}
        options: {{rows: 750, batch: 250}}
    sinks:
      out:
        type: journal.files
        from: counter
        parallelism: 2
        dir: {directory}
        {extra}
    """


def test_a_plugin_sink_keeps_its_instances_across_epochs_in_a_worker_and_a_new_run_gets_new_ones(
        runner: Runner, tmp_path: Path) -> None:
    pipeline = _sink_pipeline(tmp_path)
    run = runner.run(pipeline)
    assert run.runners[0].failure is None
    first = _journal(tmp_path)
    flushed = [e for e in first if e["hook"] == "sink_flushed"]
    # on_epoch_flushed on every partition's instance, every epoch
    assert sorted((e["epoch"], e["partition"]) for e in flushed) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    created = {e["instance"]: e for e in first if e["hook"] == "sink_created" and e["role"] == "executor"}
    # at most one construction per partition and worker: a worker's later epochs of a partition reuse
    # it (which worker gets a task is Spark's choice: a session with many idle workers may give every
    # epoch's task to another one; the cache's unit tests show the reuse itself deterministically)
    assert len({(e["partition"], e["pid"]) for e in created.values()}) == len(created) <= len(flushed)
    for e in flushed:
        assert (created[e["instance"]]["partition"], created[e["instance"]]["pid"]) == (e["partition"], e["pid"])
    assert not [e for e in first if e["hook"] == "sink_closed" and e["role"] == "executor"]
    assert len({e["token"] for e in flushed}) == 1

    # another checkpoint, so another sink token: instances of its own, none of the first run's
    assert runner.run(pipeline, application_id="second_app").runners[0].failure is None
    again = [e for e in _journal(tmp_path)[len(first):] if e["hook"] == "sink_flushed"]
    assert len(again) == 6 and {e["token"] for e in again}.isdisjoint({e["token"] for e in flushed})
    assert {e["instance"] for e in again}.isdisjoint(created)


def test_a_plugin_sink_instance_whose_write_failed_is_closed_and_the_retry_builds_a_fresh_one(
        runner: Runner, tmp_path: Path) -> None:
    run = runner.run(_sink_pipeline(tmp_path, "options: {fail_epoch: 1, fail_times: 1}"),
                     retry={"initial_backoff_ms": 10, "max_backoff_ms": 20, "max_attempts": 5})
    assert run.runners[0].failure is None
    assert sorted(r["id"] for r in _written(tmp_path)) == list(range(750))
    journal = _journal(tmp_path)
    [failed] = [i for i, e in enumerate(journal) if e["hook"] == "sink_failed"]
    broken, partition = journal[failed]["instance"], journal[failed]["partition"]
    # closed at once, and never used again
    assert [e["hook"] for e in journal[failed + 1:] if e.get("instance") == broken] == ["sink_closed"]
    retried = [e for e in journal[failed:] if e["hook"] == "sink_flushed" and e["partition"] == partition]
    assert [e["epoch"] for e in retried] == [1, 2]
    fresh = retried[0]["instance"]
    assert fresh != broken
    # the retry ran either in the failed worker, which built a new instance, or in a worker with one of its own
    [made] = [i for i, e in enumerate(journal) if e["hook"] == "sink_created" and e["instance"] == fresh]
    assert made > failed or journal[made]["pid"] != journal[failed]["pid"]
    assert {(e["epoch"], e["partition"]) for e in journal if e["hook"] == "sink_flushed"} == {
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)}
