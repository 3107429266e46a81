"""The ``file`` source over every format, bounded and continuous, with ``_gs_op`` handling."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamling.runtime import events as ev

pytestmark = pytest.mark.spark


def _pipeline(path: Path, fmt: str, out: Path, mode: str = "{type: bounded}") -> str:
    return f"""
        sources:
          src: {{type: file, path: "{path}", format: {fmt}, mode: {mode}, primary_key: id}}
        sinks:
          lake: {{type: delta, from: src, path: "{out}"}}
    """


@pytest.mark.parametrize("fmt", ["parquet", "avro", "json", "ndjson", "csv"])
def test_each_format_is_read_and_gets_gs_op(fmt: str, spark: Any, runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    df = spark.createDataFrame([(1, "a", 10.5), (2, "b", 20.0)], "id long, name string, amount double")
    writer = df.coalesce(1).write.mode("overwrite")
    if fmt == "csv":
        writer.option("header", "true").csv(str(data))
    elif fmt in ("json", "ndjson"):
        writer.json(str(data))
    else:
        writer.format(fmt).save(str(data))
    runner.run(_pipeline(data, fmt, tmp_path / "out"))
    rows = read_delta(tmp_path / "out")
    assert [(r["id"], r["name"], r["amount"]) for r in rows] == [(1, "a", 10.5), (2, "b", 20.0)]


def test_data_carrying_gs_op_keeps_it_and_deletes_apply(runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"id": 1, "v": "x", "_gs_op": "i"}, {"id": 2, "v": "y", "_gs_op": "i"},
        {"id": 1, "v": "x2", "_gs_op": "u"}, {"id": 2, "v": "y", "_gs_op": "d"}]) + "\n")
    runner.run(_pipeline(data, "jsonl", tmp_path / "out"))
    assert [(r["id"], r["v"]) for r in read_delta(tmp_path / "out")] == [(1, "x2")]


def test_nested_folders_are_read_recursively(runner, tmp_path: Path, read_delta) -> None:
    (tmp_path / "in" / "2026" / "01").mkdir(parents=True)
    (tmp_path / "in" / "top.csv").write_text("id,v\n1,a\n")
    (tmp_path / "in" / "2026" / "01" / "deep.csv").write_text("id,v\n2,b\n")
    runner.run(_pipeline(tmp_path / "in", "csv", tmp_path / "out"))
    assert [r["id"] for r in read_delta(tmp_path / "out")] == [1, 2]


def test_continuous_mode_picks_up_new_files(runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "first.csv").write_text("id,v\n1,a\n")
    run = runner.pipeline(_pipeline(data, "csv", tmp_path / "out", mode="{type: continuous, poll_interval: 500ms}"))
    flushed: list[int] = []

    def add_second_file(event: ev.Event) -> None:
        if isinstance(event, ev.EpochFinalized) and not flushed:
            flushed.append(event.epoch)
            (data / "second.csv").write_text("id,v\n2,b\n")

    run.bus.subscribe(add_second_file)
    run.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sum(e.input_rows for e in runner.of_type(ev.EpochFinalized)) >= 2:
                break
            time.sleep(0.2)
    finally:
        threading.Thread(target=run.request_stop, args=("test done",)).start()
        run.wait(timeout_secs=60)
        run.stop()
    assert run.status()["src"]["active"] is False
    assert [r["id"] for r in read_delta(tmp_path / "out")] == [1, 2]
