"""Kafka checks that need no broker: sink keys, filters over declared schemas, producer options and
the warnings for Streamling keys that have no effect on Spark."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from streamling.config import load_settings
from streamling.errors import ValidationError
from streamling.runtime.nodes import NodeContext
from streamling.runtime.planner import build_plan, settings_warnings
from streamling.sinks.kafka import KafkaSink
from streamling.sources.hybrid import HybridSource
from streamling.sources.kafka import KafkaSource
from streamling.spec import PipelineSpec, parse_pipeline
from streamling.spec.sql import filter_column_problem


def _parse(text: str) -> PipelineSpec:
    return parse_pipeline(textwrap.dedent(text))


def _problems(text: str) -> list[str]:
    with pytest.raises(ValidationError) as info:
        _parse(text)
    return [p.headline() for p in info.value.problems]


JSON_SOURCE = """
    sources:
      clicks:
        type: kafka
        topic: clicks
        data_format: json
        schema: {user_id: int64, url: string}
        %s
"""


@pytest.mark.parametrize("extra, sink_key", [
    ("primary_key: user_id", ""),  # declared on the source, inherited through the transform
    ("", "primary_key: user_id"),  # declared on the sink
])
def test_kafka_sink_key_may_come_from_anywhere_upstream(extra: str, sink_key: str) -> None:
    spec = _parse(JSON_SOURCE % extra + f"""
    transforms:
      recent: {{type: sql, sql: "SELECT user_id, url FROM clicks"}}
    sinks:
      out: {{type: kafka, from: recent, topic: out, {sink_key}}}
    """)
    assert spec.nodes["out"].upstream == ["recent"]


def test_avro_source_may_name_the_key_in_its_registered_doc() -> None:
    # Only the registry knows the record's {"primaryKeys": [...]}: not refused without a connection.
    _parse("""
    sources:
      orders: {type: kafka, topic: orders}
    sinks:
      out: {type: kafka, from: orders, topic: copy}
    """)


def test_kafka_sink_without_any_key_is_refused_once_per_sink() -> None:
    problems = _problems(JSON_SOURCE % "" + """
    sinks:
      a: {type: kafka, from: clicks, topic: a}
      b: {type: kafka, from: clicks, topic: b, primary_key: url}
      c: {type: print, from: clicks}
    """)
    assert len(problems) == 1
    assert problems[0].startswith("kafka sink 'a' requires a primary key [sinks.a (line 11)]")


@pytest.mark.parametrize("predicate", [
    "USER_ID > 3 AND url LIKE 'https://%'",
    "_gs_op <> 'd'",
    "_kafka_partition = 0 AND _kafka_key IS NOT NULL",
    "exists(array(user_id), x -> x > 1)",
    "url = 'column ghost'",
])
def test_filters_that_name_known_columns_pass(predicate: str) -> None:
    columns = ["user_id", "url", "_gs_op", "_kafka_topic", "_kafka_partition", "_kafka_offset",
               "_kafka_timestamp", "_kafka_key"]
    assert filter_column_problem(predicate, columns) is None


def test_filter_problem_names_the_column_with_a_suggestion() -> None:
    assert filter_column_problem("usr_id > 3", ["user_id", "url", "_gs_op"]) == (
        "column 'usr_id' does not exist (did you mean 'user_id'?)")
    assert filter_column_problem("this is not sql ((", ["a"]) is None  # left to the engine


def test_metadata_columns_need_include_metadata() -> None:
    problems = _problems(JSON_SOURCE % "primary_key: user_id\n        filter: \"_kafka_partition = 0\"" + """
    sinks:
      out: {type: print, from: clicks}
    """)
    assert problems == ["kafka source 'clicks': filter fails: column '_kafka_partition' does not exist "
                        "[sources.clicks.filter (line 9)] — fix the column name in 'filter'"]


def _sink(text: str, tmp_path: Path) -> KafkaSink:
    spec = _parse(text)
    settings = load_settings(environ={}, cwd=tmp_path)
    return KafkaSink(NodeContext(spec=spec.nodes["out"], settings=settings, primary_key=["id"]))


def test_producer_options_map_the_flush_interval_and_never_the_message_count(tmp_path: Path) -> None:
    sink = _sink("""
    sources:
      orders: {type: kafka, topic: orders, primary_key: id}
    sinks:
      out: {type: kafka, from: orders, topic: copy, batch_size: 500, batch_flush_interval: 250ms,
            compression: gzip, message_max_bytes: 2000000, parallelism: 2}
    """, tmp_path)
    assert sink.producer_options() == {"kafka.compression.type": "gzip", "kafka.linger.ms": "250",
                                       "kafka.max.request.size": "2000000"}
    assert "batch.num.messages" in sink.common_key_reason("batch_size")
    assert set(sink.ineffective_keys()) == {"batch_size"}  # parallelism: producers; the interval: linger.ms


KAFKA_BOTH = """
    sources:
      orders: {type: kafka, topic: orders, primary_key: id}
    sinks:
      out: {type: kafka, from: orders, topic: copy}
"""


def test_streamling_kafka_config_keys_load_and_say_why_they_do_nothing(tmp_path: Path) -> None:
    environ = {"STREAMLING__KAFKA_SOURCE__CONSUMER_FETCH_TIMEOUT_SEC": "5",
               "STREAMLING__KAFKA_SOURCE__STALL_WATCHDOG_TIMEOUT_SEC": "30",
               "STREAMLING__KAFKA_SOURCE__LAG_REPORT_INTERVAL_MS": "1000",
               "STREAMLING__KAFKA_SOURCE__CONSUMER_GROUP_ID": "shop",
               "STREAMLING__KAFKA_SINK__CONSUMER_GROUP_ID": "shop",
               "STREAMLING__KAFKA_SINK__LAG_REPORT_INTERVAL_MS": "1000"}
    settings = load_settings(environ=environ, cwd=tmp_path)
    assert settings.kafka_source.consumer_fetch_timeout_sec == 5
    warnings = settings_warnings(_parse(KAFKA_BOTH), settings)
    keys = [w.split(" ", 1)[0] for w in warnings]
    assert keys == ["kafka_source.lag_report_interval_ms", "kafka_source.consumer_fetch_timeout_sec",
                    "kafka_source.stall_watchdog_timeout_sec", "kafka_source.consumer_group_id",
                    "kafka_sink.consumer_group_id", "kafka_sink.lag_report_interval_ms"]
    assert "'shop-<node>'" in warnings[3]


def test_no_kafka_warnings_for_defaults_or_without_kafka_nodes(tmp_path: Path) -> None:
    assert settings_warnings(_parse(KAFKA_BOTH), load_settings(environ={}, cwd=tmp_path)) == []
    settings = load_settings(environ={"STREAMLING__KAFKA_SOURCE__CONSUMER_FETCH_TIMEOUT_SEC": "5"}, cwd=tmp_path)
    no_kafka = _parse("""
    sources:
      g: {type: generate, rows: 1}
    sinks:
      out: {type: print, from: g}
    """)
    assert settings_warnings(no_kafka, settings) == []


def test_group_id_follows_streamling_naming(tmp_path: Path) -> None:
    from streamling.sources.kafka import KafkaSource

    spec = _parse(KAFKA_BOTH)
    for environ, group in (({}, "local_app_v1.orders"), ({"STREAMLING__KAFKA_SOURCE__CONSUMER_GROUP_ID": "shop"},
                                                          "shop-orders")):
        ctx = NodeContext(spec=spec.nodes["orders"], settings=load_settings(environ=environ, cwd=tmp_path))
        assert KafkaSource(ctx).group_id == group


def test_reader_schema_ids_listed_skip_resolution_like_skip_schema_resolution(tmp_path: Path) -> None:
    from streamling.kafka.registry import RegisteredSchema
    from streamling.sources.kafka import KafkaSource

    spec = _parse("""
    sources:
      orders: {type: kafka, topic: orders, primary_key: id, skip_schema_resolution_for_reader_schema_ids: [7, 9]}
    sinks:
      out: {type: print, from: orders}
    """)
    source = KafkaSource(NodeContext(spec=spec.nodes["orders"], settings=load_settings(environ={}, cwd=tmp_path)))
    assert source._skips_resolution(RegisteredSchema(9, 3, {}))
    assert not source._skips_resolution(RegisteredSchema(8, 3, {}))


def test_a_hybrid_sources_live_filter_is_checked_like_a_kafka_sources() -> None:
    hybrid = """
    sources:
      orders:
        type: hybrid
        primary_key: id
        bounded_sources: [{source_type: clickhouse, table_name: orders}]
        unbounded_source: {source_type: kafka, topic: orders, data_format: json, schema: {id: int64, state: string},
                           filter: "%s"}
    sinks:
      a: {type: print, from: orders}
    """
    assert _problems(hybrid % "stat = 'open'") == [
        "hybrid source 'orders': filter fails: column 'stat' does not exist (did you mean 'state'?) "
        "[sources.orders.unbounded_source.filter (line 8)] — fix the column name in 'filter'"]
    assert _problems(hybrid % "id >") == [
        "hybrid source 'orders': filter: does not parse: incomplete expression near '>' "
        "[sources.orders.unbounded_source.filter (line 8)]"]


SOURCE_KEYS = {"STREAMLING__KAFKA_SOURCE__CONSUMER_FETCH_TIMEOUT_SEC": "5",
               "STREAMLING__KAFKA_SOURCE__CONSUMER_GROUP_ID": "shop"}

KAFKA_AND_HYBRID = """
    sources:
      orders: {type: kafka, topic: orders, primary_key: id, data_format: json, schema: {id: int64}}
      refunds: {type: kafka, topic: refunds, primary_key: id, data_format: json, schema: {id: int64}}
      both:
        type: hybrid
        primary_key: id
        bounded_sources: [{source_type: clickhouse, table_name: orders}]
        unbounded_source: {source_type: kafka, topic: orders, data_format: json, schema: {id: int64}}
    sinks:
      a: {type: blackhole, from: orders}
      b: {type: blackhole, from: refunds}
      c: {type: blackhole, from: both}
"""


def test_kafka_source_settings_are_said_by_the_kafka_and_hybrid_sources(tmp_path: Path) -> None:
    settings = load_settings(environ=SOURCE_KEYS, cwd=tmp_path)
    lines = KafkaSource.ineffective_settings(settings)
    assert [w.split(" ", 1)[0] for w in lines] == ["kafka_source.consumer_fetch_timeout_sec",
                                                    "kafka_source.consumer_group_id"]
    assert HybridSource.ineffective_settings(settings) == lines  # its live phase reads the topic
    assert KafkaSink.ineffective_settings(settings) == []


def test_each_settings_warning_is_said_once_however_many_sources_read_kafka(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = load_settings(environ=SOURCE_KEYS, cwd=tmp_path)
    assert settings_warnings(_parse(KAFKA_AND_HYBRID), settings) == KafkaSource.ineffective_settings(settings)
    caplog.set_level(logging.WARNING)
    build_plan(_parse(KAFKA_AND_HYBRID), settings, dry_run=True)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kafka_source.")]
    assert logged == KafkaSource.ineffective_settings(settings)


def test_a_consumer_key_on_the_sink_connection_is_said_by_the_kafka_sink(tmp_path: Path) -> None:
    settings = load_settings(environ={"STREAMLING__KAFKA_SINK__CONSUMER_GROUP_ID": "shop"}, cwd=tmp_path)
    assert KafkaSink.ineffective_settings(settings) == [
        "kafka_sink.consumer_group_id has no effect: it is a consumer setting and the sink only produces "
        "(Streamling ignores it there too)"]
    assert KafkaSource.ineffective_settings(settings) == []
    assert settings_warnings(_parse(KAFKA_BOTH), settings) == KafkaSink.ineffective_settings(settings)
