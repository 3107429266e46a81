"""The script transform's batch exchange without Spark: what crosses into the QuickJS sandbox and
back (raw numbers, dictionary-encoded and plain text, text with UTF-16 lengths) and that every
batch starts from a clean interpreter."""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

import pyarrow as pa
import pytest

from streamling.errors import NodeFailure, node_failure_from_text
from streamling.transforms import quickjs
from streamling.transforms.script import ScriptJob, coercion_kind, encode_batch, iso_utc, run_script_batches


def _job(script: str, schema: pa.Schema, output: pa.Schema | None = None) -> ScriptJob:
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    out = from_arrow_schema(output or schema)
    columns = [(f.name, coercion_kind(f.dataType)) for f in out.fields]
    return ScriptJob("t", quickjs.driver_source(script, columns), quickjs.driver_source(script, columns, True),
                     quickjs.default_runtime_path(), 64, 10_000, to_arrow_schema(out, timezone="UTC"), ("id",))


def _run(script: str, batches: list[pa.RecordBatch], output: pa.Schema | None = None) -> list[dict[str, Any]]:
    job = _job(script, batches[0].schema, output)
    return [row for b in run_script_batches(job, iter(batches)) for row in b.to_pylist()]


TEXT = ["", "a", "ä€", "😀x😀", "nul\x00inside", "quote\"back\\slash", "line\nbreak", "\u2028", None]


def test_text_round_trips_exactly_whether_repeated_or_distinct() -> None:
    rng = random.Random(7)
    repeated = [rng.choice(TEXT) for _ in range(200)]
    distinct = [None if i % 17 == 0 else f"{rng.choice(TEXT[:-1])}-{i}" for i in range(200)]
    batch = pa.RecordBatch.from_pydict({"id": list(range(200)), "repeated": repeated, "distinct": distinct})
    stdin, texts = encode_batch(batch)
    assert b'["repeated", "dict"]' in stdin and b'["distinct", "json"]' in stdin
    assert all(b"\x00" not in t for t in texts)  # script arguments are C strings
    assert _run("function process(r) { return r; }", [batch]) == batch.to_pylist()
    # Computed text (longer, shorter, non-ASCII) comes back through the joined-text path.
    rows = _run("function process(r) { return {id: r.id, repeated: r.repeated === null ? null : r.repeated + 'é',"
                " distinct: r.distinct && r.distinct.slice(0, -1)}; }", [batch])
    assert rows == [{"id": i, "repeated": None if a is None else a + "é", "distinct": b and b[:-1]}
                    for i, a, b in zip(range(200), repeated, distinct, strict=True)]


def test_a_lone_surrogate_becomes_replacement_characters_instead_of_failing() -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1], "s": ["x"]})
    (row,) = _run("function process(r) { return {id: r.id, s: '\\ud800' + r.s}; }", [batch])
    assert row["s"].endswith("x") and set(row["s"][:-1]) == {"\ufffd"}


def test_numbers_truncate_into_integers_and_non_finite_ones_follow_the_column_type() -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1]})
    output = pa.schema([("i", pa.int64()), ("j", pa.int32()), ("nan_i", pa.int64()), ("inf_i", pa.int64()),
                        ("f", pa.float64()), ("inf_f", pa.float64()), ("s", pa.int64()), ("b", pa.bool_())])
    (row,) = _run("function process(r) { return {i: 2.9, j: -2.9, nan_i: NaN, inf_i: -Infinity, f: 0.5, "
                  "inf_f: Infinity, s: ' 12 ', b: 'false'}; }", [batch], output)
    assert row == {"i": 2, "j": -2, "nan_i": None, "inf_i": None, "f": 0.5, "inf_f": float("inf"), "s": 12,
                   "b": False}


def test_timestamps_reach_the_script_as_iso_utc_text_in_any_unit_and_zone() -> None:
    moments = [dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC), None, dt.datetime(1, 1, 1, tzinfo=dt.UTC)]
    for unit in ("s", "ms", "us", "ns"):
        for zone in ("UTC", "Europe/Berlin"):
            column = pa.array(moments, pa.timestamp("us", "UTC")).cast(pa.timestamp(unit, zone), safe=False)
            if unit == "ns":
                column = column.slice(0, 2)  # year 1 is outside the nanosecond range
            text = iso_utc(column).to_pylist()
            assert text[:2] == ["2026-01-02T03:04:05.000000Z" if unit == "s" else "2026-01-02T03:04:05.600000Z",
                                None]


def test_many_rows_out_per_row_grow_the_output_past_the_batch_size() -> None:
    batch = pa.RecordBatch.from_pydict({"id": list(range(50)), "_gs_op": ["i"] * 50})
    rows = _run("function process(r) { return [r, {id: -r.id}, null, {id: 1000 + r.id, _gs_op: 'd'}]; }", [batch])
    assert len(rows) == 150
    assert rows[:3] == [{"id": 0, "_gs_op": "i"}, {"id": 0, "_gs_op": "i"}, {"id": 1000, "_gs_op": "d"}]


def test_a_row_error_names_the_row_key_and_message() -> None:
    batch = pa.RecordBatch.from_pydict({"id": [5, 6, 7]})
    with pytest.raises(NodeFailure, match=r"row 1 of the batch \(id=6\): Error: six"):
        _run("function process(r) {\n  if (r.id === 6) throw new Error('six');\n  return r;\n}", [batch])
    with pytest.raises(NodeFailure, match="got a nested array"):
        _run("function process(r) { return [[r]]; }", [batch])


def test_every_batch_starts_from_a_clean_interpreter() -> None:
    script = ("let seen = 0; globalThis.leak = (globalThis.leak || 0) + 1; Object.prototype.polluted = 1;\n"
              "function process(r) { seen++; return {id: r.id, seen, leak: globalThis.leak}; }")
    batch = pa.RecordBatch.from_pydict({"id": [1, 2]})
    output = pa.schema([("id", pa.int64()), ("seen", pa.int64()), ("leak", pa.int64())])
    rows = _run(script, [batch, batch, batch], output)
    assert [(r["seen"], r["leak"]) for r in rows] == [(1, 1), (2, 1)] * 3


@pytest.mark.parametrize(("script", "message"), [
    # small objects until the engine cannot even build its error object: it throws a bare null
    ("function process(input) { const a = []; for (;;) a.push({x: a.length, y: 'abc' + a.length}); }",
     r"row 0 of the batch \(id=1\): out of memory \(the engine could not even allocate the error\) — the script "
     r"exceeded its memory limit of 64 MB \(wasm_script.memory_limit_mb\)"),
    ("function f(n) { return f(n + 1) + 1; } function process(input) { return f(0); }",
     r"the script recursed too deeply \(call stack exhausted\) at row 0 of the batch \(id=1\) — turn the "
     r"recursion into a loop or bound its depth"),
])
def test_sandbox_exhaustion_names_the_limit(script: str, message: str) -> None:
    with pytest.raises(NodeFailure) as info:
        _run(script, [pa.RecordBatch.from_pydict({"id": [1]})])
    error = node_failure_from_text(str(info.value))
    assert error is not None
    assert re.fullmatch(f"script transform 't': {message}", error.headline()), error.headline()


def test_a_returned_key_outside_the_output_schema_fails_the_batch_naming_it() -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "s": ["a", "b", "c"]})
    # Missing keys are NULL, an explicit undefined is no key: neither is an unknown key.
    assert _run("function process(r) { return r.id === 1 ? {id: r.id} : {id: r.id, s: undefined}; }", [batch]) == [
        {"id": 1, "s": None}, {"id": 2, "s": None}, {"id": 3, "s": None}]
    with pytest.raises(NodeFailure) as info:  # one row of three, and only when another column is absent
        _run("function process(r) { return r.id === 2 ? {id: r.id, tier: 'gold'} : r; }", [batch])
    assert "returned keys ['tier'] that are not in the output schema ['id', 's']" in str(info.value)
    with pytest.raises(NodeFailure, match=r"\['extra'\]"):  # inside an exploded array too
        _run("function process(r) { return [r, {...r, extra: 1}]; }", [batch])


def test_the_output_schema_without_schema_is_what_the_function_returns_on_sample_rows() -> None:
    from pyspark.sql import types as T

    from streamling.transforms import script_schema

    orders = T.StructType([T.StructField("id", T.LongType()), T.StructField("amount", T.DoubleType()),
                           T.StructField("customer", T.StringType()), T.StructField("_gs_op", T.StringType())])

    def infer(script: str) -> list[str] | None:
        found = script_schema.probe(script, orders, quickjs.default_runtime_path(), 64, 10_000)
        assert found is not None
        if not found.returned:
            return None
        return [f"{f.name} {f.dataType.simpleString()}" for f in script_schema.inferred_schema(found, orders).fields]

    assert infer("function process(row) { return {...row, tier: row.amount > 100 ? 'gold' : 'basic'}; }") == [
        "id bigint", "amount double", "customer string", "_gs_op string", "tier string"]
    # Only the returned keys; new numbers are float64; _gs_op is carried; a key seen only on some
    # rows (here the large one) still counts; a throwing row is skipped.
    assert infer("function process(row) { if (row.customer === null) throw new Error('x');"
                 " const out = {id: row.id, score: row.amount * 2, ok: row.amount > 0, meta: {a: 1}};"
                 " if (row.amount > 500) out.big = true; return out; }") == [
        "id bigint", "score double", "ok boolean", "meta string", "big boolean", "_gs_op string"]
    assert infer("function process(row) { throw new Error('never'); }") is None
    found = script_schema.probe("function process(row) { return {id: row.id, tier: 'x', n: 1}; }", orders,
                                quickjs.default_runtime_path(), 64, 10_000)
    assert found is not None and script_schema.undeclared_keys(found, ["id"]) == ["tier", "n"]
    assert script_schema.type_hint(found, ["tier", "n"]) == "{tier: string, n: float64}"
