"""``display(df)`` as on Databricks: any batch DataFrame as a sortable, downloadable table, and a
streaming DataFrame as a live table fed by each micro-batch until the query stops or the cell is
interrupted."""

from __future__ import annotations

import _thread
import io
import threading
import time
from typing import Any

import pyarrow.parquet as pq
import pytest

from streamling.errors import StreamlingError
from streamling.notebook.display import ResultView
from streamling.notebook.frames import StreamingDisplay, display, display_dataframe

pytestmark = pytest.mark.spark


def _until(check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_batch_dataframe_shows_its_first_rows_with_their_types(spark: Any) -> None:
    df = spark.range(2500).selectExpr("id", "id * 2 AS twice", "CAST(id AS DECIMAL(10, 2)) / 4 AS quarter")
    view = display_dataframe(df, rows=1000)
    assert isinstance(view, ResultView)
    view.flush()
    assert view.status == "complete" and view.caption == "the first 1,000 rows of the DataFrame"
    assert view.columns == ["id", "twice", "quarter"] and view.types[:2] == ["int64", "int64"]
    assert len(view.rows) == 1000 and view.rows[3][:2] == [3, 6]
    table = pq.read_table(io.BytesIO(view.parquet_bytes()))  # the download keeps the exact types
    assert table.num_rows == 1000 and str(table.schema.field("quarter").type).startswith("decimal128")
    small = display_dataframe(spark.range(5), rows=1000)
    assert isinstance(small, ResultView) and small.caption == "all 5 rows of the DataFrame"
    with pytest.raises(StreamlingError, match="display: the DataFrame cannot be read: .*no row 3 here"):
        display_dataframe(spark.range(5).selectExpr("if(id = 3, raise_error('no row 3 here'), id) AS id"))


def test_a_streaming_dataframe_updates_its_table_each_micro_batch_until_stopped(spark: Any) -> None:
    df = spark.readStream.format("rate").option("rowsPerSecond", 20).load().selectExpr("value AS n")
    running = display_dataframe(df, rows=50, stream_name="sl_display_rate", processing_time="0.5 seconds")
    assert isinstance(running, StreamingDisplay)
    try:
        _until(lambda: running.view.first_epoch is not None and running.view.first_epoch < running.view.epoch)
        running.view.flush()
        assert running.view.status == "running" and running.view.columns == ["n"]
        shown = [r[0] for r in running.view.rows]
        assert len(shown) <= 50 and shown[0] > shown[-1]  # the newest micro-batch first
        assert running.view.beat > 0  # the kernel side tells the front end it is live
    finally:
        running.stop()
    assert not running.query.isActive and running.view.status == "stopped"


def test_display_keeps_the_cell_running_until_it_is_interrupted_which_stops_the_query(spark: Any) -> None:
    df = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    before = {q.id for q in spark.streams.active}
    timer = threading.Timer(8, _thread.interrupt_main)  # what JupyterLab's Stop does to a cell
    timer.start()
    started = time.monotonic()
    try:
        display(df, streamName="sl_display_cell", processingTime="1 second")
    finally:
        timer.cancel()
    assert time.monotonic() - started >= 7
    assert {q.id for q in spark.streams.active} == before  # the query stopped with the cell
    # anything else is shown as IPython shows it
    display("plain text")


def test_a_streaming_query_that_fails_fails_the_wait_and_the_view_says_why(spark: Any) -> None:
    df = spark.readStream.format("rate").option("rowsPerSecond", 5).load() \
        .selectExpr("if(value >= 3, raise_error('value 3 is poison'), value) AS n")
    running = display_dataframe(df, stream_name="sl_display_poison", processing_time="0.5 seconds")
    assert isinstance(running, StreamingDisplay)
    try:
        with pytest.raises(StreamlingError, match="display: the streaming query failed: .*value 3 is poison"):
            running.wait(120)
    finally:
        if running.query.isActive:
            running.stop()
    running.view.flush()
    assert running.view.status.startswith("failed: ") and "value 3 is poison" in running.view.status
    beat = running.view.beat
    time.sleep(1.5)
    assert running.view.beat == beat  # no heartbeat for a query that ended


def test_display_refuses_keywords_it_does_not_know_and_row_counts_out_of_range(spark: Any) -> None:
    with pytest.raises(StreamlingError, match=r"display\(df\) takes no streamname — keywords: streamName"):
        display(spark.range(3), streamname="typo")
    with pytest.raises(StreamlingError, match="display shows 1 to 10,000 rows, not 0"):
        display_dataframe(spark.range(3), rows=0)
