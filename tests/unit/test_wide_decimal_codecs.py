"""Wide decimal columns through the Python-side operators without Spark: the script sandbox's
output, a WASM plugin's JSON or Arrow answer and a handler's JSON response all become exact,
canonical decimal text, and a value that would lose digits fails naming its column."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from streamling.errors import NodeFailure
from streamling.http.client import HttpCall
from streamling.spec.types import parse_type, spark_schema, with_wide_metadata
from streamling.transforms import quickjs
from streamling.transforms.handler import to_record_batch
from streamling.transforms.script import ScriptJob, coercion_kind, run_script_batches
from streamling.transforms.wasm import batch_to_ipc, ipc_to_columns, json_to_columns

SIXTY = "123456789012345678901234567890123456789012345678901234567890"
DECLARED = {"id": "int64", "big": "decimal256(60,0)", "frac": "decimal256(50,3)"}


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = spark_schema(DECLARED)
    return with_wide_metadata(to_arrow_schema(struct, timezone="UTC"), struct)


def test_script_output_is_exact_text() -> None:
    struct = spark_schema(DECLARED)
    columns = [(f.name, coercion_kind(f.dataType, f.metadata)) for f in struct.fields]
    assert columns == [("id", "int"), ("big", "raw"), ("frac", "raw")]
    script = f'function process(row) {{ return {{id: row.id, big: "-{SIXTY}", frac: row.id === 1 ? "2.5" : 7}}; }}'
    job = ScriptJob("js", quickjs.driver_source(script, columns), quickjs.driver_source(script, columns, True),
                    quickjs.default_runtime_path(), 64, 10_000, _arrow_schema(), ("id",))
    batch = pa.RecordBatch.from_pydict({"id": [1, 2]})
    rows = [r for b in run_script_batches(job, iter([batch])) for r in b.to_pylist()]
    assert rows == [{"id": 1, "big": f"-{SIXTY}", "frac": "2.500"}, {"id": 2, "big": f"-{SIXTY}", "frac": "7.000"}]

    bad = 'function process(row) { return {id: row.id, big: "1", frac: "0.0001"}; }'
    job = ScriptJob("js", quickjs.driver_source(bad, columns), quickjs.driver_source(bad, columns, True),
                    quickjs.default_runtime_path(), 64, 10_000, _arrow_schema(), ("id",))
    with pytest.raises(NodeFailure, match=r"column 'frac': 0.0001 has more than 3 digits after the point"):
        list(run_script_batches(job, iter([batch])))


def test_wasm_json_and_arrow_answers_are_exact_text() -> None:
    schema = pa.schema([f for f in _arrow_schema()])
    answer = json.dumps([{"id": 1, "big": int(SIXTY), "frac": "1.5"}, {"id": 2, "big": None, "frac": -3}])
    columns, count = json_to_columns("w", answer.encode(), schema)
    assert count == 2
    assert columns["big"].to_pylist() == [SIXTY, None]
    assert columns["frac"].to_pylist() == ["1.500", "-3.000"]

    table = pa.RecordBatch.from_pydict({"id": pa.array([1], pa.int64()),
                                        "big": pa.array([Decimal(SIXTY)], pa.decimal256(60, 0)),
                                        "frac": pa.array(["0.25"])})
    columns, _ = ipc_to_columns("w", batch_to_ipc(table), schema)
    assert columns["big"].to_pylist() == [SIXTY] and columns["frac"].to_pylist() == ["0.250"]

    with pytest.raises(NodeFailure, match=r"output column 'big'.*more than 60 digits before the point"):
        json_to_columns("w", json.dumps([{"id": 1, "big": SIXTY + "0", "frac": "1"}]).encode(), schema)


def _call() -> HttpCall:
    return HttpCall(node="h", node_kind="handler transform", url="http://x", headers=(), secret_values=(),
                    one_row_per_request=False, payload_version=0, rows_per_request=1, concurrency=1,
                    timeout_secs=1.0, max_attempts=1, initial_backoff_ms=1, max_backoff_ms=1)


def test_handler_answers_are_exact_text_or_refused() -> None:
    schema = _arrow_schema()
    rows: list[dict[str, Any]] = [{"id": 1, "big": int(SIXTY), "frac": "12.5"}, {"id": 2, "frac": 0.125}]
    batch = to_record_batch(_call(), rows, schema)
    assert batch.to_pylist() == [{"id": 1, "big": SIXTY, "frac": "12.500"}, {"id": 2, "big": None, "frac": "0.125"}]
    with pytest.raises(NodeFailure, match=r"response column 'frac': .* send values of decimal256\(50,3\) as "
                                          r"decimal strings"):
        to_record_batch(_call(), [{"id": 1, "frac": 1234567890123456.7}], schema)


def test_a_declared_wide_type_maps_to_the_same_text_column_in_every_node() -> None:
    kind = parse_type("decimal256(60,0)")
    assert _arrow_schema().field("big").type == kind.arrow_type() == pa.string()
