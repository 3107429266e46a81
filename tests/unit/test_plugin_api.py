"""Plugins without Spark: discovery, options, validation messages, preprocessors, UDFs in SQL
validation, ``streamling plugins``, and the testing kit on the example plugins."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from basic_plugin import EnvSubstitute, FilterTransform, PrintSink, RandomSource

from streamling.config import load_settings
from streamling.errors import StreamlingError, ValidationError
from streamling.plugins import SourcePlugin, TransformPlugin, source, transform
from streamling.plugins.discovery import load_plugins
from streamling.plugins.host import preprocess
from streamling.plugins.registry import ids
from streamling.plugins.testing import SinkRunner, SourceRunner, TransformRunner, with_ops
from streamling.spec import parse_pipeline

PIPELINE = """
sources:
  rnd:
    type: basic_plugin.random_source
    options: {{max_rows: "10000", record_batch_size: "1000"}}
    {extra}
transforms:
  big:
    type: sql
    primary_key: alphanumeric_field
    sql: SELECT * FROM rnd WHERE num_field > 100
sinks:
  out: {{type: basic_plugin.print_sink, from: big, mode: batch}}
"""


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    """Plugins a test registers or fails to load do not leak into other tests' messages."""
    from streamling.plugins import discovery, registry
    from streamling.spec.nodes import REGISTRY

    load_plugins()  # the installed plugins belong to the snapshot, whichever test runs first
    saved = (dict(registry.PLUGINS), dict(registry.UDFS), {k: dict(v) for k, v in REGISTRY.items()},
             list(discovery.FAILURES))
    yield
    registry.PLUGINS.clear()
    registry.PLUGINS.update(saved[0])
    registry.UDFS.clear()
    registry.UDFS.update(saved[1])
    for kind, types in saved[2].items():
        REGISTRY[kind].clear()
        REGISTRY[kind].update(types)
    discovery.FAILURES[:] = saved[3]


def _problems(text: str) -> list[str]:
    with pytest.raises(ValidationError) as info:
        parse_pipeline(textwrap.dedent(text))
    return [p.headline() for p in info.value.problems]


def test_installed_plugins_are_node_types_with_typed_options() -> None:
    spec = parse_pipeline(PIPELINE.format(extra=""))
    options = spec.nodes["rnd"].options.plugin_options  # type: ignore[attr-defined]
    assert (options.max_rows, options.record_batch_size) == (10_000, 1000)
    assert spec.nodes["out"].options.plugin_options.mode == "batch"  # type: ignore[attr-defined]


def test_flattened_keys_win_over_options_and_the_environment_wins_over_both(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_pipeline(PIPELINE.format(extra="record_batch_size: 50"))
    assert spec.nodes["rnd"].options.plugin_options.record_batch_size == 50  # type: ignore[attr-defined]
    monkeypatch.setenv("STREAMLING__PLUGIN__BASIC_PLUGIN_RANDOM_SOURCE__RECORD_BATCH_SIZE", "7")
    spec = parse_pipeline(PIPELINE.format(extra="record_batch_size: 50"))
    assert spec.nodes["rnd"].options.plugin_options.record_batch_size == 7  # type: ignore[attr-defined]
    # the same variable is a known config key, not an unknown section
    assert load_settings(environ=dict(__import__("os").environ)).plugin.preprocessor_ids == []


def test_bad_plugin_options_fail_validation_on_the_node() -> None:
    problems = _problems(PIPELINE.format(extra="record_batch_size: lots\n    colour: red"))
    assert len(problems) == 1
    assert problems[0].startswith("basic_plugin.random_source source 'rnd': plugin 'basic_plugin.random_source': ")
    assert "option 'record_batch_size': Input should be a valid integer" in problems[0]
    assert "option 'colour': Extra inputs are not permitted" in problems[0]


def test_an_unknown_plugin_is_not_available_and_built_ins_still_work() -> None:
    problems = _problems(PIPELINE.format(extra="").replace("basic_plugin.random_source", "acme_api.orders_source"))
    installed = ids("source")  # the example plugins, and any plugin file a test loaded earlier
    assert {"basic_plugin.random_source", "postgres_cdc_source"} <= set(installed)
    assert problems == ["source 'rnd': source type 'acme_api.orders_source' is not available: no installed plugin "
                        f"provides it (installed source plugins: {', '.join(installed)}) [sources.rnd.type (line 4)]"]


def test_plugins_load_from_a_plugin_path_and_a_broken_one_is_reported(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(textwrap.dedent("""
        import pyarrow as pa
        from streamling.plugins import TransformPlugin, transform

        @transform("pathtest.identity")
        class Identity(TransformPlugin):
            def process_batch(self, batch):
                return batch
    """))
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    failures = load_plugins(str(tmp_path))
    assert [(Path(f.origin).name, f.message) for f in failures] == [
        ("broken.py", "ModuleNotFoundError: No module named 'no_such_module_here'")]
    spec = parse_pipeline(textwrap.dedent("""
        sources: {rnd: {type: basic_plugin.random_source, max_rows: 10}}
        transforms: {same: {type: pathtest.identity, from: rnd}}
        sinks: {out: {type: blackhole, from: same}}
    """))
    assert spec.nodes["same"].type == "pathtest.identity"
    # a later, unrelated unknown type says which plugin failed to load
    problems = _problems(PIPELINE.format(extra="").replace("basic_plugin.print_sink", "broken.sink"))
    assert "broken.py failed to load: ModuleNotFoundError" in problems[0]


def test_a_preprocessor_rewrites_the_pipeline_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROWS", "30")
    settings = load_settings(environ={}, overrides={"plugin": {"preprocessor_ids": "basic_plugin.env_substitute"}})
    text = preprocess(PIPELINE.format(extra="").replace('"10000"', "${ROWS}").replace("100", "${MIN:-5}"), settings)
    spec = parse_pipeline(text)
    assert spec.nodes["rnd"].options.plugin_options.max_rows == 30  # type: ignore[attr-defined]
    assert "num_field > 5" in spec.nodes["big"].options.sql  # type: ignore[attr-defined]
    with pytest.raises(StreamlingError) as info:
        preprocess("x: ${NOPE_NOT_SET}", settings)
    assert info.value.headline().startswith(
        "preprocessor plugin 'basic_plugin.env_substitute': preprocessing the pipeline failed: KeyError: "
        "'environment variable NOPE_NOT_SET is not set")
    unknown = load_settings(environ={}, overrides={"plugin": {"preprocessor_ids": ["acme.nope"]}})
    with pytest.raises(StreamlingError, match="preprocessor plugin 'acme.nope' is not available; known: "
                                              "basic_plugin.env_substitute"):
        preprocess("", unknown)


def test_plugin_udfs_are_sql_functions_validation_knows() -> None:
    parse_pipeline(PIPELINE.format(extra="").replace("SELECT *", "SELECT *, mask_email(alphanumeric_field) AS m"))
    problems = _problems(PIPELINE.format(extra="").replace("SELECT *", "SELECT *, mask_emial(alphanumeric_field) AS m"))
    assert "unknown function mask_emial() (did you mean 'mask_email'" in problems[0]
    problems = _problems(PIPELINE.format(extra="").replace("SELECT *", "SELECT *, mask_email() AS m"))
    assert "mask_email takes 1 arguments, found 0" in problems[0]


def test_streamling_plugins_lists_what_is_installed() -> None:
    out = subprocess.run([sys.executable, "-m", "streamling.cli", "plugins", "--json"], capture_output=True,
                         text=True, timeout=60, check=True)
    listed = {(p["kind"], p["id"]): p["from"] for p in json.loads(out.stdout)["plugins"]}
    assert listed[("source", "basic_plugin.random_source")] == "streamling-basic-plugin"
    assert {k for k, _ in listed} >= {"source", "transform", "sink", "preprocessor", "side_output", "udf"}


def test_testing_kit_replays_an_unfinished_epoch_identically_after_a_crash() -> None:
    runner = SourceRunner(RandomSource, {"max_rows": 2500, "record_batch_size": 1000})
    runner.epoch()
    in_flight = runner.epoch(finalize=False)
    runner.crash()
    runner.restart()
    assert runner.batches[-1].equals(in_flight)  # the replay is the same rows
    assert runner.committed == 2000
    assert runner.run() == 1
    assert runner.table().num_rows == 3500  # epoch 1 delivered twice: at-least-once
    assert len(set(runner.table().column("alphanumeric_field").to_pylist())) == 2500
    assert [c for c in runner.calls if c[0] in ("flushed", "finalized", "read_between")][:5] == [
        ("flushed", 0), ("finalized", 0), ("flushed", 1), ("read_between", 1), ("flushed", 1)]


def test_testing_kit_plans_a_partitioned_source_per_partition_and_replays_each_partition() -> None:
    @source("test.squares")
    class Squares(SourcePlugin[Any]):
        """Partition p of 3 yields the squares of 3k + p, k < 4; two rows per epoch and partition."""

        @classmethod
        def preferred_partitions(cls, options: Any) -> int:
            return 3

        def output_schema(self) -> pa.Schema:
            return pa.schema([("n", pa.int64()), ("square", pa.int64())])

        def initial_offset(self) -> int:
            return 0

        def latest_offset(self, start: int) -> int:
            return min(start + 2, 4)

        def read_between(self, start: int, end: int) -> pa.RecordBatch:
            n = [3 * k + self.ctx.partition for k in range(start, end)]
            return pa.RecordBatch.from_pydict({"n": n, "square": [i * i for i in n]}, schema=self.output_schema())

    runner = SourceRunner(Squares)
    first = runner.epoch()
    assert first is not None and sorted(first.column("n").to_pylist()) == [0, 1, 2, 3, 4, 5]
    assert runner.committed == [2, 2, 2]  # one offset per partition
    in_flight = runner.epoch(finalize=False)
    runner.crash()
    runner.restart()
    assert runner.batches[-1].equals(in_flight) and runner.committed == [4, 4, 4]
    assert runner.run() == 0
    assert sorted(runner.table().column("n").to_pylist()) == sorted([*range(12), *range(6, 12)])  # epoch 1 twice
    assert runner.calls.count(("read_between", 1)) == 6  # three partitions, read twice


def test_testing_kit_runs_transforms_and_sinks_per_partition(capsys: pytest.CaptureFixture[str]) -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "_gs_op": ["i", "u", "i"]})
    kept = TransformRunner(FilterTransform, {"_gs_op": "i"}, batch.schema).process([batch])
    assert kept.column("id").to_pylist() == [1, 3]
    sink = SinkRunner(PrintSink, {"mode": "row"}, batch.schema, primary_key=["id"])
    assert sink.write_epoch([[batch.slice(0, 2)], [batch.slice(2)]]) == 3
    assert sink.calls == [("flushed", 0, 0), ("flushed", 0, 1), ("finalized", 0, -1)]
    assert capsys.readouterr().out.splitlines() == ['{"_gs_op": "i", "id": 1}', '{"_gs_op": "u", "id": 2}',
                                                    '{"_gs_op": "i", "id": 3}']
    assert with_ops(pa.RecordBatch.from_pydict({"id": [1]})).column("_gs_op").to_pylist() == ["i"]
    assert EnvSubstitute.plugin_id == "basic_plugin.env_substitute"


def test_the_runtime_checks_what_plugins_return() -> None:
    @source("unittest.bad_ops")
    class BadOps(SourcePlugin):
        def output_schema(self) -> pa.Schema:
            return pa.schema([("id", pa.int64()), ("_gs_op", pa.string())])

        def read(self, start: int | None) -> tuple[pa.RecordBatch, int]:
            return pa.RecordBatch.from_pydict({"id": [1], "_gs_op": ["x"]}, schema=self.output_schema()), 1

    with pytest.raises(StreamlingError, match=r"unittest.bad_ops source 'source': read\(\) returned _gs_op values "
                                              r"\['x'\]; only i, u and d exist"):
        SourceRunner(BadOps).epoch()

    @transform("unittest.drops_op")
    class DropsOp(TransformPlugin):
        def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
            return pa.schema([("id", pa.int64())])

        def process_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
            return batch.select(["id"])

    with pytest.raises(StreamlingError, match="drops the _gs_op column"):
        TransformRunner(DropsOp, None, pa.schema([("id", pa.int64()), ("_gs_op", pa.string())]))


def test_a_plugin_missing_a_required_method_fails_to_register() -> None:
    with pytest.raises(TypeError, match=r"source plugin 'unittest.half' \(Half\) must define read\(\)"):
        @source("unittest.half")
        class Half(SourcePlugin):
            def output_schema(self) -> pa.Schema:
                return pa.schema([("id", pa.int64())])
