"""``type: wasm``: real Extism plugins, built here from the WAT files in fixtures/wasm/, run
end to end through pipelines (JSON and Arrow IPC contracts, config, errors, plan-time checks)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamling.errors import StreamlingError
from streamling.runtime.nodes import Epoch, Sink
from streamling.sources.generate import generate_batch
from streamling.spec import nodes as spec_nodes

pytestmark = pytest.mark.spark

WAT = Path(__file__).resolve().parents[2] / "fixtures" / "wasm"


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each fixtures/wasm/<name>.wat compiled to <tmp>/<name>.wasm."""
    import wasmtime

    out = tmp_path_factory.mktemp("wasm")
    built = {}
    for wat in sorted(WAT.glob("*.wat")):
        target = out / f"{wat.stem}.wasm"
        target.write_bytes(bytes(wasmtime.wat2wasm(wat.read_text(encoding="utf-8"))))
        built[wat.stem] = target
    return built


class CollectSinkOptions(spec_nodes.FromNodeOptions):
    type: str = "collect"


class CollectSink(Sink):
    """Keeps every row it is given, in order, so a test can compare them."""

    rows: list[dict[str, Any]] = []

    def write(self, df: Any, epoch: Epoch) -> int:
        rows = [r.asDict() for r in df.collect()]
        CollectSink.rows.extend(rows)
        return len(rows)


@pytest.fixture
def collected(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    CollectSink.rows = []
    monkeypatch.setitem(spec_nodes.REGISTRY["sink"], "collect",
                        spec_nodes.NodeType("sink", "collect", CollectSinkOptions, f"{__name__}:CollectSink"))
    return CollectSink.rows


def _expected_orders(rows: int) -> list[dict[str, Any]]:
    return generate_batch("orders", 0, rows, 0, 0).to_pylist()


@pytest.mark.parametrize("input_format", ["json", "arrow"])
def test_echo_plugin_returns_every_row_and_type_unchanged(runner, plugins, collected, input_format):
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 50, rows_per_batch: 25}}
        transforms:
          echo: {{type: wasm, from: s, module: "{plugins['echo']}", input_format: {input_format}}}
        sinks:
          out: {{type: collect, from: echo}}
    """)
    got = sorted(collected, key=lambda r: r["id"])
    expected = _expected_orders(50)
    assert [r["id"] for r in got] == [r["id"] for r in expected]
    assert [(r["customer"], r["amount"], r["quantity"], r["_gs_op"]) for r in got] == \
        [(r["customer"], r["amount"], r["quantity"], r["_gs_op"]) for r in expected]
    # timestamps cross as ISO-8601 text in JSON and natively in Arrow; both come back as the same instant
    assert [r["created_at"].timestamp() for r in got] == [r["created_at"].timestamp() for r in expected]


def test_transforming_plugin_with_a_declared_schema_keeps_gs_op_by_position(runner, plugins, collected):
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 4}}
        transforms:
          slim: {{type: sql, sql: "SELECT id, customer, country FROM s"}}
          loud:
            type: wasm
            from: slim
            module: "{plugins['upper']}"
            schema: {{ID: int64, CUSTOMER: string}}
        sinks:
          out: {{type: collect, from: loud}}
    """)
    got = sorted(collected, key=lambda r: r["ID"])
    expected = _expected_orders(4)
    assert got == [{"ID": r["id"], "CUSTOMER": r["customer"].upper(), "_gs_op": "i"} for r in expected]


def test_config_reaches_the_plugin_and_returned_gs_op_is_kept(runner, plugins, collected):
    reply = json.dumps([{"n": 7, "note": "from config", "_gs_op": "u"}, {"n": 8, "_gs_op": "d"}, {"n": 9}])
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 5, partitions: 1}}
        transforms:
          fixed:
            type: wasm
            from: s
            module: "{plugins['reply']}"
            config: {{reply: {json.dumps(reply)}}}
            schema: {{n: int32, note: string}}
        sinks:
          out: {{type: collect, from: fixed}}
    """)
    assert collected == [{"n": 7, "note": "from config", "_gs_op": "u"}, {"n": 8, "note": None, "_gs_op": "d"},
                         {"n": 9, "note": None, "_gs_op": "i"}]


def _failure(runner: Any, transform: str) -> str:
    with pytest.raises(StreamlingError) as info:
        runner.run(f"""
            sources:
              s: {{type: generate, rows: 3, partitions: 1}}
            transforms:
              plug: {transform}
            sinks:
              out: {{type: blackhole, from: plug}}
        """)
    return info.value.headline()


def test_a_plugin_that_never_returns_is_stopped_by_timeout_ms(runner, plugins):
    headline = _failure(runner, f'{{type: wasm, from: s, module: "{plugins["spin"]}", timeout_ms: 300}}')
    assert headline == ("wasm transform 'plug': plugin function 'process' timed out after 300 ms"
                        " — raise timeout_ms or make the plugin faster")


@pytest.mark.parametrize(("config", "schema", "message"), [
    ("{}", "", "plugin function 'process' failed: config key 'reply' is not set"),
    ("{reply: 'not json'}", "", "plugin output is not valid JSON: Expecting value: line 1 column 1 (char 0)"
     " — return a JSON array of row objects"),
    ("{reply: '{\"n\": 1}'}", "", "plugin output must be a JSON array of row objects (got dict)"
     " — return a JSON array of row objects"),
    ("{reply: '[{\"n\": 1}]'}", "{n: int64}", "plugin returned 1 rows for 3 without '_gs_op'"
     " — return '_gs_op' (i/u/d) in every row when the row count changes"),
    ("{reply: '[{\"n\": \"one\", \"_gs_op\": \"i\"}]'}", "{n: int64}",
     "output column 'n' does not match the declared type int64: Could not convert 'one' with type str: tried to "
     "convert to int64 — fix the plugin or the node's 'schema'"),
])
def test_plugin_errors_and_bad_output_fail_the_epoch_naming_the_node(runner, plugins, config, schema, message):
    schema_key = f", schema: {schema}" if schema else ""
    headline = _failure(runner, f'{{type: wasm, from: s, module: "{plugins["reply"]}", config: {config}{schema_key}}}')
    assert headline == f"wasm transform 'plug': {message}"


def test_missing_module_and_missing_export_are_reported_before_running(runner, plugins, tmp_path, monkeypatch):
    pipeline = """
        sources:
          s: {{type: generate, rows: 1}}
        transforms:
          plug: {{type: wasm, from: s, module: "{module}"{extra}}}
        sinks:
          out: {{type: blackhole, from: plug}}
    """
    monkeypatch.chdir(tmp_path)  # a relative module path starts at the working directory
    with pytest.raises(StreamlingError) as info:
        runner.pipeline(pipeline.format(module="plugins/nope.wasm", extra=""))
    assert info.value.headline() == (
        f"wasm transform 'plug': module file not found: {tmp_path / 'plugins' / 'nope.wasm'}"
        " — set 'module' to a .wasm file (relative paths start at the working directory)")

    with pytest.raises(StreamlingError) as info:
        runner.pipeline(pipeline.format(module=plugins["echo"], extra=", function: transform"))
    assert info.value.headline() == (
        f"wasm transform 'plug': module {plugins['echo']} does not export function 'transform' (it exports process)"
        " — set 'function' to one of its exports")
