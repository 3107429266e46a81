"""Driver-side sinks read an epoch in bounded Arrow chunks instead of ``toArrow``: same values, same
order, and the print sink's lines and numbering unchanged."""

from __future__ import annotations

import datetime as dt
import decimal
import io
from typing import Any

import pyarrow as pa
import pytest
import yaml

from streamling.config import load_settings
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.sinks.common import arrow_chunks
from streamling.sinks.print import PrintSink, format_lines
from streamling.spec import parse_pipeline

pytestmark = pytest.mark.spark

DDL = ("id long, name string, amount decimal(10,2), at timestamp, tags array<string>, attrs map<string,int>, "
       "inner struct<x:int>, _gs_op string")


def epoch_rows(start: int, count: int) -> list[tuple[Any, ...]]:
    when = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
    return [(i, f"n{i}", decimal.Decimal(i) / 4, when + dt.timedelta(seconds=i), [f"t{i}"], {"k": i}, {"x": i},
             "iud"[i % 3]) for i in range(start, start + count)]


def test_chunks_hold_what_to_arrow_holds_in_order(spark: Any) -> None:
    df = spark.createDataFrame(epoch_rows(0, 23), DDL).repartition(3).sortWithinPartitions("id")
    chunks = list(arrow_chunks(df, rows_per_chunk=4))
    assert max(c.num_rows for c in chunks) == 4
    assert pa.Table.from_batches(chunks).equals(df.toArrow())
    assert list(arrow_chunks(df.limit(0))) == []
    # A plan cached by its owner (the flow's fan-out batch) is read, not uncached behind its back.
    owned = df.persist()
    assert pa.Table.from_batches(list(arrow_chunks(owned, rows_per_chunk=100))).equals(df.toArrow())
    assert owned.storageLevel.useMemory
    owned.unpersist()


def test_print_sink_lines_are_numbered_across_chunks_and_epochs(spark: Any) -> None:
    doc = {"sources": {"gen": {"type": "generate", "rows": 1}}, "transforms": {},
           "sinks": {"out": {"type": "print", "from": "gen", "sample_every": 3}}}
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["out"]
    out = io.StringIO()
    sink = PrintSink(NodeContext(spec=spec, settings=load_settings(environ={})), out=out)
    first, second = epoch_rows(0, 25_000), epoch_rows(25_000, 7)
    for i, batch in enumerate((first, second)):
        df = spark.createDataFrame(batch, DDL)
        assert sink.write(df, Epoch(epoch_id=i, flow="f0", application_id="test")) == len(batch)
    every = spark.createDataFrame(first + second, DDL).toArrow()
    numbers = list(range(3, every.num_rows + 1, 3))
    expected = format_lines(every.take([n - 1 for n in numbers]), numbers, 3)
    assert out.getvalue().splitlines() == expected
    assert sink.count == 25_007


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_fails_the_print_sink_at_once_without_retries(spark: Any) -> None:
    """``streamling … | head``: the reader is gone; the error is terminal (no retry can bring it back)."""
    from streamling.errors import StreamlingError

    doc = {"sources": {"gen": {"type": "generate", "rows": 1}}, "transforms": {},
           "sinks": {"out": {"type": "print", "from": "gen"}}}
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["out"]
    sink = PrintSink(NodeContext(spec=spec, settings=load_settings(environ={})), out=_ClosedPipe())
    with pytest.raises(StreamlingError) as info:
        sink.write(spark.createDataFrame(epoch_rows(0, 3), DDL), Epoch(epoch_id=4, flow="f0", application_id="t"))
    assert not info.value.retriable
    assert info.value.headline().startswith("print sink 'out': stdout was closed while printing epoch 4")
