"""Epoch-level behaviour: one clock per epoch, sampled rows, retried sinks, job mode, the plan."""

from __future__ import annotations

import os
from typing import Any

import pytest

from streamling.errors import StreamlingError
from streamling.runtime import events as ev
from streamling.runtime.nodes import Epoch, Sink
from streamling.runtime.planner import build_plan
from streamling.sources.generate import generate_batch
from streamling.spec import nodes as spec_nodes
from streamling.spec import parse_pipeline
from streamling.transforms.arrow import ArrowTransform

pytestmark = pytest.mark.spark


class FlakySinkOptions(spec_nodes.FromNodeOptions):
    type: str = "flaky"


class FlakySink(Sink):
    """Refuses the first two writes of each epoch like a restarting database, then keeps rows."""

    seen: list[tuple[int, list[Any]]] = []
    failures: dict[int, int] = {}

    def write(self, df: Any, epoch: Epoch) -> int:
        count = FlakySink.failures.get(epoch.epoch_id, 0)
        if count < 2:
            FlakySink.failures[epoch.epoch_id] = count + 1
            raise ConnectionRefusedError("connection refused (simulated restart)")
        rows = [r.asDict() for r in df.collect()]
        FlakySink.seen.append((epoch.epoch_id, rows))
        return len(rows)


@pytest.fixture
def flaky_sink(monkeypatch: pytest.MonkeyPatch) -> type[FlakySink]:
    FlakySink.seen, FlakySink.failures = [], {}
    node_type = spec_nodes.NodeType("sink", "flaky", FlakySinkOptions, f"{__name__}:FlakySink")
    monkeypatch.setitem(spec_nodes.REGISTRY["sink"], "flaky", node_type)
    return FlakySink


def test_every_sink_of_an_epoch_sees_the_same_now(runner, flaky_sink):
    runner.run("""
        sources:
          s: {type: generate, rows: 4, rows_per_batch: 2}
        transforms:
          stamped: {type: sql, sql: "SELECT id, now() AS t1, current_timestamp() AS t2 FROM s"}
        sinks:
          one: {type: flaky, from: stamped}
          two: {type: flaky, from: stamped}
    """, retry={"max_attempts": 5, "initial_backoff_ms": 10, "max_backoff_ms": 20})
    by_epoch: dict[int, set[Any]] = {}
    for epoch, rows in flaky_sink.seen:
        for row in rows:
            assert row["t1"] == row["t2"]
            by_epoch.setdefault(epoch, set()).add(row["t1"])
    assert sorted(by_epoch) == [0, 1]
    assert all(len(stamps) == 1 for stamps in by_epoch.values())  # one instant per epoch, across both sinks
    retries = [e for e in runner.of_type(ev.PipelineError) if e.retriable]
    assert len(retries) >= 2 and retries[0].node in ("one", "two")


def test_retries_run_out_with_a_clear_error(runner, flaky_sink):
    with pytest.raises(StreamlingError) as info:
        runner.run("""
            sources:
              s: {type: generate, rows: 2}
            sinks:
              db: {type: flaky, from: s}
        """, retry={"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 10})
    assert info.value.headline().startswith("flaky sink 'db': writing epoch 0 failed: connection refused")


class ReadThenFailSink(FlakySink):
    """Reads the whole batch (so Spark scans the source) before failing twice per epoch."""

    def write(self, df: Any, epoch: Epoch) -> int:
        rows = [r.asDict() for r in df.collect()]
        count = FlakySink.failures.get(epoch.epoch_id, 0)
        if count < 2:
            FlakySink.failures[epoch.epoch_id] = count + 1
            raise ConnectionRefusedError("connection refused (simulated restart)")
        FlakySink.seen.append((epoch.epoch_id, rows))
        return len(rows)


def test_a_retried_epoch_reports_its_input_rows_once(runner, flaky_sink, monkeypatch):
    """Three attempts of an epoch re-run its plan; its finalized input rows stay the epoch's rows."""
    node_type = spec_nodes.NodeType("sink", "flaky", FlakySinkOptions, f"{__name__}:ReadThenFailSink")
    monkeypatch.setitem(spec_nodes.REGISTRY["sink"], "flaky", node_type)
    runner.run("""
        sources:
          s: {type: generate, rows: 300, rows_per_batch: 100}
        transforms:
          even: {type: sql, sql: "SELECT id FROM s WHERE id % 2 = 0"}
        sinks:
          db: {type: flaky, from: even}
    """, retry={"max_attempts": 5, "initial_backoff_ms": 10, "max_backoff_ms": 20})
    assert sorted(flaky_sink.failures.items()) == [(0, 2), (1, 2), (2, 2)]  # every epoch ran three times
    assert [len(rows) for _, rows in sorted(flaky_sink.seen)] == [50, 50, 50]
    finalized = {e.epoch: e.input_rows for e in runner.of_type(ev.EpochFinalized)}
    assert finalized == {0: 100, 1: 100, 2: 100}


def test_sampled_rows_per_node_when_sampling_is_on(runner):
    run = runner.pipeline("""
        sources:
          s: {type: generate, rows: 100, rows_per_batch: 100}
        transforms:
          even: {type: sql, sql: "SELECT id FROM s WHERE id % 2 = 0"}
        sinks:
          out: {type: blackhole, from: even}
    """)
    run.bus.sample_rows = 3
    run.start()
    try:
        run.wait(timeout_secs=120)
    finally:
        run.stop()
    samples = {e.node: e for e in runner.of_type(ev.RowsSampled)}
    assert samples["s"].columns[0] == "id" and len(samples["s"].rows) == 3
    assert samples["even"].columns == ["id", "_gs_op"]
    assert all(r["id"] % 2 == 0 for r in samples["even"].rows)


def test_job_mode_rejects_unbounded_sources(runner):
    spec = parse_pipeline("""
sources:
  live: {type: generate, rows_per_second: 10}
  files: {type: generate, rows: 10}
transforms:
  both: {type: sql, sql: "SELECT * FROM live UNION ALL SELECT * FROM files"}
sinks:
  out: {type: blackhole, from: both}
""")
    with pytest.raises(StreamlingError) as info:
        build_plan(spec, runner.settings(job_mode=True))
    assert 'job_mode is on but sources ["live"] do not support it' in info.value.headline()


def test_plan_describes_flows_keys_and_schemas(runner):
    run = runner.pipeline("""
        sources:
          a: {type: generate, rows: 1, primary_key: id}
          b: {type: generate, rows: 1}
        transforms:
          slim: {type: sql, sql: "SELECT id, amount FROM a"}
        sinks:
          x: {type: blackhole, from: slim}
          y: {type: print, from: b}
    """)
    plan = run.analyze().describe()
    assert [(f["name"], f["sinks"], f["bounded"]) for f in plan["flows"]] == [("a", ["x"], True), ("b", ["y"], True)]
    assert plan["nodes"]["x"]["primary_key"] == ["id"]  # inherited through the transform
    assert plan["nodes"]["slim"]["schema"] == ["id bigint", "amount double", "_gs_op string"]


class UpperOptions(spec_nodes.FromNodeOptions):
    type: str = "upper"
    column: str


def _upper_batches(column: str, node: str):  # type: ignore[no-untyped-def]
    def run(batches):  # type: ignore[no-untyped-def]
        import pyarrow.compute as pc

        from streamling.errors import NodeFailure

        for batch in batches:
            values = batch.column(column)
            if pc.any(pc.equal(values, "BOOM")).as_py():
                raise NodeFailure(node, "upper transform", "refuses the value BOOM", hint="remove it upstream")
            flaky = [v for v in values.to_pylist() if v and v.startswith("FLAKY:")]
            if flaky and not os.path.exists(flaky[0][6:]):  # the first attempt only: its server was away
                open(flaky[0][6:], "w").close()
                raise NodeFailure(node, "upper transform", "its service did not answer", retriable=True)
            yield batch.set_column(batch.schema.get_field_index(column), column, pc.utf8_upper(values))

    return run


class UpperTransform(ArrowTransform):
    """Upper-cases one column, a whole Arrow batch at a time."""

    def output_schema(self, input_schema: Any) -> Any:
        return input_schema

    def batch_function(self, input_schema: Any, epoch: Epoch | None) -> Any:
        return _upper_batches(self.options.column, self.name)  # type: ignore[attr-defined]


@pytest.fixture
def upper_transform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(spec_nodes.REGISTRY["transform"], "upper",
                        spec_nodes.NodeType("transform", "upper", UpperOptions, f"{__name__}:UpperTransform"))


def test_arrow_transforms_run_on_whole_batches_and_name_themselves_on_failure(runner, upper_transform, capsys):
    runner.run("""
        sources:
          s: {type: generate, rows: 3}
        transforms:
          loud: {type: upper, from: s, column: customer}
        sinks:
          out: {type: print, from: loud}
    """)
    lines = capsys.readouterr().out.splitlines()
    expected = [c.upper() for c in generate_batch("orders", 0, 3, 0, 0).column("customer").to_pylist()]
    assert [line.split('"customer":"')[1].split('"')[0] for line in lines] == expected
    assert expected[0] == "CUSTOMER-0000"

    with pytest.raises(StreamlingError) as info:
        runner.run("""
            sources:
              words: {type: generate, rows: 3}
            transforms:
              boom: {type: sql, sql: "SELECT id, 'BOOM' AS word FROM words"}
              loud: {type: upper, from: boom, column: word}
            sinks:
              out: {type: blackhole, from: loud}
        """)
    assert info.value.headline() == "upper transform 'loud': refuses the value BOOM — remove it upstream"


def test_a_transient_failure_raised_on_an_executor_is_retried_by_the_flow(runner, upper_transform, capsys, tmp_path):
    marker = tmp_path / "first-attempt-failed"
    runner.run(f"""
        sources:
          words: {{type: generate, rows: 3}}
        transforms:
          flaky: {{type: sql, sql: "SELECT id, 'FLAKY:{marker}' AS word FROM words"}}
          loud: {{type: upper, from: flaky, column: word}}
        sinks:
          out: {{type: print, from: loud}}
    """, retry={"initial_backoff_ms": 10})
    assert marker.exists()
    assert len([line for line in capsys.readouterr().out.splitlines() if '"word":"FLAKY:' in line]) == 3
    retried = [e for e in runner.of_type(ev.PipelineError) if e.retriable]
    assert [(e.node, e.message, e.attempt) for e in retried] == [
        ("loud", "upper transform 'loud': its service did not answer", 1)]


def _amounts(epoch: int) -> list[float]:
    """The ``amount`` column of a 1,000-row epoch of the default generate source."""
    return generate_batch("orders", 1000 * epoch, 1000 * (epoch + 1), 0, 0).column("amount").to_pylist()


def test_node_rows_are_exact_while_only_row_changing_nodes_are_observed(runner, spark):
    """Each node's count per epoch is exact; a projection shares its input's count instead of adding a
    Spark observation to the plan (each one splits Spark's generated code), a filter is observed."""
    yaml_text = """
        sources:
          orders: {type: generate, rows: 3000, rows_per_batch: 1000}
        transforms:
          proj: {type: sql, sql: "SELECT id, amount * 2 AS twice, _gs_op FROM orders"}
          big: {type: sql, sql: "SELECT id, twice FROM proj WHERE twice > 1500"}
        sinks:
          all: {type: blackhole, from: proj}
          some: {type: blackhole, from: big}
    """
    runner.run(yaml_text)
    flushed = runner.of_type(ev.EpochFlushed)
    assert [e.epoch for e in flushed] == [0, 1, 2]
    for e in flushed:
        big = sum(1 for a in _amounts(e.epoch) if a * 2 > 1500)
        assert 0 < big < 1000
        assert e.node_rows == {"orders": 1000, "proj": 1000, "big": big}
        assert e.rows == {"all": 1000, "some": big}

    from streamling.runtime.epoch_dag import evaluate
    from streamling.runtime.observe import EpochObservations

    run = runner.pipeline(yaml_text)
    plan = run.analyze()
    flow = plan.flows[0]
    [source] = plan.sources(flow)
    raw = {"orders": spark.createDataFrame(generate_batch("orders", 0, 10, 0, 0).to_pandas())}
    watch = EpochObservations()
    evaluate(plan, flow, spark, raw, None, watch=watch)
    assert set(watch.observations) == {"orders#input", "big"}
    assert watch.same_rows == {"orders": "orders#input", "proj": "orders"}


def test_a_single_sink_reading_once_takes_the_input_count_from_sparks_scan(runner, caplog):
    """One source, one blackhole: the input is not observed, Spark's scan metric counts it exactly."""
    caplog.set_level("INFO", logger="streamling.runtime.flow")
    runner.run("""
        sources:
          orders: {type: generate, rows: 2000, rows_per_batch: 1000}
        transforms:
          big: {type: sql, sql: "SELECT id, amount FROM orders WHERE amount > 750"}
        sinks:
          some: {type: blackhole, from: big}
    """)
    flushed = runner.of_type(ev.EpochFlushed)
    assert [e.epoch for e in flushed] == [0, 1]
    for e in flushed:
        big = sum(1 for a in _amounts(e.epoch) if a > 750)
        assert e.node_rows == {"orders": 1000, "big": big}
        assert e.rows == {"some": big}
    assert [e.input_rows for e in runner.of_type(ev.EpochFinalized)] == [1000, 1000]
    assert "scan metric is not available" not in caplog.text


@pytest.mark.parametrize("native", [True, False], ids=["jvm-drain", "noop-writer"])
def test_a_filter_read_by_a_blackhole_alone_is_counted_by_the_write(runner, monkeypatch, native):
    """The filter is not observed (an observation splits Spark's generated code): the blackhole's one
    job counts what it discards — streamling's JVM drain, or Spark's no-op writer with the sink's own
    count where those classes are missing — and that is the filter's count. A sink whose expectations
    drop rows receives fewer than the filter gave, so that filter is observed again."""
    from streamling.runtime import observe
    from streamling.sinks.blackhole import BlackholeSink

    watched: list[str] = []
    real = observe.EpochObservations.watch

    def spy(self: Any, node: str, df: Any, extra: Any = None) -> Any:
        watched.append(node)
        return real(self, node, df, extra)

    monkeypatch.setattr(observe.EpochObservations, "watch", spy)
    if not native:
        monkeypatch.setattr(BlackholeSink, "_native", False)
    pipeline = """
        sources:
          orders: {type: generate, rows: 2000, rows_per_batch: 1000}
        transforms:
          big: {type: sql, sql: "SELECT id, amount FROM orders WHERE amount > 750"}
        sinks:
          kept: {type: blackhole, from: big%s}
    """
    runner.run(pipeline % "")
    big = [sum(1 for a in _amounts(epoch) if a > 750) for epoch in (0, 1)]
    assert [(e.node_rows, e.rows) for e in runner.of_type(ev.EpochFlushed)] == [
        ({"orders": 1000, "big": n}, {"kept": n}) for n in big]
    assert "big" not in watched
    assert watched == ([] if native else ["df", "df"])  # the fallback's count is the sink's own

    runner.events.clear()
    watched.clear()
    runner.run(pipeline % ", expectations: [{name: small, condition: amount < 950, on_violation: drop}]",
               application_id="epochs_blackhole_expectations")
    small = [sum(1 for a in _amounts(epoch) if 750 < a < 950) for epoch in (0, 1)]
    assert [(e.node_rows["big"], e.rows) for e in runner.of_type(ev.EpochFlushed)] == [
        (n, {"kept": m}) for n, m in zip(big, small, strict=True)]
    assert watched.count("big") == 2


def test_print_and_delta_sinks_report_exact_node_and_input_rows(runner, tmp_path, capsys):
    """The README's shape: a print sink (read on the driver) and a Delta sink fed by one filter. The
    print sink's read once reported every node's count as 0 (its local iterator's execution reports
    observations before its jobs run), and so did the CLI's "finalized (N input rows)"."""
    runner.run(f"""
        sources:
          orders: {{type: generate, rows: 2000, rows_per_batch: 1000, primary_key: id}}
        transforms:
          big: {{type: sql, sql: "SELECT id, amount FROM orders WHERE amount > 900"}}
        sinks:
          console: {{type: print, from: big}}
          lake: {{type: delta, from: big, path: "{tmp_path / 'lake'}"}}
    """)
    flushed = runner.of_type(ev.EpochFlushed)
    assert [e.epoch for e in flushed] == [0, 1]
    big = [sum(1 for a in _amounts(e.epoch) if a > 900) for e in flushed]
    assert [(e.epoch, e.node_rows, e.rows) for e in flushed] == [
        (i, {"orders": 1000, "big": n}, {"console": n, "lake": n}) for i, n in enumerate(big)]
    assert [e.input_rows for e in runner.of_type(ev.EpochFinalized)] == [1000, 1000]
    assert len(capsys.readouterr().out.splitlines()) == sum(e.rows["console"] for e in flushed)
