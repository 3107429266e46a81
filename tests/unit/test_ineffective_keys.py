"""Keys Streamling documents are accepted so pipelines load unchanged; those that do nothing on
Spark are reported (the log, and ``--validate``'s warnings), never silently ignored."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streamling.config import load_settings
from streamling.errors import StreamlingError, ValidationError
from streamling.plugins.registry import ids as plugin_ids
from streamling.runtime.planner import build_plan
from streamling.spec import parse_pipeline

PIPELINE = """
sources:
  orders: {type: generate, rows: 10, primary_key: id, parallelism: 2}
transforms:
  big: {type: sql, sql: "SELECT * FROM orders", parallelism: 3,
        telemetry: {event_time: {column: ts}, labels: {team: data}}}
sinks:
  out: {type: print, from: big, parallelism: 3, batch_flush_interval: 2s}
  lake: {type: delta, from: big, path: /tmp/lake, parallelism: 2, batch_size: 500}
"""


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_node_keys_without_effect_are_named_with_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    build_plan(parse_pipeline(PIPELINE), load_settings(environ={}, cwd=tmp_path), dry_run=True)
    warnings = _warnings(caplog)
    assert any(w.startswith("print sink 'out': 'parallelism' has no effect here: a print sink writes each epoch "
                            "from the driver") for w in warnings)
    assert any(w.startswith("print sink 'out': 'batch_flush_interval' has no effect here: on Spark a node "
                            "handles a whole epoch at once") for w in warnings)
    assert any(w.startswith("delta sink 'lake': 'batch_size' has no effect here") for w in warnings)
    assert not any("telemetry" in w for w in warnings)  # labels and event time are exported as metrics
    assert any(w.startswith("delta sink 'lake': 'parallelism' has no effect here: a keyed delta sink writes with "
                            "MERGE") for w in warnings)  # keyed through its input; append-only delta honours it
    # honoured: sources and transforms are spread over that many Spark partitions
    assert not any("'parallelism'" in w and ("orders" in w or "'big'" in w) for w in warnings)
    assert len(warnings) == 4


def test_config_keys_without_effect_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    (tmp_path / "config.yaml").write_text("internal_buffer_size: 20\nplugin: {channel_capacity: 10}\n"
                                          "drain_policy: fast\nrecord_batch_interval_ms: 50\n")
    settings = load_settings(environ={}, cwd=tmp_path)
    build_plan(parse_pipeline("sources: {s: {type: generate, rows: 1}}\nsinks: {o: {type: blackhole, from: s}}"),
               settings, dry_run=True)
    warnings = _warnings(caplog)
    for key in ("internal_buffer_size", "plugin.channel_capacity", "drain_policy", "record_batch_interval_ms"):
        assert any(w.startswith(f"config key '{key}' has no effect here: ") for w in warnings), key
    assert len(warnings) == 4


def test_defaults_warn_about_nothing(tmp_path: Path) -> None:
    assert load_settings(environ={}, cwd=tmp_path).ineffective_keys() == []


def test_unknown_config_sections_are_rejected_like_unknown_pipeline_keys(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("kafka_sorce: {brokers: 'x:9092'}\n")
    with pytest.raises(StreamlingError) as info:
        load_settings(environ={}, cwd=tmp_path)
    assert info.value.headline().startswith(
        "invalid configuration: kafka_sorce: unknown key (did you mean 'kafka_source',")


@pytest.mark.parametrize(("type_name", "message"), [
    ("acme_api.orders_source", "source 'src': source type 'acme_api.orders_source' is not available: no "
                               "installed plugin provides it (installed source plugins: {installed})"),
    ("delta", "source 'src': source type 'delta' is not available in this build yet; available source "
              "types: clickhouse, file, generate, hybrid, kafka"),
])
def test_types_that_are_not_available_say_so(type_name: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_pipeline(f"sources: {{src: {{type: {type_name}}}}}\nsinks: {{o: {{type: blackhole, from: src}}}}")
    installed = ", ".join(plugin_ids("source"))  # the example plugins, and any a test loaded earlier
    assert info.value.problems[0].headline().split(" [")[0] == message.format(installed=installed)


def test_start_at_says_a_checkpoint_wins_over_it_with_a_durable_backend(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    pipeline = """
sources:
  history: {type: clickhouse, table_name: orders, start_at: 1000, primary_key: id}
  both:
    type: hybrid
    primary_key: id
    bounded_sources: [{source_type: clickhouse, table_name: orders, start_at: "2024-01-01"}]
    unbounded_source: {source_type: kafka, topic: orders, data_format: json, schema: {id: int64}}
sinks:
  a: {type: blackhole, from: history}
  b: {type: blackhole, from: both}
"""
    # InMemory (the default) starts every run over, at start_at, as Streamling does: nothing to say.
    build_plan(parse_pipeline(pipeline), load_settings(environ={}, cwd=tmp_path), dry_run=True)
    assert not [w for w in _warnings(caplog) if "start_at" in w]
    caplog.clear()
    durable = load_settings(environ={"STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Sqlite"}, cwd=tmp_path)
    build_plan(parse_pipeline(pipeline), durable, dry_run=True)
    warnings = _warnings(caplog)
    assert sorted(w.split(":")[0] for w in warnings if "start_at" in w) == ["clickhouse source 'history'",
                                                                             "hybrid source 'both'"]
    assert any("'bounded_sources[0].start_at' has no effect here: with a durable state_backend, once a checkpoint "
               "exists a restart resumes after the last finalized page" in w for w in warnings)
