"""A checkpoint resumed by a pipeline with other transforms or sinks says so, once, instead of a
new sink silently writing nothing (its flow resumes after the rows the checkpoint already consumed)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from streamling.runtime import events as ev

FLOW_LOGGER = "streamling.runtime.flow"

ONE_SINK = """
    sources:
      orders: {type: generate, rows: 20, rows_per_batch: 10}
    sinks:
      out: {type: blackhole, from: orders}
"""
TWO_SINKS = """
    sources:
      orders: {type: generate, rows: 20, rows_per_batch: 10}
    sinks:
      out: {type: blackhole, from: orders}
      audit: {type: blackhole, from: orders}
"""


def _flow_json(state: Path) -> tuple[Path, dict]:
    [path] = sorted(state.glob("test_app/**/flow.json"))
    return path, json.loads(path.read_text())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == FLOW_LOGGER and r.levelno >= logging.WARNING]


def test_added_sink_on_a_reused_checkpoint_is_warned_once(runner, caplog):
    caplog.set_level(logging.INFO, logger=FLOW_LOGGER)
    runner.run(ONE_SINK)
    last = max(e.epoch for e in runner.of_type(ev.EpochFinalized))
    _, meta = _flow_json(runner.tmp_path / "state")
    assert set(meta["topology"]["sinks"]) == {"out"} and meta["topology"]["transforms"] == {}
    assert meta["topology"]["sinks"]["out"]["type"] == "blackhole"
    assert _warnings(caplog) == []

    runner.events.clear()
    runner.run(TWO_SINKS)
    [warning] = _warnings(caplog)
    assert "new sink 'audit' (blackhole)" in warning
    assert f"only see rows after epoch {last}" in warning
    assert "orders {" in warning  # the committed offsets the new sink starts from
    assert "new application_id" in warning and "'test_app'" in warning
    assert runner.of_type(ev.EpochFlushed) == []  # the run resumed: audit saw none of the 20 rows
    _, meta = _flow_json(runner.tmp_path / "state")
    assert set(meta["topology"]["sinks"]) == {"out", "audit"}  # adopted: said once, not on every restart

    caplog.clear()
    runner.run(TWO_SINKS)
    assert _warnings(caplog) == []


def test_changed_sql_transform_resumes_with_a_warning(runner, caplog):
    template = """
        sources:
          orders: {{type: generate, rows: 20, rows_per_batch: 10}}
        transforms:
          big: {{type: sql, sql: "SELECT * FROM orders WHERE amount > {limit}"}}
        sinks:
          out: {{type: blackhole, from: big}}
    """
    runner.run(template.format(limit=10))
    caplog.set_level(logging.INFO, logger=FLOW_LOGGER)
    runner.run(template.format(limit=20))  # a normal redeploy: not refused
    [warning] = _warnings(caplog)
    assert "nodes: changed transform 'big' (sql)." in warning  # the sink is unchanged
    assert "after epoch" in warning


def test_flow_json_without_topology_still_loads(runner, caplog):
    runner.run(ONE_SINK)
    path, meta = _flow_json(runner.tmp_path / "state")
    del meta["topology"]  # as written before topologies were recorded
    path.write_text(json.dumps(meta))
    caplog.set_level(logging.INFO, logger=FLOW_LOGGER)
    runner.run(ONE_SINK)
    [warning] = _warnings(caplog)
    assert "does not record the transforms and sinks" in warning and "new application_id" in warning
    _, meta = _flow_json(runner.tmp_path / "state")
    assert meta["sink_token"] and set(meta["topology"]["sinks"]) == {"out"}
