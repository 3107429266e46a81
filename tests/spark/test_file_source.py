"""The ``file`` source over every format, bounded and continuous, with ``_gs_op`` handling."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Runner

from streamling.errors import StreamlingError
from streamling.runtime import events as ev

pytestmark = pytest.mark.spark


def _landed(read_delta: Any, table: Path) -> list[dict[str, Any]]:
    """The rows in the Delta sink's table; none when no epoch was committed (the first write creates it)."""
    return read_delta(table) if any((table / "_delta_log").glob("*.json")) else []


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


# --- files that do not fit the schema stop the flow; nothing of the epoch reaches the sink ---------

HINT = " — fix the file (or remove it from the folder) and restart; nothing from this epoch was written"


def _lake(data: Path, fmt: str, out: Path, mode: str = "{type: bounded}", sql: str | None = None) -> str:
    """A keyless delta sink (plain appends): the cheapest sink whose rows can be counted."""
    transform = f"transforms:\n          t: {{type: sql, sql: \"{sql}\"}}" if sql else ""
    return f"""
        sources:
          src: {{type: file, path: "{data}", format: {fmt}, mode: {mode}}}
        {transform}
        sinks:
          lake: {{type: delta, from: {"t" if sql else "src"}, path: "{out}"}}
    """


def _fails(run: Any, timeout_secs: float = 120) -> str:
    """Wait for the pipeline to fail; its one-line message."""
    try:
        with pytest.raises(StreamlingError) as info:
            run.wait(timeout_secs=timeout_secs)
    finally:
        run.stop("test finished")
    return info.value.headline()


def _add_after_first_epoch(run: Any, path: Path, text: str) -> None:
    def add(event: ev.Event) -> None:
        if isinstance(event, ev.EpochFinalized) and not path.exists():
            path.write_text(text)

    run.bus.subscribe(add)


@pytest.mark.parametrize(("header", "problem"), [
    ("id,amount,name", "the header (id, amount, name) has the source's columns in another order than "
                       "(id, name, amount), so its values would land in the wrong columns"),
    ("id,name,x", "the header (id, name, x) lacks column amount and has an extra column x; "
                  "the source's columns are (id, name, amount)"),
])
def test_csv_header_is_matched_by_name(header: str, problem: str, runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text("id,name,amount\n1,a,10.5\n")
    (data / "b.csv").write_text(f"{header}\n2,20.5,b\n")
    run = runner.pipeline(_lake(data, "csv", tmp_path / "out"))
    run.start()
    assert _fails(run) == f"file source 'src': {data}/b.csv: {problem}{HINT}"
    assert _landed(read_delta, tmp_path / "out") == []


def test_csv_text_in_a_numeric_column_stops_the_epoch_and_the_fixed_file_resumes(
        spark: Any, runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text("id,name,amount\n1,a,10.5\n2,b,20\n")
    run = runner.pipeline(_lake(data, "csv", tmp_path / "out", mode="{type: continuous, poll_interval: 500ms}"))
    _add_after_first_epoch(run, data / "b.csv", "id,name,amount\n3,c,1\n4,d,2\n5,e,abc\n")
    run.start()
    assert _fails(run) == f"file source 'src': {data}/b.csv line 4: column 'amount' expects double, got 'abc'{HINT}"
    assert [r["id"] for r in read_delta(tmp_path / "out")] == [1, 2]  # epoch 0 only

    # The failed epoch was not committed: once the file is fixed, a restart replays it.
    (data / "b.csv").write_text("id,name,amount\n3,c,1\n4,d,2\n5,e,5.5\n")
    again = Runner(spark, tmp_path)
    again.run_until(_lake(data, "csv", tmp_path / "out", mode="{type: continuous, poll_interval: 500ms}"),
                    lambda r: r.input_rows() >= 3)
    assert [(r["id"], r["amount"]) for r in read_delta(tmp_path / "out")] == \
        [(1, 10.5), (2, 20.0), (3, 1.0), (4, 2.0), (5, 5.5)]


def test_ndjson_value_of_another_type_stops_the_flow_even_in_an_unselected_column(
        runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.ndjson").write_text('{"id": 1, "name": "a", "amount": 10.5}\n')
    run = runner.pipeline(_lake(data, "ndjson", tmp_path / "out", mode="{type: continuous, poll_interval: 500ms}",
                                sql="SELECT id, _gs_op FROM src"))
    _add_after_first_epoch(run, data / "b.ndjson",
                           '{"id": 2, "name": "b", "amount": 2}\n{"id": 3, "name": "c", "amount": "n/a"}\n')
    run.start()
    assert _fails(run) == f"file source 'src': {data}/b.ndjson line 2: column 'amount' expects double, got 'n/a'{HINT}"
    assert [r["id"] for r in read_delta(tmp_path / "out")] == [1]


def test_malformed_json_line_stops_the_flow(runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text('{"id": 1, "v": "x"}\n\n{"id": 2, "v": \n')
    run = runner.pipeline(_lake(data, "jsonl", tmp_path / "out"))
    run.start()
    assert _fails(run) == f"file source 'src': {data}/a.jsonl line 3: not valid JSON: '{{\"id\": 2, \"v\": '{HINT}"
    assert _landed(read_delta, tmp_path / "out") == []


def test_parquet_column_of_another_type_stops_the_flow(runner, tmp_path: Path, read_delta) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(pa.table({"id": [1], "amount": [10.5]}), data / "a.parquet")  # the schema: the first file
    pq.write_table(pa.table({"id": [2], "amount": ["abc"]}), data / "b.parquet")
    run = runner.pipeline(_lake(data, "parquet", tmp_path / "out"))
    run.start()
    assert _fails(run) == (f"file source 'src': {data}/b.parquet: column 'amount' expects double, "
                           f"the file has string{HINT}")
    assert _landed(read_delta, tmp_path / "out") == []


def test_line_of_a_bad_record_is_found_in_the_jvm_for_remote_files(spark: Any, tmp_path: Path) -> None:
    from streamling.sources.file import _line_number_spark

    (tmp_path / "b.csv").write_text("id,name,amount\n3,c,1\n\n5,e,abc\n")
    assert _line_number_spark(spark, f"file://{tmp_path}/b.csv", "5,e,abc", False) == 4


# --- a field too long for the JVM: stopped at file_source.max_field_chars, naming file and line ---

LIMIT = 65_536
TOO_LONG = (f" is longer than {LIMIT} characters (file_source.max_field_chars) — raise file_source.max_field_chars "
            "(STREAMLING__FILE_SOURCE__MAX_FIELD_CHARS) above the field's length, with spark.driver.memory to match, "
            "or fix the file; nothing from the file was written")


def test_csv_field_over_the_limit_in_a_new_file_stops_the_flow_naming_file_and_line(
        runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text("id,name,amount\n1,a,10.5\n")
    run = runner.pipeline(_lake(data, "csv", tmp_path / "out", mode="{type: continuous, poll_interval: 500ms}"),
                          file_source={"max_field_chars": LIMIT})
    _add_after_first_epoch(run, data / "b.csv", f"id,name,amount\n2,b,1\n3,{'x' * (4 * LIMIT)},2\n")
    run.start()
    assert _fails(run) == f"file source 'src': field at {data}/b.csv:3{TOO_LONG}"
    assert [r["id"] for r in read_delta(tmp_path / "out")] == [1]  # epoch 0 only


def test_csv_field_over_the_limit_at_start_is_reported_before_any_epoch(runner, tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.csv").write_text(f"id,name\n1,a\n2,b\n3,{'y' * (LIMIT + 1)}\n")
    with pytest.raises(StreamlingError) as info:
        runner.run(_lake(data, "csv", tmp_path / "out"), file_source={"max_field_chars": LIMIT})
    assert info.value.headline() == ("pipeline is invalid (1 problem):\n"
                                     f"  - file source 'src': field at {data}/a.csv:4{TOO_LONG}")


def test_json_string_over_the_readers_limit_is_named_as_the_likely_cause(runner, tmp_path: Path, read_delta) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.jsonl").write_text(f'{{"id": 1, "v": "x"}}\n{{"id": 2, "v": "{"y" * 20_000_001}"}}\n')
    run = runner.pipeline(_lake(data, "jsonl", tmp_path / "out"))
    run.start()
    assert _fails(run) == (f"file source 'src': {data}/a.jsonl line 2: the line is longer than 20000000 characters "
                           "and does not parse: a string value over the JSON reader's limit of 20000000 characters "
                           f"(not configurable) is the likely cause{HINT}")
    assert _landed(read_delta, tmp_path / "out") == []
