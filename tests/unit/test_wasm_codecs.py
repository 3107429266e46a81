"""The JSON contract of ``type: wasm`` without Spark: how timestamps and decimals cross, and
which column a mismatch names."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pyarrow as pa
import pytest

from streamling.errors import node_failure_from_text
from streamling.transforms.wasm import batch_to_json, json_to_columns

SCHEMA = pa.schema([("at", pa.timestamp("us", "UTC")), ("price", pa.decimal128(10, 2)), ("n", pa.int64())])


def test_timestamps_cross_as_iso_utc_text_and_decimals_as_exact_text() -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"at": dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC), "price": decimal.Decimal("12.30"), "n": 1}],
        schema=SCHEMA)
    assert json.loads(batch_to_json(batch)) == [{"at": "2026-01-02T03:04:05.600000Z", "price": "12.30", "n": 1}]


def test_output_rows_are_read_by_key_with_missing_keys_as_null() -> None:
    text = json.dumps([{"at": "2026-01-02T03:04:05Z", "price": 1.25, "n": 2, "extra": True},
                       {"at": "2026-01-02 03:04:05", "price": "7"}])  # no offset: read as UTC
    columns, count = json_to_columns("t", text.encode(), SCHEMA)
    assert count == 2 and "_gs_op" not in columns
    assert columns["at"].to_pylist() == [dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)] * 2
    assert columns["price"].to_pylist() == [decimal.Decimal("1.25"), decimal.Decimal("7.00")]
    assert columns["n"].to_pylist() == [2, None]


def test_a_mismatch_names_the_column() -> None:
    with pytest.raises(RuntimeError) as info:
        json_to_columns("t", b'[{"n": "two"}]', SCHEMA)
    failure = node_failure_from_text(str(info.value))
    assert failure is not None
    assert failure.headline().startswith("wasm transform 't': output column 'n' does not match the declared type int64")
