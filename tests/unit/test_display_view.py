"""``%streamling display``: the result view fed synthetic runtime events (no Spark, no browser)."""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamling.notebook.cells import USAGE
from streamling.notebook.display import ResultView
from streamling.notebook.magics import PipelineError, StreamlingMagics
from streamling.notebook.session import NotebookPipeline
from streamling.runtime import events as ev


def _sample(epoch: int, ids: list[int], node: str = "big", count: int | None = None) -> ev.RowsSampled:
    table = pa.table({"id": pa.array(ids, pa.int64()), "amount": pa.array([i * 1.5 for i in ids], pa.float64())})
    return ev.RowsSampled("orders", epoch=epoch, node=node, columns=table.column_names, rows=table.to_pylist(),
                          count=count, table=table)


def _view(limit: int = 5, **follow: Any) -> ResultView:
    view = ResultView("big", "transform", limit=limit)
    view.follow(**{"flow": "orders", "sampled": ["big"], "reader": None, "caption": "latest rows of big", **follow})
    return view


def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the view did not update in time"
        time.sleep(0.02)


def test_sampled_rows_show_the_newest_epoch_first_up_to_the_limit() -> None:
    view = _view(limit=5)
    view.handle(_sample(1, [0, 1, 2]))
    view.handle(_sample(2, [3, 4, 5], count=3000))
    view.handle(_sample(2, [99], node="other"))  # another node's sample is not this view's
    view.flush()
    assert view.columns == ["id", "amount"] and view.types == ["int64", "double"] and view.limit == 5
    assert [r[0] for r in view.rows] == [3, 4, 5, 0, 1]
    assert (view.epoch, view.first_epoch, view.count) == (2, 1, 3000)
    assert view.status == "running"

    view.handle(_sample(3, list(range(10, 17))))  # one epoch fills the limit: older epochs drop out
    view.handle(_sample(4, []))  # an idle epoch keeps the rows shown and says so
    view.flush()
    assert [r[0] for r in view.rows] == [10, 11, 12, 13, 14]
    assert (view.epoch, view.first_epoch, view.latest_epoch) == (3, 3, 4)
    assert view.headline().startswith("5 rows · epoch 3 · no rows since (epoch 4)")


def test_headless_renderers_get_the_rows_as_text_and_html() -> None:
    view = _view(limit=10)
    table = pa.table({"id": [7, 8], "name": ["<b>bold</b>", None]})
    view.handle(ev.RowsSampled("orders", epoch=4, node="big", columns=["id", "name"], rows=table.to_pylist(),
                               table=table))
    data, _ = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    text = data["text/plain"]
    assert "streamling display: transform 'big' · running" in text and "latest rows of big" in text
    assert "2 rows · epoch 4" in text and "<b>bold</b>" in text and "null" in text
    assert "&lt;b&gt;bold&lt;/b&gt;" in data["text/html"] and "<b>bold</b>" not in data["text/html"]
    assert data["text/html"].count("<tr>") == 3  # header and two rows


class _Reader:
    """A sink target that records which thread read it."""

    caption = "rows of table t"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.threads: list[str] = []

    def read(self, limit: int) -> tuple[pa.Table, list[str]]:
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise ConnectionError("connection refused")
        return pa.table({"id": [3, 2, 1][:limit]}), ["bigint"]

    def error_text(self, exc: BaseException) -> str:
        return f"querying t failed: {exc}"

    def close(self) -> None:
        return None


def test_a_sink_target_is_queried_off_the_event_thread_after_each_committed_epoch() -> None:
    reader = _Reader()
    view = _view(limit=2, sampled=[], reader=reader, caption=reader.caption)
    view.handle(ev.EpochFinalized("clicks", epoch=9, input_rows=1, offsets={}, durations_ms={}))  # another flow
    view.handle(_sample(3, [1, 2]))  # the sink's input is not what it wrote
    time.sleep(0.2)
    assert reader.threads == [] and view.rows == []

    view.handle(ev.EpochFinalized("orders", epoch=3, input_rows=10, offsets={}, durations_ms={}))
    _until(lambda: view.rows == [[3], [2]])
    assert view.types == ["bigint"] and view.epoch == 3 and view.caption == "rows of table t"
    assert reader.threads and threading.current_thread().name not in reader.threads

    failing = _Reader(fail=True)
    view.follow(flow="orders", sampled=[], reader=failing, caption=failing.caption)
    view.handle(ev.EpochFinalized("orders", epoch=4, input_rows=10, offsets={}, durations_ms={}))
    _until(lambda: view.error != "")
    assert view.error.startswith("querying t failed: connection refused — the pipeline is not affected")
    assert view.rows == [[3], [2]]  # the last good read stays
    view.detach()


def test_parquet_download_answers_with_the_rows_and_their_exact_types(monkeypatch: pytest.MonkeyPatch) -> None:
    view = _view(limit=10)
    sent: list[tuple[dict[str, Any], list[bytes] | None]] = []
    monkeypatch.setattr(view, "send", lambda content, buffers=None: sent.append((content, buffers)))
    view._on_message(view, {"type": "parquet"}, [])
    assert sent[-1] == ({"type": "parquet", "error": "'big': there are no rows to download yet — wait for an epoch "
                                                   "of `%streamling run`"}, None)

    table = pa.table({"id": pa.array([1, 2], pa.int64()),
                      "price": pa.array([decimal.Decimal("1.10"), None], pa.decimal128(10, 2)),
                      "at": pa.array([dt.datetime(2024, 5, 1, 12, 0), dt.datetime(2024, 5, 2)], pa.timestamp("us"))})
    view.handle(ev.RowsSampled("orders", epoch=1, node="big", columns=table.column_names, rows=table.to_pylist(),
                               table=table))
    view._on_message(view, {"type": "parquet"}, [])
    content, buffers = sent[-1]
    assert content == {"type": "parquet", "filename": "big.parquet"} and buffers is not None
    back = pq.read_table(pa.BufferReader(buffers[0]))
    assert back.schema == table.schema and back.to_pylist() == table.to_pylist()
    view._on_message(view, {"type": "ping"}, [])  # the front end asks whether a kernel is behind it
    assert sent[-1] == ({"type": "pong"}, None)


def _magics(tmp_path: Path) -> StreamlingMagics:
    magics = StreamlingMagics(shell=None)
    magics._pipeline = NotebookPipeline(application_id="display_test", cwd=tmp_path)
    magics.pipeline.define("source", "orders", {"type": "generate", "rows": 10})
    magics.pipeline.define("transform", "big", {"type": "sql", "sql": "SELECT id FROM orders"})
    return magics


def test_display_names_an_unknown_node_and_a_bad_row_limit(tmp_path: Path) -> None:
    magics = _magics(tmp_path)
    with pytest.raises(PipelineError) as err:
        magics.streamling("display bgi")
    assert str(err.value) == "Node 'bgi': there is no node 'bgi' (did you mean 'big'?) — nodes: orders, big"
    with pytest.raises(PipelineError, match=r"Node 'big': --rows 0 is out of range for a display — give 1 to"):
        magics.streamling("display big --rows 0")
    with pytest.raises(PipelineError, match="`%streamling display` needs NODE"):
        magics.streamling("display")
    assert "%streamling display NODE [--rows N]" in USAGE


def test_a_display_before_the_run_waits_for_it_and_a_newer_one_replaces_it(tmp_path: Path) -> None:
    magics = _magics(tmp_path)
    first = magics.streamling("display big")
    assert isinstance(first, ResultView) and first.limit == 100 and first.status == "waiting"
    assert "appear here when `%streamling run` starts" in first.caption
    second = magics.streamling("display big --rows 20")
    assert magics.pipeline.displays == {"big": second} and second.limit == 20
    assert first.status == "replaced by a newer display of 'big'"


def test_the_bus_samples_a_displayed_node_with_its_own_row_limit() -> None:
    bus = ev.EventBus()
    assert not bus.wants_sample("orders")
    bus.node_sample_rows["big"] = 100
    assert bus.wants_sample("orders")  # sampling is on for that node even with sample_rows 0
    assert (bus.rows_to_sample("big"), bus.rows_to_sample("orders")) == (100, 0)
    bus.sample_rows = 20
    assert (bus.rows_to_sample("big"), bus.rows_to_sample("orders")) == (100, 20)
