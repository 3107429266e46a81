"""How ClickHouse columns are read into Spark, and how a page of the sort key is cut into spans."""

from __future__ import annotations

from typing import Any

import pytest

from streamling.sources.clickhouse import MAX_SPANS, ScanPlan, _spans, page_condition
from streamling.spec.types import METADATA_KEY, from_clickhouse


@pytest.mark.parametrize(("ch_type", "spark", "template"), [
    ("Int64", "LongType()", "{}"),
    ("Nullable(UInt32)", "LongType()", "toInt64({})"),
    ("UInt8", "ShortType()", "toInt16({})"),
    ("UInt64", "DecimalType(20,0)", "toDecimal128({}, 0)"),
    ("LowCardinality(Nullable(String))", "StringType()", "{}"),
    ("Decimal(18, 4)", "DecimalType(18,4)", "{}"),
    ("Decimal64(3)", "DecimalType(18,3)", "{}"),
    ("DateTime64(3, 'UTC')", "TimestampType()", "toDateTime64({}, 6, 'UTC')"),
    ("Date", "DateType()", "toDate32({})"),
    ("Array(String)", "StringType()", "toJSONString({})"),
    ("UUID", "StringType()", "toString({})"),
])
def test_clickhouse_types_map_to_spark(ch_type: str, spark: str, template: str) -> None:
    column = from_clickhouse(ch_type)
    assert repr(column.spark) == spark
    assert column.template == template
    assert column.metadata == {}


def test_wide_clickhouse_numbers_are_exact_text_tagged_with_their_type() -> None:
    assert from_clickhouse("Decimal(50, 2)").metadata == {METADATA_KEY: "decimal256(50,2)"}
    assert from_clickhouse("Decimal(50, 2)").template == "toDecimalString({}, 2)"
    assert from_clickhouse("UInt256").metadata == {METADATA_KEY: "decimal(78,0)"}


def test_a_page_is_cut_into_spans_of_the_numeric_key_without_gaps_or_overlaps() -> None:
    plan = ScanPlan(table="`t`", select=["*"], key="`k`", numeric_key=True, where="v > 0")
    spans = _spans(plan, {"key": 10, "inclusive": True}, {"key": 35, "inclusive": False}, 10)
    assert [(s["key"], s.get("inclusive", False), e["key"]) for s, e in spans] == \
        [(10, True, 19), (19, False, 29), (29, False, 35)]
    assert page_condition(plan, spans[1][0], spans[1][1]) == "`k` > 19 AND `k` <= 29 AND (v > 0)"
    assert page_condition(plan, {"key": None}, None) == "(v > 0)"
    text = ScanPlan(table="`t`", select=["*"], key="`k`", numeric_key=False, where=None)
    assert _spans(text, {"key": "a"}, {"key": "z"}, 10) == [({"key": "a"}, {"key": "z"})]


def test_a_page_of_a_sparse_key_is_read_in_a_bounded_number_of_exact_spans() -> None:
    # A resumed position far below the next rows, or a hash key: 2**64 values between the page's
    # ends would be ~1.8e13 spans of the default sort_key_range.
    plan = ScanPlan(table="`t`", select=["*"], key="`k`", numeric_key=True, where=None)
    lo, hi = 5, 2**64 + 5
    spans = _spans(plan, {"key": lo, "inclusive": True}, {"key": hi, "inclusive": False}, 1_000_000)
    assert len(spans) <= MAX_SPANS + 1
    keys = [s["key"] for s, _ in spans] + [spans[-1][1]["key"]]
    assert keys[0] == lo and keys[-1] == hi and keys == sorted(keys)
    assert all(isinstance(k, int) for k in keys)  # integer keys stay exact (no float rounding)
    assert all(e == nxt for (_, e), (nxt, _) in zip(spans, spans[1:], strict=False))  # no gap, no overlap


def test_hybrid_phases_must_give_the_same_columns_and_types() -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    from streamling.sources.hybrid import schema_differences

    history = StructType([StructField("id", LongType(), False), StructField("v", StringType()),
                          StructField("at", TimestampType())])
    live = StructType([StructField("id", LongType()), StructField("v", StringType()),
                       StructField("at", StringType()), StructField("_gs_op", StringType()),
                       StructField("_kafka_offset", LongType()), StructField("extra", StringType())])
    assert schema_differences(history, live) == ["extra ['extra']", "'at' is string, not timestamp"]
    assert schema_differences(history, StructType(history.fields[:2])) == ["missing ['at']"]
    assert schema_differences(history, StructType([*history.fields, StructField("_gs_op", StringType())])) == []


def test_a_replacing_table_is_collapsed_per_sorting_key_before_the_filter() -> None:
    from streamling.sources.clickhouse import _engine_arguments, scan_query

    plan = ScanPlan(table="`t`", select=["`k` AS `k`", "'i' AS _gs_op"], key="`k`", numeric_key=True,
                    where="v > 0", replacing={"version": "`ver`", "is_deleted": "`is_deleted`"},
                    sorting="k, id", columns=["`k`", "`id`", "`v`", "`ver`", "`is_deleted`"])
    assert scan_query(plan, {"key": 1}, {"key": 9}) == (
        "SELECT `k` AS `k`, 'i' AS _gs_op FROM (SELECT * FROM (SELECT `k`, `id`, `v`, `ver`, `is_deleted` FROM `t` "
        "WHERE `k` > 1 AND `k` <= 9 ORDER BY k, id, `ver` DESC, `is_deleted` DESC LIMIT 1 BY k, id) "
        "WHERE `is_deleted` = 0 AND (v > 0)) ORDER BY `k`")
    final = ScanPlan(**{**plan.__dict__, "replacing": {"version": None, "is_deleted": None}, "where": None})
    assert scan_query(final, {"key": None}, {"key": 9}) == (
        "SELECT `k` AS `k`, 'i' AS _gs_op FROM (SELECT * FROM (SELECT `k`, `id`, `v`, `ver`, `is_deleted` FROM `t` "
        "FINAL WHERE `k` <= 9)) ORDER BY `k`")
    engine = "ReplicatedReplacingMergeTree"
    assert _engine_arguments(f"{engine}('/ch/{{shard}}/t', '{{replica}}', `my ver`, is_deleted) ORDER BY (k, id)",
                             engine) == ["'/ch/{shard}/t'", "'{replica}'", "`my ver`", "is_deleted"]
    assert _engine_arguments("ReplacingMergeTree ORDER BY k SETTINGS x = 1", "ReplacingMergeTree") == []


def _source_with_state(entry: dict | None) -> Any:
    import yaml

    from streamling.config import load_settings
    from streamling.runtime.nodes import NodeContext
    from streamling.sources.clickhouse import ClickHouseSource
    from streamling.spec import parse_pipeline
    from streamling.state.memory import InMemoryStateBackend

    doc = {"sources": {"ch": {"type": "clickhouse", "table_name": "t"}}, "sinks": {"o": {"type": "blackhole",
                                                                                       "from": "ch"}}}
    state = InMemoryStateBackend("test", shared=False)
    if entry is not None:
        state.put("clickhouse_source:ch", entry)
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["ch"]
    return ClickHouseSource(NodeContext(spec=spec, settings=load_settings(environ={}), state=state, dry_run=True))


def test_the_saved_position_is_taken_only_when_it_is_one_and_never_for_a_preview() -> None:
    saved = _source_with_state({"offset": {"key": 41, "inclusive": False}, "epoch": 3})
    assert saved._saved_position() == {"key": 41, "inclusive": False}
    assert saved.origin(resume=False) == {"key": None}  # a preview reads from the configured start
    # what is not an offset this source wrote (an older or foreign entry, a drained empty table) is ignored
    for junk in ({"offset": None}, {"offset": "41"}, {"offset": {"key": None}}, {"phase": "live"}):
        assert _source_with_state(junk)._saved_position() is None, junk
    assert _source_with_state(None).origin() == {"key": None}


def test_a_position_saved_for_another_scan_is_left_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    plan = ScanPlan(table="`default`.`t`", select=["`k`"], key="`k`", numeric_key=True, where=None)
    other = ScanPlan(table="`default`.`old`", select=["`k`"], key="`k`", numeric_key=True, where=None)
    for scan, expected in ((plan.positions(), {"key": 41, "inclusive": False}), (other.positions(), None)):
        source = _source_with_state({"offset": {"key": 41, "inclusive": False}, "scan": scan})
        source._described = (plan, None, [])  # type: ignore[assignment]  # what describe() found, no server
        with caplog.at_level("WARNING", logger="streamling.sources.clickhouse"):
            assert source._saved_position() == expected
            assert source._saved_position() == expected
    warned = [r for r in caplog.records if "saved while it read another table" in r.getMessage()]
    assert len(warned) == 1 and "old" in warned[0].getMessage()
    # what it writes back names its scan
    assert source.state_entries({"key": 7})["clickhouse_source:ch"]["scan"] == plan.positions()


def test_a_hybrid_phase_recorded_for_other_sources_is_left() -> None:
    import json

    import yaml

    from streamling.config import load_settings
    from streamling.runtime.nodes import NodeContext
    from streamling.sources.hybrid import HybridSource
    from streamling.spec import parse_pipeline
    from streamling.state.memory import InMemoryStateBackend

    doc = {"sources": {"h": {"type": "hybrid", "primary_key": "id",
                             "bounded_sources": [{"source_type": "clickhouse", "table_name": "hist"}],
                             "unbounded_source": {"source_type": "kafka", "topic": "live", "data_format": "json",
                                                  "schema": {"id": "int64"}},
                             "offset_table": {"topic_name": "live", "table_name": "offsets"}}},
           "sinks": {"o": {"type": "blackhole", "from": "h"}}}
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["h"]

    def phase(entry: dict[str, Any]) -> str:
        state = InMemoryStateBackend("test", shared=False)
        state.put("hybrid_source_h_v1", entry)
        return HybridSource(NodeContext(spec=spec, settings=load_settings(environ={}), state=state,
                                        dry_run=True)).phase()

    mine = json.dumps([["hist", None], "live"])
    assert phase({"phase": "live", "sources": mine}) == "live"
    assert phase({"phase": "live"}) == "live"  # recorded before phases named their sources
    assert phase({"phase": "live", "sources": json.dumps([["old", None], "live"])}) == "backfill-0"
