"""The ClickHouse sink on the real engine: FINAL after CDC epochs, plain-table deletes, created and
existing tables, and an unreachable server (replays of an epoch are in the sink contract)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import Runner

from streamling.config import load_settings
from streamling.errors import StreamlingError
from streamling.runtime import events as ev
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.sinks.clickhouse import ClickHouseSink
from streamling.sources.generate import generate_batch
from streamling.spec import parse_pipeline

pytestmark = [pytest.mark.clickhouse, pytest.mark.spark]

DDL = "id long, name string, amount double, _gs_op string"


class Sinks:
    def __init__(self, spark: Any, environ: Mapping[str, str]) -> None:
        self.spark, self.environ, self.made = spark, environ, []

    def make(self, table: str, **options: Any) -> ClickHouseSink:
        doc = {"sources": {"gen": {"type": "generate", "rows": 1}},
               "sinks": {"out": {"type": "clickhouse", "from": "gen", "table": table, "primary_key": "id", **options}}}
        spec = parse_pipeline(yaml.safe_dump(doc)).nodes["out"]
        ctx = NodeContext(spec=spec, settings=load_settings(environ=self.environ), primary_key=["id"],
                          input_schema=self.spark.createDataFrame([], DDL).schema)
        sink = ClickHouseSink(ctx)
        self.made.append(sink)
        sink.open(self.spark)
        return sink

    def write(self, sink: ClickHouseSink, rows: list[tuple[Any, ...]], epoch: int) -> int:
        return sink.write(self.spark.createDataFrame(rows, DDL), Epoch(epoch, "f0", "test", sink_token="tok"))


@pytest.fixture
def sinks(spark: Any, ch_environ: Mapping[str, str]) -> Iterator[Sinks]:
    made = Sinks(spark, ch_environ)
    yield made
    for sink in made.made:
        sink.close()


def final(client: Any, table: str, final: bool = True) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in client.query(f"SELECT id, name, amount FROM {table}{' FINAL' if final else ''} "
                                           "ORDER BY id").result_rows]


def test_cdc_epochs_end_as_the_latest_row_per_key_in_final(spark: Any, tmp_path: Path, ch_environ: Mapping[str, str],
                                                           ch_client: Any, unique_name: str) -> None:
    rows = 3_000
    runner = Runner(spark, tmp_path, ch_environ)
    runner.run(f"""
        sources:
          changes: {{type: generate, profile: cdc, rows: {rows}, rows_per_batch: 700, primary_key: id}}
        transforms: {{}}
        sinks:
          out: {{type: clickhouse, from: changes, table: {unique_name}}}
    """)
    events = generate_batch("cdc", 0, rows, 0, 0).to_pylist()
    latest: dict[int, dict[str, Any]] = {}
    for event in events:  # Streamling's semantics: the last event of a key wins, a delete removes it
        latest[event["id"]] = event
    expected = sorted((k, e["version"], e["amount"]) for k, e in latest.items() if e["_gs_op"] != "d")
    got = ch_client.query(f"SELECT id, version, amount FROM {unique_name} FINAL ORDER BY id").result_rows
    assert [tuple(r) for r in got] == expected
    engine = ch_client.query(f"SELECT engine_full FROM system.tables WHERE name = '{unique_name}'").result_rows[0][0]
    assert engine.startswith("ReplacingMergeTree(insert_time, is_deleted)")
    # The counts the monitor and metrics show come from Spark's scan and the sink's own collect (no
    # observation): every row read, and every row the sink was given, repeated keys included.
    assert runner.input_rows() == rows
    assert sum(e.rows["out"] for e in runner.of_type(ev.EpochFlushed)) == rows


def test_plain_table_deletes_and_converges_on_replay(sinks: Sinks, ch_client: Any, unique_name: str) -> None:
    sink = sinks.make(unique_name, append_only_mode=False, schema_override={"amount": "Decimal(18, 2)"})
    sinks.write(sink, [(1, "a", 1.0, "i"), (2, "b", 2.0, "i")], epoch=0)
    second = [(1, "a2", 1.25, "u"), (2, "b", 2.0, "d"), (3, "c", 3.5, "i")]
    for _ in range(2):  # the second time is a replay
        sinks.write(sink, second, epoch=1)
        assert [(i, n, float(a)) for i, n, a in final(ch_client, unique_name, final=False)] == \
            [(1, "a2", 1.25), (3, "c", 3.5)]
    columns = dict(ch_client.query(f"SELECT name, type FROM system.columns WHERE table = '{unique_name}'").result_rows)
    assert columns == {"id": "Int64", "name": "Nullable(String)", "amount": "Decimal(18, 2)"}


def test_existing_table_gets_only_its_columns_and_bad_ones_are_refused(sinks: Sinks, ch_client: Any,
                                                                       unique_name: str) -> None:
    ch_client.command(f"CREATE TABLE {unique_name} (id Int64, amount Float64, insert_time DateTime64(6), "
                      "is_deleted UInt8) ENGINE = ReplacingMergeTree(insert_time, is_deleted) ORDER BY id")
    sink = sinks.make(unique_name)
    sinks.write(sink, [(1, "dropped", 1.0, "i")], epoch=0)
    assert ch_client.query(f"SELECT id, amount FROM {unique_name} FINAL").result_rows == [(1, 1.0)]
    plain = f"{unique_name}_plain"
    ch_client.command(f"CREATE TABLE {plain} (id Int64, amount Float64) ENGINE = MergeTree ORDER BY id")
    with pytest.raises(StreamlingError) as refused:
        sinks.make(plain)
    assert "has no column(s) ['insert_time', 'is_deleted']" in str(refused.value)
    assert not refused.value.retriable


def test_unreachable_server_is_a_retriable_error_naming_the_node(spark: Any, ch_environ: Mapping[str, str],
                                                                 unique_name: str) -> None:
    environ = {**ch_environ, "STREAMLING__CLICKHOUSE_SINK__URL": "http://127.0.0.1:9"}
    with pytest.raises(StreamlingError) as down:
        Sinks(spark, environ).make(unique_name)
    assert str(down.value).startswith("clickhouse sink 'out': connecting at http://127.0.0.1:9 failed")
    assert down.value.retriable


def test_wide_integers_land_in_native_clickhouse_columns(spark: Any, ch_environ: Mapping[str, str], ch_client: Any,
                                                         unique_name: str) -> None:
    """Streamling's u256 (decimal(78,0)) and a decimal(77,0) become UInt256, a decimal256(76,2) a
    Decimal(76, 2): ClickHouse sorts and sums them as numbers (as text, "9" > "10")."""
    from pyspark.sql import types as T

    from streamling.spec.types import ColumnType

    schema = T.StructType([T.StructField("id", T.LongType()), ColumnType("decimal", 78, 0).spark_field("u"),
                           ColumnType("decimal", 77, 0).spark_field("d77"),
                           ColumnType("decimal256", 76, 2).spark_field("d76"),
                           T.StructField("_gs_op", T.StringType())])
    doc = {"sources": {"gen": {"type": "generate", "rows": 1}},
           "sinks": {"out": {"type": "clickhouse", "from": "gen", "table": unique_name, "primary_key": "id"}}}
    ctx = NodeContext(spec=parse_pipeline(yaml.safe_dump(doc)).nodes["out"],
                      settings=load_settings(environ=ch_environ), primary_key=["id"], input_schema=schema)
    sink = ClickHouseSink(ctx)
    sink.open(spark)
    try:
        top = str(10**77)  # 78 digits (2**256 - 1 fits too; a sum beyond it wraps, as UInt256 does)
        rows = [(1, top, "9" * 77, "1" + "0" * 73 + ".25", "i"), (2, "9", "10", "9.50", "i"),
                (3, "10", None, None, "i")]
        sink.write(spark.createDataFrame(rows, schema), Epoch(0, "f0", "test", sink_token="tok"))
    finally:
        sink.close()
    columns = dict(ch_client.query(f"SELECT name, type FROM system.columns WHERE table = '{unique_name}'").result_rows)
    assert {k: columns[k] for k in ("u", "d77", "d76")} == {
        "u": "Nullable(UInt256)", "d77": "Nullable(UInt256)", "d76": "Nullable(Decimal(76, 2))"}
    assert [r[0] for r in ch_client.query(f"SELECT id FROM {unique_name} FINAL ORDER BY u").result_rows] == [2, 3, 1]
    total = ch_client.query(f"SELECT toString(sum(u)), toString(sum(d76)) FROM {unique_name} FINAL").result_rows[0]
    assert total == (str(10**77 + 19), "1" + "0" * 72 + "9.75")
