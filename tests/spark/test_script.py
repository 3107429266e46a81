"""Script transform end to end: JS/TS in the QuickJS sandbox, coercion, _gs_op, errors and escapes."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from streamling.errors import StreamlingError
from streamling.runtime.nodes import Epoch, Sink
from streamling.sources.generate import generate_batch
from streamling.spec import nodes as spec_nodes

pytestmark = pytest.mark.spark


class CollectSinkOptions(spec_nodes.FromNodeOptions):
    type: str = "collect"


class CollectSink(Sink):
    """Keeps every row it is given, so a test can compare values and types."""

    rows: list[dict[str, Any]] = []
    schemas: list[list[str]] = []

    def write(self, df: Any, epoch: Epoch) -> int:
        CollectSink.schemas.append([f"{f.name} {f.dataType.simpleString()}" for f in df.schema.fields])
        rows = [r.asDict() for r in df.collect()]
        CollectSink.rows.extend(rows)
        return len(rows)


@pytest.fixture
def collect(monkeypatch: pytest.MonkeyPatch) -> type[CollectSink]:
    CollectSink.rows, CollectSink.schemas = [], []
    node_type = spec_nodes.NodeType("sink", "collect", CollectSinkOptions, f"{__name__}:CollectSink")
    monkeypatch.setitem(spec_nodes.REGISTRY["sink"], "collect", node_type)
    return CollectSink


def _pipeline(script: str, *, rows: int = 5, profile: str = "orders", extra: str = "", pk: str = "") -> str:
    body = "\n".join("        " + line for line in script.strip("\n").splitlines())
    key = f", primary_key: {pk}" if pk else ""
    return f"""
sources:
  s: {{type: generate, rows: {rows}, profile: {profile}, partitions: 1{key}}}
transforms:
  js:
    type: script
    from: s
{extra}    script: |
{body}
sinks:
  out: {{type: collect, from: js}}
"""


def _sorted(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))


def test_javascript_process_keeps_the_input_schema_without_schema(runner, collect):
    runner.run(_pipeline("""
function process(input) {
  input.customer = input.customer.toUpperCase();
  input.quantity = input.quantity * 10;
  return input;
}
"""))
    assert collect.schemas[0] == ["id bigint", "customer string", "country string", "amount double",
                                  "quantity int", "created_at timestamp", "_gs_op string"]
    rows = _sorted(collect.rows, "id")
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["customer"] == "CUSTOMER-0000" and rows[1]["quantity"] == 30
    assert rows[1]["created_at"].replace(tzinfo=None) == dt.datetime(2026, 1, 1, 0, 0, 1) or \
        rows[1]["created_at"].astimezone(dt.UTC).replace(tzinfo=None) == dt.datetime(2026, 1, 1, 0, 0, 1)
    assert {r["_gs_op"] for r in rows} == {"i"}


def test_new_keys_become_columns_without_schema_and_an_incomplete_schema_fails_planning(runner, collect):
    runner.run(_pipeline("function process(row) { return {...row, tier: row.amount > 500 ? 'gold' : 'basic'}; }",
                         rows=3))
    assert collect.schemas[0] == ["id bigint", "customer string", "country string", "amount double",
                                  "quantity int", "created_at timestamp", "_gs_op string", "tier string"]
    amounts = generate_batch("orders", 0, 3, 0, 0).column("amount").to_pylist()
    assert [r["tier"] for r in _sorted(collect.rows, "id")] == ["gold" if a > 500 else "basic" for a in amounts]
    headline = _failure(runner, _pipeline("function process(row) { return {id: row.id, tier: 'x'}; }", rows=1,
                                          extra="    schema: {id: int64}\n"), application_id="declared")
    assert "'js': the script returns keys ['tier'] that are not in its 'schema' ['id']" in headline


def test_typescript_named_function_with_schema(runner, collect):
    runner.run(_pipeline("""
interface Order { id: number; amount: number; customer: string }
enum Risk { Low = "low", High = "high" }
function transformRisk(data: Order): { id: number; risk: string } {
  const risk: Risk = data.amount > 500 ? Risk.High : Risk.Low;
  return { id: data.id, risk };
}
""", extra="    language: typescript\n    schema: {id: int64, risk: string}\n"))
    assert collect.schemas[0] == ["id bigint", "risk string", "_gs_op string"]
    amounts = generate_batch("orders", 0, 5, 0, 0).column("amount").to_pylist()
    expected = [(i, "high" if amount > 500 else "low") for i, amount in enumerate(amounts)]
    assert [(r["id"], r["risk"]) for r in _sorted(collect.rows, "id")] == expected
    assert {"low", "high"} <= {risk for _, risk in expected}


def test_anonymous_function_array_and_null_returns(runner, collect):
    runner.run(_pipeline("""
function (input) {
  if (input.id % 2 === 1) return null;
  return [{id: input.id, part: 1}, {id: input.id, part: 2}];
}
""", extra="    schema: {id: int64, part: int32}\n"))
    rows = _sorted(collect.rows, "id", "part")
    assert [(r["id"], r["part"]) for r in rows] == [(0, 1), (0, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    assert {r["_gs_op"] for r in rows} == {"i"}


def test_helpers_next_to_process(runner, collect):
    runner.run(_pipeline("""
function double(x) { return x * 2; }
function process(input) { return {id: input.id, twice: double(input.id)}; }
""", rows=3, extra="    schema: {id: int64, twice: int64}\n"))
    assert _sorted(collect.rows, "id") == [{"id": i, "twice": 2 * i, "_gs_op": "i"} for i in range(3)]


def test_an_arrow_function_is_the_function_too(runner, collect):
    runner.run(_pipeline("(row) => ({id: row.id, country: row.country.toLowerCase()})", rows=2,
                         extra="    schema: {id: int64, country: string}\n"))
    assert [r["country"] for r in _sorted(collect.rows, "id")] == ["us", "es"]


def test_coercion_follows_streamling(runner, collect):
    runner.run(_pipeline("""
function transformCoercion(data) {
  return {a: "7", b: 2.9, c: "2.5", d: 42, e: null, g: "true", h: 1.5, i: {k: 1}, t: 0, dec: "12.345"};
}
""", rows=1, extra="    schema: {a: int64, b: int64, c: float64, d: string, e: int64, f: string, g: boolean, "
                  "h: float32, i: string, t: timestamp, dec: 'decimal128(10,3)'}\n"))
    assert collect.schemas[0] == ["a bigint", "b bigint", "c double", "d string", "e bigint", "f string",
                                  "g boolean", "h float", "i string", "t timestamp", "dec decimal(10,3)",
                                  "_gs_op string"]
    row = collect.rows[0]
    assert (row["a"], row["b"], row["c"], row["d"], row["e"], row["f"]) == (7, 2, 2.5, "42", None, None)
    assert (row["g"], row["h"], row["i"], row["dec"]) == (True, 1.5, '{"k":1}', Decimal("12.345"))
    assert row["t"].astimezone(dt.UTC) == dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def test_gs_op_is_carried_unless_the_script_sets_it(runner, collect):
    runner.run(_pipeline("""
function process(input) {
  const out = [{id: input.id, v: input.version}];
  if (input.version === 2) out.push({id: input.id, v: -1, _gs_op: "d"});
  return out;
}
""", rows=3, profile="cdc", extra="    schema: {id: int64, v: int32}\n"))
    rows = sorted((r["v"], r["_gs_op"]) for r in collect.rows)
    assert rows == [(-1, "d"), (1, "i"), (2, "u"), (3, "d")]


def _failure(runner: Any, yaml_text: str, **overrides: Any) -> str:
    with pytest.raises(StreamlingError) as info:
        runner.run(yaml_text, **overrides)
    return info.value.headline()


def test_a_throwing_script_names_node_row_key_message_and_line(runner, collect):
    headline = _failure(runner, _pipeline("""
function process(input) {
  if (input.id === 3) {
    throw new Error("bad order " + input.id);
  }
  return input;
}
""", pk="id"))
    assert headline.startswith("script transform 'js': row 3 of the batch (id=3): Error: bad order 3 (script line 3)")

    headline = _failure(runner, _pipeline("""
function process(input) {
  const x = input.nothing;
  return {id: x.deeper};
}
""", rows=1), application_id="second")
    assert headline.startswith("script transform 'js': row 0 of the batch: TypeError: cannot read property 'deeper' "
                               "of undefined (script line 3)")


def test_a_script_that_does_not_parse_stops_before_running(runner, collect):
    headline = _failure(runner, _pipeline("""
function process(input) {
  return input +;
}
"""))
    assert headline.startswith("'js': the script does not load: SyntaxError") or \
        headline.startswith("script transform 'js': the script does not load: SyntaxError") or \
        "the script does not load: SyntaxError" in headline
    assert "(script line 2)" in headline


def test_typescript_that_does_not_compile(runner, collect):
    headline = _failure(runner, _pipeline("function process(input: {a: number) { return input; }",
                                          extra="    language: typescript\n"))
    assert "TypeScript does not compile" in headline


@pytest.mark.parametrize(("script", "expected"), [
    ("function process(input) { return {id: input.id, f: std.loadFile('/etc/passwd')}; }",
     "ReferenceError: std is not defined"),
    ("function process(input) { return {id: input.id, f: os.open('/etc/passwd', 0)}; }",
     "ReferenceError: os is not defined"),
    ("function process(input) { return fetch('http://127.0.0.1:9/'); }",
     "ReferenceError: fetch is not defined"),
    ("function process(input) { const net = require('net'); return net.connect(80); }",
     "ReferenceError: require is not defined"),
    ("function process(input) { return new WebSocket('ws://127.0.0.1:9/'); }",
     "ReferenceError: WebSocket is not defined"),
])
def test_no_file_system_and_no_network(runner, collect, script, expected):
    headline = _failure(runner, _pipeline(script, rows=1))
    assert headline.startswith(f"script transform 'js': row 0 of the batch: {expected} (script line 1)")


def test_an_endless_loop_hits_the_cpu_limit(runner, collect):
    headline = _failure(runner, _pipeline("""
function process(input) {
  if (input.id === 2) { while (true) {} }
  return input;
}
"""), wasm_script={"cpu_limit_ms": 500})
    assert headline.startswith("script transform 'js': the script ran past its CPU limit of 500 ms for a batch of ")
    assert "at row 2 of the batch" in headline
    assert "raise wasm_script.cpu_limit_ms" in headline


def test_a_huge_allocation_hits_the_memory_limit(runner, collect):
    headline = _failure(runner, _pipeline("""
function process(input) {
  const hoard = [];
  while (true) { hoard.push("x".repeat(1 << 20) + hoard.length); }
}
""", rows=1), wasm_script={"memory_limit_mb": 32})
    assert headline.startswith("script transform 'js': row 0 of the batch: InternalError: out of memory")
    assert "memory limit of 32 MB" in headline

    headline = _failure(runner, _pipeline("function process(input) { return new ArrayBuffer(2 ** 31); }",
                                          rows=1), wasm_script={"memory_limit_mb": 32}, application_id="second")
    assert "row 0 of the batch" in headline and ("RangeError" in headline or "out of memory" in headline)


def test_a_runtime_from_config_that_does_not_exist(runner, collect, tmp_path):
    headline = _failure(runner, _pipeline("function process(input) { return input; }"),
                        wasm_script={"runtime_wasm_file_path": str(tmp_path / "missing.wasm")})
    assert "cannot load the script runtime" in headline and "wasm_script.runtime_wasm_file_path" in headline


def test_nulls_booleans_decimals_and_unicode_pass_through_unchanged(runner, collect):
    runner.run("""
sources:
  s: {type: generate, rows: 4, partitions: 1}
transforms:
  shaped:
    type: sql
    from: s
    sql: >-
      SELECT id, CASE WHEN id % 2 = 0 THEN NULL ELSE quantity END AS q, CASE WHEN id = 3 THEN NULL ELSE id % 2 = 0
      END AS flag, CAST(amount AS DECIMAL(10, 2)) AS price, CASE WHEN id = 1 THEN NULL ELSE 'zoë ✓ "q"' END AS who,
      CASE WHEN id = 2 THEN NULL ELSE created_at END AS at, _gs_op FROM s
  js:
    type: script
    from: shaped
    script: "function process(r) { return r; }"
sinks:
  out: {type: collect, from: js}
""")
    got = _sorted(collect.rows, "id")
    assert collect.schemas[0] == ["id bigint", "q int", "flag boolean", "price decimal(10,2)", "who string",
                                  "at timestamp", "_gs_op string"]
    expected = generate_batch("orders", 0, 4, 0, 0).to_pylist()
    for row, source in zip(got, expected, strict=True):
        i = source["id"]
        assert row["q"] == (None if i % 2 == 0 else source["quantity"])
        assert row["flag"] == (None if i == 3 else i % 2 == 0)
        assert row["price"] == Decimal(str(source["amount"])).quantize(Decimal("0.01"))
        assert row["who"] == (None if i == 1 else 'zoë ✓ "q"')
        assert (row["at"] is None) == (i == 2)
        if row["at"] is not None:
            assert row["at"].astimezone(dt.UTC) == source["created_at"]
