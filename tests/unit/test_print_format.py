"""The ``print`` sink's lines, golden: the JSON is encoded as arrow-json encodes it (what Streamling's
print sink logs), from each column's Arrow type. The layouts were read from arrow-rs
(``arrow-json/src/writer/encoder.rs``, ``arrow-cast/src/display.rs``) and lexical-core's float writer
(default exponent breaks -5 and 9, no trimmed ``.0``)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json

import pyarrow as pa
import pytest
import yaml

from streamling.config import load_settings
from streamling.runtime.nodes import NodeContext
from streamling.sinks.arrow_json import encode_float, encode_rows, format_decimal
from streamling.sinks.print import PrintSink, format_lines
from streamling.spec import parse_pipeline


def test_a_row_prints_as_streamling_prints_it() -> None:
    rows = pa.table({
        "id": pa.array([7], pa.int64()),
        "total": pa.array([2976.57 * 3]),  # not representable: the shortest text that reads back
        "ratio": pa.array([0.1], pa.float32()),
        "score": pa.array([float("nan")]),
        "price": pa.array([decimal.Decimal("12.34")], pa.decimal128(10, 2)),
        "at": pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 123000)], pa.timestamp("us", tz="UTC")),
        "_gs_op": pa.array(["u"]),
    })
    assert format_lines(rows, [3], 1) == [
        '3 -> (sample_every=1) [Update] {"id":7,"total":8929.710000000001,"ratio":0.1,"score":null,'
        '"price":12.34,"at":"2024-01-01T00:00:00.123Z","_gs_op":"u"}']


@pytest.mark.parametrize(("value", "text"), [
    (2976.57 * 3, "8929.710000000001"),
    (0.1 * 3, "0.30000000000000004"),
    (1.0, "1.0"),
    (-0.0, "-0.0"),
    (123456789.0, "123456789.0"),
    (1e9, "1000000000.0"),        # exponent 9: still positional
    (1e10, "1.0e10"),             # from exponent 10: scientific, no '+'
    (1.5e21, "1.5e21"),
    (1e-5, "0.00001"),            # exponent -5: still positional
    (1e-7, "1.0e-7"),             # Python writes 1e-07
    (2.5e-7, "2.5e-7"),
    (1.7976931348623157e308, "1.7976931348623157e308"),
    (float("nan"), "null"),
    (float("inf"), "null"),
    (float("-inf"), "null"),
])
def test_float64_is_written_as_lexical_core_writes_it(value: float, text: str) -> None:
    assert encode_float(value) == text


@pytest.mark.parametrize(("value", "text"), [
    (0.1, "0.1"),                          # not 0.10000000149011612 (the float64 widening)
    (1073741800.0, "1073741800.0"),        # lexical-core's own float32 cases
    (2.3786281e38, "2.3786281e38"),
    (3.4028234663852886e38, "3.4028235e38"),
])
def test_float32_is_written_in_its_own_shortest_form(value: float, text: str) -> None:
    assert encode_float(value, single=True) == text


@pytest.mark.parametrize(("unscaled", "precision", "scale", "text"), [
    (1234, 10, 2, "12.34"),
    (-50, 10, 2, "-0.50"),
    (0, 10, 2, "0.00"),
    (5, 10, 0, "5"),
    (12, 10, -2, "1200"),
])
def test_decimals_are_written_unquoted_with_their_scale(unscaled: int, precision: int, scale: int,
                                                       text: str) -> None:
    assert format_decimal(unscaled, precision, scale) == text


def test_temporal_values_are_displayed_as_arrow_displays_them() -> None:
    at = [dt.datetime(2024, 5, 6, 7, 8, 9), dt.datetime(2024, 5, 6, 7, 8, 9, 120000),
          dt.datetime(2024, 5, 6, 7, 8, 9, 123456)]
    rows = pa.table({
        "utc": pa.array(at, pa.timestamp("us", tz="UTC")),
        "naive": pa.array(at, pa.timestamp("us")),
        "india": pa.array(at, pa.timestamp("us", tz="+05:30")),
        "nanos": pa.array([1, 1_000, 1_000_000], pa.timestamp("ns")),
        "day": pa.array([dt.date(2024, 5, 6), dt.date(1, 1, 1), None]),
    })
    assert [json.loads(line) for line in encode_rows(rows)] == [
        {"utc": "2024-05-06T07:08:09Z", "naive": "2024-05-06T07:08:09", "india": "2024-05-06T12:38:09+05:30",
         "nanos": "1970-01-01T00:00:00.000000001", "day": "2024-05-06"},
        {"utc": "2024-05-06T07:08:09.120Z", "naive": "2024-05-06T07:08:09.120",
         "india": "2024-05-06T12:38:09.120+05:30", "nanos": "1970-01-01T00:00:00.000001", "day": "0001-01-01"},
        {"utc": "2024-05-06T07:08:09.123456Z", "naive": "2024-05-06T07:08:09.123456",
         "india": "2024-05-06T12:38:09.123456+05:30", "nanos": "1970-01-01T00:00:00.001", "day": None},
    ]


def test_nested_binary_and_string_values() -> None:
    rows = pa.table({
        "tags": pa.array([[0.1, None], None], pa.list_(pa.float32())),
        "attrs": pa.array([[("k", 1), ("n", None)], []], pa.map_(pa.string(), pa.int32())),
        "inner": pa.array([{"x": 1.5, "y": None}, None], pa.struct([("x", pa.float64()), ("y", pa.string())])),
        "raw": pa.array([b"\x00\xff", None]),
        "text": pa.array(['a "q"\n\x01é', None]),
        "kind": pa.array(["a", None]).dictionary_encode(),
    })
    assert encode_rows(rows) == [
        '{"tags":[0.1,null],"attrs":{"k":1,"n":null},"inner":{"x":1.5,"y":null},"raw":"00ff",'
        '"text":"a \\"q\\"\\n\\u0001é","kind":"a"}',
        '{"tags":null,"attrs":{},"inner":null,"raw":null,"text":null,"kind":null}',
    ]


def test_a_sliced_chunk_prints_its_own_rows() -> None:
    rows = pa.table({"v": pa.array([[1], [2, 3], [4]]), "m": pa.array([[("a", 1)], [("b", 2)], []],
                                                                     pa.map_(pa.string(), pa.int64()))})
    assert encode_rows(rows.slice(1, 1)) == ['{"v":[2,3],"m":{"b":2}}']


def test_the_sink_numbers_and_samples_rows_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The write path (Spark's chunks stubbed): lines keep their layout, numbering and sampling."""
    from streamling.runtime.nodes import Epoch
    from streamling.sinks import print as print_sink

    doc = {"sources": {"gen": {"type": "generate", "rows": 1}}, "transforms": {},
           "sinks": {"out": {"type": "print", "from": "gen", "sample_every": 2}}}
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["out"]
    out = io.StringIO()
    sink = PrintSink(NodeContext(spec=spec, settings=load_settings(environ={})), out=out)
    batch = pa.record_batch({"id": [1, 2, 3], "amount": pa.array([0.5, float("inf"), 1e-7]),
                             "_gs_op": ["i", "d", None]})
    monkeypatch.setattr(print_sink, "arrow_chunks", lambda df: iter([batch, batch]))
    assert sink.write(None, Epoch(epoch_id=0, flow="f0", application_id="test")) == 6  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == [
        '2 -> (sample_every=2) [Delete] {"id":2,"amount":null,"_gs_op":"d"}',
        '4 -> (sample_every=2) [Insert] {"id":1,"amount":0.5,"_gs_op":"i"}',
        '6 -> (sample_every=2) [Insert] {"id":3,"amount":1.0e-7,"_gs_op":null}',
    ]
