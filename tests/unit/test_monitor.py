"""The notebook monitor's state, fed synthetic runtime events (no Spark, no browser, no kernel)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import queue
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from streamling.notebook import monitor as mon
from streamling.notebook.monitor import Monitor, json_safe, plan_graph
from streamling.notebook.widget import PUSH_INTERVAL_SECS
from streamling.runtime import events as ev

DESCRIPTION: dict[str, Any] = {
    "flows": [
        {"name": "orders", "sources": ["orders"], "transforms": ["big"], "sinks": ["out"], "bounded": False},
        {"name": "clicks", "sources": ["clicks"], "transforms": [], "sinks": ["audit"], "bounded": False},
    ],
    "nodes": {
        "orders": {"kind": "source", "type": "generate", "upstream": [], "primary_key": ["id"],
                   "schema": ["id bigint", "amount double"]},
        "big": {"kind": "transform", "type": "sql", "upstream": ["orders"], "primary_key": ["id"],
                "schema": ["id bigint", "amount double"]},
        "out": {"kind": "sink", "type": "blackhole", "upstream": ["big"], "primary_key": [], "schema": None},
        "clicks": {"kind": "source", "type": "generate", "upstream": [], "primary_key": [], "schema": None},
        "audit": {"kind": "sink", "type": "print", "upstream": ["clicks"], "primary_key": [], "schema": None},
    },
}


def _monitor() -> Monitor:
    return Monitor.for_plan(DESCRIPTION, title="orders demo")


def _epoch(m: Monitor, flow: str, epoch: int) -> dict[str, Any]:
    return next(e for e in m.epochs if e["flow"] == flow and e["epoch"] == epoch)


def _run_epoch(m: Monitor, flow: str, source: str, sink: str, epoch: int, at: float, rows: int = 500) -> None:
    m.handle(ev.EpochPlanned(flow, epoch=epoch, at=at))
    m.handle(ev.EpochFlushed(flow, epoch=epoch, rows={sink: rows // 2},
                             durations_ms={"transforms": 12.0, sink: 30.0, "total": 45.5}, at=at + 0.2))
    m.handle(ev.EpochFinalized(flow, epoch=epoch, input_rows=rows, offsets={source: {"offset": rows * (epoch + 1)}},
                               durations_ms={"triggerExecution": 400, "addBatch": 300},
                               input_rows_per_second=1000.0, processed_rows_per_second=1250.0, at=at + 0.3))


# --- the plan picture -------------------------------------------------------------------------------


def test_graph_from_plan_layers_nodes_by_depth() -> None:
    m = _monitor()
    nodes = {n["name"]: n for n in m.graph["nodes"]}
    assert {n: nodes[n]["depth"] for n in nodes} == {"orders": 0, "big": 1, "out": 2, "clicks": 0, "audit": 1}
    assert nodes["big"]["flow"] == "orders" and nodes["big"]["schema"] == ["id bigint", "amount double"]
    assert sorted(m.graph["edges"]) == [["big", "out"], ["clicks", "audit"], ["orders", "big"]]
    assert m.title == "orders demo"
    assert m.selected_node == "big"  # the last transform: the sinks' input


def test_diamond_depth_is_the_longest_path() -> None:
    graph = plan_graph({"flows": [], "nodes": {
        "a": {"kind": "source", "type": "generate", "upstream": []},
        "b": {"kind": "transform", "type": "sql", "upstream": ["a"]},
        "c": {"kind": "transform", "type": "sql", "upstream": ["a", "b"]},
        "d": {"kind": "sink", "type": "print", "upstream": ["c"]},
    }})
    assert {n["name"]: n["depth"] for n in graph["nodes"]} == {"a": 0, "b": 1, "c": 2, "d": 3}


def test_front_end_assets_are_found_with_the_shared_prelude() -> None:
    js, css = Monitor._esm, Monitor._css
    assert "function h(tag" in js and "export default" in js and 'data-testid": "sl-monitor"' in js
    assert js.index("function h(tag") < js.index("function render(")
    assert "--sl-fg" in css and ".sl-monitor h4" in css


# --- events ----------------------------------------------------------------------------------------


def test_epoch_states_progress_from_several_threads() -> None:
    """Each flow's foreachBatch thread plans and flushes; a listener thread finalizes, like Spark."""
    m = _monitor()
    seen: dict[tuple[str, int], list[str]] = {}
    lock = threading.Lock()

    def record(change: dict[str, Any]) -> None:
        with lock:
            for e in change["new"]:
                states = seen.setdefault((e["flow"], e["epoch"]), [])
                if not states or states[-1] != e["state"]:
                    states.append(e["state"])

    m.observe(record, names="epochs")
    commits: queue.Queue[ev.Event | None] = queue.Queue()

    def listener() -> None:
        while (event := commits.get()) is not None:
            m.handle(event)

    def flow(name: str, source: str, sink: str) -> None:
        m.handle(ev.FlowStarted(name, query_id=name, sources=[source], sinks=[sink], bounded=False))
        for epoch in range(20):
            m.handle(ev.EpochPlanned(name, epoch=epoch))
            time.sleep(0.005)
            m.handle(ev.RowsSampled(name, epoch=epoch, node=source, columns=["id"], rows=[{"id": epoch}], count=10))
            m.handle(ev.EpochFlushed(name, epoch=epoch, rows={sink: 10}, durations_ms={"total": 1.0}))
            commits.put(ev.EpochFinalized(name, epoch=epoch, input_rows=10, offsets={source: epoch},
                                          durations_ms={}, input_rows_per_second=5.0, processed_rows_per_second=9.0))
            time.sleep(0.005)

    listen = threading.Thread(target=listener)
    listen.start()
    flows = [threading.Thread(target=flow, args=args) for args in (("orders", "orders", "out"),
                                                                    ("clicks", "clicks", "audit"))]
    for t in flows:
        t.start()
    for t in flows:
        t.join(30)
    commits.put(None)
    listen.join(30)
    m.flush()

    assert len(m.epochs) == 40
    assert {e["state"] for e in m.epochs} == {"finalized"}
    for states in seen.values():
        # pushes are throttled, so a state may be skipped, but never go back
        ranks = [mon._STATE_RANK[s] for s in states]
        assert ranks == sorted(ranks)
    assert m.node_stats["orders"]["rows"] == 200 and m.node_stats["audit"]["rows"] == 200
    assert len(m.rates) == 40
    assert m.status == "running"


def test_epoch_record_holds_durations_rows_and_offsets() -> None:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=100.0))
    m.handle(ev.EpochPlanned("orders", epoch=0, at=101.0))
    m.flush()
    assert _epoch(m, "orders", 0)["state"] == "planned"
    m.handle(ev.EpochFlushed("orders", epoch=0, rows={"out": 250}, durations_ms={"transforms": 12, "out": 30,
                                                                                 "total": 45.55}, at=101.2))
    m.flush()
    assert _epoch(m, "orders", 0)["state"] == "flushed"
    m.handle(ev.EpochFinalized("orders", epoch=0, input_rows=500, offsets={"orders": {"offset": 500}},
                               durations_ms={"triggerExecution": 400}, input_rows_per_second=1000.0,
                               processed_rows_per_second=1250.0, at=101.3))
    m.flush()
    assert _epoch(m, "orders", 0) == {
        "flow": "orders", "epoch": 0, "state": "finalized", "planned_at": 101.0, "flushed_at": 101.2,
        "finalized_at": 101.3, "durations_ms": {"transforms": 12.0, "out": 30.0, "total": 45.5},
        "spark_ms": {"triggerExecution": 400.0}, "rows": {"out": 250}, "input_rows": 500,
        "offsets": {"orders": {"offset": 500}}, "input_rate": 1000.0, "processing_rate": 1250.0}
    # The chart's input is the source's rows/s as its node box shows it (500 rows in 1.3 s since the
    # start); processing stays Spark's rows per second of batch time.
    assert m.rates == [{"t": 101.3, "flow": "orders", "input": 384.6, "processing": 1250.0}]
    assert m.node_stats["orders"]["rows_per_sec"] == 384.6


def test_the_rate_chart_and_the_source_box_agree() -> None:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=0.0))
    for epoch, rows in enumerate([100, 300, 50, 700]):
        at = 2.0 * (epoch + 1)
        m.handle(ev.EpochPlanned("orders", epoch=epoch, at=at - 1))
        m.handle(ev.EpochFlushed("orders", epoch=epoch, rows={"out": rows}, durations_ms={"total": 5},
                                 node_rows={"orders": rows, "big": rows}, at=at - 0.5))
        m.handle(ev.EpochFinalized("orders", epoch=epoch, input_rows=rows, offsets={}, durations_ms={},
                                   input_rows_per_second=9999.0, processed_rows_per_second=1.0, at=at))
        m.flush()
        assert m.rates[-1]["input"] == m.node_stats["orders"]["rows_per_sec"]
    assert m.rates[-1]["input"] == round(1150 / 7.5, 1)


def test_spark_progress_is_sent_on_request_and_buttons_call_the_controller() -> None:
    m = _monitor()
    sent: list[dict[str, Any]] = []
    m.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=0.0))
    m.handle(ev.EpochPlanned("orders", epoch=0, at=1.0))
    m.handle(ev.EpochFlushed("orders", epoch=0, rows={"out": 1}, durations_ms={"total": 5}, at=1.5))
    progress = {"batchId": 0, "durationMs": {"triggerExecution": 40}, "sources": [{"endOffset": "{\"v\":1}"}]}
    m.handle(ev.EpochFinalized("orders", epoch=0, input_rows=1, offsets={}, durations_ms={}, progress=progress, at=2.0))
    m._handle_custom_msg({"action": "ping"}, [])
    m._handle_custom_msg({"action": "progress", "flow": "orders", "epoch": 0}, [])
    m._handle_custom_msg({"action": "progress", "flow": "orders", "epoch": 7}, [])
    assert sent[0] == {"type": "pong"}
    assert json.loads(sent[1]["json"]) == progress and sent[1]["epoch"] == 0
    assert sent[2]["json"] is None

    assert m.controls == []
    m._handle_custom_msg({"action": "stop"}, [])  # no controller: nothing happens
    pressed: queue.Queue[str] = queue.Queue()

    def controller(action: str) -> None:
        pressed.put(action)
        if action == "restart":
            raise ValueError("cell 'big' no longer validates")

    m.set_controller(controller)
    assert m.controls == ["stop", "restart"]
    m._handle_custom_msg({"action": "stop"}, [])
    m._handle_custom_msg({"action": "restart"}, [])
    m._handle_custom_msg({"action": "rm -rf"}, [])
    assert {pressed.get(timeout=5), pressed.get(timeout=5)} == {"stop", "restart"}
    deadline = time.monotonic() + 5
    while not (m.error and "restart failed" in m.error["message"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.error is not None and "no longer validates" in m.error["message"]
    assert pressed.empty()


def test_a_node_choice_applies_in_its_views_order_and_a_restart_keeps_it() -> None:
    m = _monitor()
    sent: list[dict[str, Any]] = []
    m.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    assert m.selected_node == "big"
    m._handle_custom_msg({"action": "select", "node": "orders", "view": "a", "seq": 2}, [])
    m._handle_custom_msg({"action": "select", "node": "big", "view": "a", "seq": 1}, [])  # overtaken: ignored
    m._handle_custom_msg({"action": "select", "node": "out", "view": "a", "seq": 3}, [])  # a sink: no rows
    m._handle_custom_msg({"action": "select", "node": "nope", "view": "a", "seq": 4}, [])
    m._handle_custom_msg({"action": "select", "node": "big", "view": "a", "seq": "x"}, [])
    assert m.selected_node == "orders" and sent == [{"type": "selected", "node": "orders"}]
    m._handle_custom_msg({"action": "select", "node": "clicks", "view": "b", "seq": 1}, [])  # a reloaded page
    assert m.selected_node == "clicks"
    m.reset(DESCRIPTION)  # the monitor's Restart: the kernel's copy of the choice is the user's
    assert m.selected_node == "clicks"


def test_the_run_start_is_kept_for_a_saved_monitor_to_show() -> None:
    m = _monitor()
    assert m.started_at is None
    m.handle(ev.FlowStarted("clicks", query_id="q2", sources=["clicks"], sinks=["audit"], bounded=False,
                            at=1_700_000_050.0))
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False,
                            at=1_700_000_000.0))
    with m._lock:
        m._push()
    assert m.started_at == 1_700_000_000.0  # the first flow's start is the run's


def test_reset_starts_a_new_run_over() -> None:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=0.0))
    m.handle(ev.EpochPlanned("orders", epoch=0, at=1.0))
    m.handle(ev.EpochFlushed("orders", epoch=0, rows={"out": 5}, durations_ms={"total": 5},
                             node_rows={"orders": 5}, at=1.5))
    m.show_error("boom")
    edited = {"flows": [DESCRIPTION["flows"][0]],
              "nodes": {k: v for k, v in DESCRIPTION["nodes"].items() if k in ("orders", "big", "out")}}
    m.reset(edited)
    assert (m.epochs, m.node_stats, m.samples, m.rates, m.error, m.status) == ([], {}, {}, [], None, "starting")
    assert sorted(n["name"] for n in m.graph["nodes"]) == ["big", "orders", "out"]
    assert m.selected_node == "big"


def test_a_progress_report_for_an_epoch_in_flight_is_not_its_commit() -> None:
    m = _monitor()
    m.handle(ev.EpochPlanned("orders", epoch=3))
    m.handle(ev.EpochFinalized("orders", epoch=3, input_rows=0, offsets={}, durations_ms={}))
    m.flush()
    assert _epoch(m, "orders", 3)["state"] == "planned"


def test_a_replayed_epoch_starts_over() -> None:
    m = _monitor()
    _run_epoch(m, "orders", "orders", "out", 0, at=10.0)
    m.handle(ev.EpochPlanned("orders", epoch=0, at=20.0))
    m.flush()
    assert _epoch(m, "orders", 0)["state"] == "planned" and _epoch(m, "orders", 0)["planned_at"] == 20.0


def test_node_rows_and_rates() -> None:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=100.0))
    for epoch in range(4):  # epochs finalize at 101.3, 102.3, 103.3, 104.3
        _run_epoch(m, "orders", "orders", "out", epoch, at=101.0 + epoch)
        m.handle(ev.RowsSampled("orders", epoch=epoch, node="big", columns=["id"], rows=[], count=100,
                                at=101.1 + epoch))
    m.flush()
    stats = m.node_stats
    assert stats["orders"]["rows"] == 2000 and stats["orders"]["last_rows"] == 500
    assert stats["orders"]["rows_per_sec"] == pytest.approx(2000 / 4.3, abs=0.1)
    assert stats["out"]["rows"] == 1000 and stats["out"]["rows_per_sec"] == pytest.approx(1000 / 4.2, abs=0.1)
    assert stats["big"]["rows"] == 400 and stats["big"]["last_epoch"] == 3
    assert "clicks" not in stats


def test_an_exact_count_wins_over_spark_input_rows() -> None:
    m = _monitor()
    m.handle(ev.RowsSampled("orders", epoch=0, node="orders", columns=["id"], rows=[], count=480))
    _run_epoch(m, "orders", "orders", "out", 0, at=time.time())
    m.flush()
    assert m.node_stats["orders"]["rows"] == 480


def test_only_the_last_epochs_and_rates_are_kept() -> None:
    m = _monitor()
    for epoch in range(130):
        _run_epoch(m, "orders", "orders", "out", epoch, at=1000.0 + epoch)
    m.flush()
    assert [e["epoch"] for e in m.epochs] == list(range(80, 130))
    assert len(m.rates) == 120 and m.rates[-1]["t"] == 1129.3
    assert m.node_stats["orders"]["rows"] == 130 * 500  # totals survive the trimming


def test_samples_are_json_safe() -> None:
    m = _monitor()
    rows = [{"id": 2**60, "amount": decimal.Decimal("12.50"), "ts": dt.datetime(2024, 5, 1, 12, 30),
             "day": dt.date(2024, 5, 1), "raw": b"\x00\xff", "ratio": math.nan, "tags": ["a", None],
             "nested": {"at": dt.datetime(2024, 1, 1), "n": 1}, "none": None, "text": "x" * 500}]
    table = pa.table({"id": [2**60]})
    m.handle(ev.RowsSampled("orders", epoch=7, node="big", columns=list(rows[0]), rows=rows * 30, count=900,
                            table=table, at=5.0))
    m.flush()
    sample = m.samples["big"]
    json.dumps(sample, allow_nan=False)
    assert sample["epoch"] == 7 and sample["count"] == 900 and sample["types"] == ["int64"]
    assert len(sample["rows"]) == mon.MAX_SAMPLE_ROWS
    row = sample["rows"][0]
    assert row["id"] == str(2**60) and row["amount"] == "12.50" and row["ts"] == "2024-05-01 12:30:00"
    assert row["day"] == "2024-05-01" and row["raw"] == "0x00ff" and row["ratio"] == "nan"
    assert row["tags"] == ["a", None] and row["nested"] == {"at": "2024-01-01 00:00:00", "n": 1}
    assert row["none"] is None and len(row["text"]) == 201
    assert json_safe(7) == 7 and json_safe(1.5) == 1.5 and json_safe(True) is True


def test_errors_status_and_recovery() -> None:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False))
    m.handle(ev.PipelineError("orders", node="out", message="connection refused", retriable=True, attempt=2))
    m.flush()
    assert m.error is not None and m.error["retriable"] and not m.error["resolved"]
    assert m.status == "running"
    _run_epoch(m, "orders", "orders", "out", 0, at=time.time())
    m.flush()
    assert m.error["resolved"]
    assert "(recovered, attempt 2): connection refused" in m.summary_text()
    m.handle(ev.PipelineError("orders", node="big", message="division by zero <b>", retriable=False))
    assert m.status == "failed"  # pushed at once, not throttled
    assert m.error["node"] == "big" and m.error["message"] == "division by zero <b>"


def test_status_follows_flows_and_set_status() -> None:
    m = _monitor()
    assert m.status == "starting"
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False))
    m.handle(ev.FlowStarted("clicks", query_id="c", sources=["clicks"], sinks=["audit"], bounded=False))
    m.handle(ev.FlowStopped("orders", reason="stop requested"))
    assert m.status == "running"  # the clicks flow still runs
    m.handle(ev.FlowStopped("clicks", reason="stop requested"))
    assert m.status == "stopped (stop requested)"
    m.set_status("finished")
    assert m.status == "finished"


def test_pushes_are_throttled_and_the_last_state_always_arrives() -> None:
    m = _monitor()
    pushes: list[int] = []
    m.observe(lambda change: pushes.append(len(change["new"])), names="epochs")
    started = time.monotonic()
    for epoch in range(200):
        m.handle(ev.EpochPlanned("orders", epoch=epoch))
    elapsed = time.monotonic() - started
    assert len(pushes) <= 2 + elapsed / PUSH_INTERVAL_SECS
    deadline = time.monotonic() + 5
    while (not m.epochs or m.epochs[-1]["epoch"] != 199) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert m.epochs[-1]["epoch"] == 199  # the trailing timer pushed the final state


def test_event_of_an_unknown_kind_is_ignored() -> None:
    m = _monitor()
    m.handle(ev.Event("orders"))
    m.flush()
    assert m.epochs == [] and m.status == "starting"


# --- headless summaries ----------------------------------------------------------------------------


def _ran() -> Monitor:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=100.0))
    for epoch in range(7):
        _run_epoch(m, "orders", "orders", "out", epoch, at=101.0 + epoch)
    m.handle(ev.EpochPlanned("orders", epoch=7, at=108.0))
    m.handle(ev.PipelineError("orders", node="out", message="sink <down> & out", retriable=False, at=108.5))
    return m


def test_summary_text() -> None:
    text = _ran().summary_text()
    lines = text.splitlines()
    assert lines[0] == "streamling monitor: orders demo"
    assert lines[1] == "status: failed"
    assert any(line.split()[:3] == ["orders", "source/generate", "3,500"] for line in lines)
    assert any(line.split()[:3] == ["out", "sink/blackhole", "1,750"] for line in lines)
    assert "epochs (last 5 of 8):" in text
    assert "#7 orders planned" in text and "#6 orders finalized" in text and "#2 orders" not in text
    assert 'offsets orders={"offset":3500}' in text
    assert "sinks out=250" in text and "transforms 12 ms" in text and "total 46 ms" in text
    assert text.endswith("error in orders node out: sink <down> & out")


def test_summary_html_is_escaped() -> None:
    page = _ran().summary_html()
    assert page.startswith('<div class="sl-summary">') and page.endswith("</div>")
    assert "sink &lt;down&gt; &amp; out" in page and "<down>" not in page
    assert "<td>orders</td><td>source</td><td>generate</td><td>3,500</td>" in page
    assert "<td>6</td><td>orders</td><td>finalized</td><td>500</td><td>out=250</td>" in page


def test_mimebundle_has_the_widget_and_summaries() -> None:
    m = _ran()
    data, _metadata = m._repr_mimebundle_()
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == m.model_id
    assert data["text/plain"] == m.summary_text()
    assert data["text/html"] == m.summary_html()


def test_node_counts_and_expectations_come_from_the_flushed_epoch() -> None:
    m = _monitor()
    m.handle(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=100.0))
    for epoch in range(2):
        m.handle(ev.EpochPlanned("orders", epoch=epoch, at=101.0 + epoch))
        m.handle(ev.EpochFlushed("orders", epoch=epoch, rows={"out": 80}, durations_ms={}, at=101.5 + epoch,
                                 node_rows={"orders": 100, "big": 80},
                                 expectations={"big": {"positive": {"passed": 80, "failed": 20, "action": "drop"}}}))
    m.flush()
    assert m.node_stats["big"]["rows"] == 160 and m.node_stats["orders"]["rows"] == 200
    assert m.node_stats["big"]["expectations"] == {"positive": {"passed": 160, "failed": 40, "action": "drop"}}
    assert "expectation positive (drop): 160 passed, 40 failed" in m.summary_text()


def test_with_the_runs_stats_the_monitor_shows_their_totals() -> None:
    from streamling.telemetry.stats import RunStats

    m = _monitor()
    m.stats = RunStats(application_id="app")
    for handler in (m.stats, m.handle):  # the bus feeds both
        handler(ev.FlowStarted("orders", query_id="q", sources=["orders"], sinks=["out"], bounded=False, at=100.0))
        handler(ev.EpochPlanned("orders", epoch=0, at=101.0))
        handler(ev.EpochFlushed("orders", epoch=0, rows={"out": 70}, durations_ms={}, at=101.5,
                                node_rows={"orders": 100, "big": 70},
                                expectations={"big": {"positive": {"passed": 70, "failed": 30, "action": "drop"}}}))
    m.flush()
    assert {n: m.node_stats[n]["rows"] for n in ("orders", "big", "out")} == {"orders": 100, "big": 70, "out": 70}
    assert m.node_stats["big"]["expectations"]["positive"]["failed"] == 30


def test_sampling_is_held_to_its_share_of_the_run() -> None:
    bus = ev.EventBus()
    bus.sample_rows, bus.sample_share = 20, 0.05
    assert bus.wants_sample("f")  # the first epoch always
    bus.sampled("f", 30.0)  # a cold first sample sets no budget: the next epoch is sampled warm
    assert bus.wants_sample("f")
    bus.sampled("f", 0.01)  # 10 ms of samples: the next no sooner than 200 ms later
    assert not bus.wants_sample("f")
    time.sleep(0.25)
    assert bus.wants_sample("f")
    bus.sample_share = 0.0  # no share: every epoch
    assert bus.wants_sample("f") and bus.wants_sample("f")


def test_a_run_s_states_drive_the_status_the_heartbeat_and_the_saved_output(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamling.notebook import widget

    monkeypatch.setattr(widget, "BEAT_SECS", 0.02)
    m = _monitor()
    updates: list[str] = []

    class Handle:  # IPython's DisplayHandle of the cell output showing the monitor
        def update(self, obj: Any) -> None:
            updates.append(obj._repr_mimebundle_()[0]["text/plain"].splitlines()[1])

    m.display_handle = Handle()
    m.show_state("starting", None)
    m.show_state("running", None)
    # the kernel side beats while the run lives: the front end knows it is live without a ping answer
    deadline = time.monotonic() + 5
    while m.beat < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.beat >= 3 and m.status == "running" and updates == []
    m.show_state("stopping", "stopped from the notebook")
    assert m.status == "stopping"
    m.show_state("failed", "sql transform 'big': SQL fails: column 'amout' does not exist")
    assert m.status == "failed: sql transform 'big': SQL fails: column 'amout' does not exist"
    # the output's fallback now tells the end of the run, not "running"
    assert updates == ["status: failed: sql transform 'big': SQL fails: column 'amout' does not exist"]
    beat = m.beat
    time.sleep(0.1)
    assert m.beat == beat  # no heartbeat once the run ended
