"""Whole pipelines on real Spark: epochs, sinks, bounded termination, checkpoints, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamling.errors import StreamlingError, ValidationError
from streamling.runtime import events as ev
from streamling.sources.generate import generate_batch

pytestmark = pytest.mark.spark


def expected_large_orders(rows: int, threshold: float) -> list[int]:
    table = generate_batch("orders", 0, rows, 0, 0)
    return [i for i, a in zip(table.column("id").to_pylist(), table.column("amount").to_pylist(), strict=True)
            if a > threshold]


def test_generate_sql_delta_bounded_run_ends_by_itself(runner, tmp_path, read_delta):
    out = tmp_path / "lake"
    run = runner.run(f"""
        sources:
          orders: {{type: generate, rows: 3000, rows_per_batch: 1000, primary_key: id}}
        transforms:
          big:
            type: sql
            sql: SELECT id, amount, upper(country) AS country FROM orders WHERE amount > 900
        sinks:
          lake: {{type: delta, from: big, path: "{out}"}}
    """)
    assert run.status()["orders"]["active"] is False
    rows = read_delta(out)
    assert sorted(r["id"] for r in rows) == expected_large_orders(3000, 900)
    assert all(r["country"].isupper() for r in rows)
    assert "_gs_op" not in rows[0]
    flushed = runner.of_type(ev.EpochFlushed)
    finalized = runner.of_type(ev.EpochFinalized)
    assert [e.epoch for e in flushed] == [0, 1, 2]
    assert [e.epoch for e in finalized] == [0, 1, 2]
    assert finalized[-1].offsets["orders"] == {"row": 3000}
    assert sum(e.input_rows for e in finalized) == 3000


def test_restart_resumes_from_checkpoint_without_repeating(runner, tmp_path, read_delta):
    out = tmp_path / "lake"
    yaml_text = f"""
        sources:
          orders: {{type: generate, rows: 2000, rows_per_batch: 1000}}
        sinks:
          lake: {{type: delta, from: orders, path: "{out}"}}
    """
    runner.run(yaml_text)
    runner.events.clear()
    runner.run(yaml_text)
    assert runner.of_type(ev.EpochFlushed) == []  # nothing new to read
    ids = [r["id"] for r in read_delta(out)]
    assert sorted(ids) == list(range(2000))  # appended once, no duplicates


def test_cdc_upserts_and_deletes_into_delta(runner, tmp_path, read_delta):
    out = tmp_path / "lake"
    runner.run(f"""
        sources:
          changes: {{type: generate, profile: cdc, rows: 300, rows_per_batch: 100, primary_key: id}}
        sinks:
          lake: {{type: delta, from: changes, path: "{out}"}}
    """)
    rows = read_delta(out)
    # 100 keys, three events each; every 5th key ends deleted, the rest at version 3.
    assert sorted(r["id"] for r in rows) == [k for k in range(100) if k % 5 != 0]
    assert {r["version"] for r in rows} == {3}


def test_gs_op_is_carried_once_and_union_all_of_two_sources(runner, tmp_path, read_delta):
    out = tmp_path / "lake"
    runner.run(f"""
        sources:
          a: {{type: generate, rows: 10, rows_per_batch: 10}}
          b: {{type: generate, rows: 10, rows_per_batch: 10, start_id: 1000}}
        transforms:
          both:
            type: sql
            sql: SELECT id, now() AS seen_at FROM a UNION ALL SELECT id, current_timestamp() AS seen_at FROM b
        sinks:
          lake: {{type: delta, from: both, path: "{out}"}}
    """)
    rows = read_delta(out)
    assert sorted(r["id"] for r in rows) == list(range(10)) + list(range(1000, 1010))
    assert all(r["seen_at"] is not None for r in rows)


def test_fan_out_to_two_sinks_in_one_flow(runner, tmp_path, read_delta, capsys):
    out = tmp_path / "lake"
    runner.run(f"""
        sources:
          orders: {{type: generate, rows: 50, rows_per_batch: 50}}
        transforms:
          few: {{type: sql, sql: "SELECT id, country FROM orders WHERE id < 3"}}
        sinks:
          console: {{type: print, from: few}}
          lake: {{type: delta, from: few, path: "{out}"}}
    """)
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" -> ")[0] for line in lines] == ["1", "2", "3"]
    assert lines[0].startswith("1 -> (sample_every=1) [Insert] {\"id\":0,")
    assert json.loads(lines[0].split("] ", 1)[1])["_gs_op"] == "i"
    assert [r["id"] for r in read_delta(out)] == [0, 1, 2]
    assert len(runner.of_type(ev.FlowStarted)) == 1  # one query for the whole flow


def test_num_records_before_stop_stops_an_unbounded_source(runner, tmp_path):
    run = runner.run("""
        sources:
          orders: {type: generate, rows_per_second: 5000, rows_per_batch: 500}
        sinks:
          sink: {type: blackhole, from: orders}
    """, timeout_secs=120, num_records_before_stop=1000, checkpoint_interval_sec=0.2)
    status = run.status()["orders"]
    assert status["rows_to_sinks"] >= 1000
    assert "num_records_before_stop" in status["stop_reason"]


def test_file_source_quick_start_csv(runner, tmp_path, read_delta):
    data = tmp_path / "data"
    data.mkdir()
    (data / "tx.csv").write_text("id,amount\n1,500\n2,1500\n3,2500\n4,750\n")
    out = tmp_path / "lake"
    runner.run(f"""
        sources:
          transactions: {{type: file, path: "{data}", format: csv, mode: {{type: bounded}}, primary_key: id}}
        transforms:
          big: {{type: sql, sql: "SELECT * FROM transactions WHERE amount > 1000"}}
        sinks:
          lake: {{type: delta, from: big, path: "{out}"}}
    """)
    assert [(r["id"], r["amount"]) for r in read_delta(out)] == [(2, 1500), (3, 2500)]


def test_file_source_errors_name_the_node(runner, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for path, expected in [(str(empty), "no files matching"), ("ftp://host/x", "unsupported scheme 'ftp'")]:
        run = runner.pipeline(f"""
            sources:
              src: {{type: file, path: "{path}", format: parquet, mode: bounded}}
            sinks:
              out: {{type: blackhole, from: src}}
        """)
        with pytest.raises(ValidationError) as info:
            run.analyze()
        headline = info.value.problems[0].headline()
        assert headline.startswith("file source 'src': ") and expected in headline


def test_primary_key_checked_against_schema_with_streamlings_message(runner):
    run = runner.pipeline("""
        sources:
          orders: {type: generate, rows: 1, primary_key: id}
        transforms:
          slim: {type: sql, sql: "SELECT amount FROM orders", primary_key: "amount,order_id"}
        sinks:
          out: {type: blackhole, from: slim}
    """)
    with pytest.raises(ValidationError) as info:
        run.analyze()
    assert [p.headline() for p in info.value.problems] == [
        "Primary key validation failed for node 'slim': columns [\"order_id\"] not found in schema. "
        "Available columns: [\"amount\", \"_gs_op\"]"]


def test_sql_error_at_plan_time_names_node(runner):
    run = runner.pipeline("""
        sources:
          orders: {type: generate, rows: 1}
        transforms:
          bad: {type: sql, sql: "SELECT amout FROM orders"}
        sinks:
          out: {type: blackhole, from: bad}
    """)
    with pytest.raises(ValidationError) as info:
        run.analyze()
    message = info.value.problems[0].headline()
    # in the pipeline's terms: the column, the did-you-mean; no Spark error class, SQLSTATE or position
    assert message == ("sql transform 'bad': SQL fails: column 'amout' does not exist (did you mean 'amount'?) — "
                       "fix the query in 'sql'")


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT nosuch_fn(1)", "function 'nosuch_fn' does not exist"),
    ("SELECT * FROM ordres", "table 'ordres' does not exist: name an upstream node in FROM"),
    ("SELECT 1 +", "[PARSE_SYNTAX_ERROR]"),
])
def test_spark_sql_errors_in_the_users_terms(spark: Any, sql: str, expected: str) -> None:
    from pyspark.errors import AnalysisException, ParseException

    from streamling.errors import spark_sql_message

    with pytest.raises((AnalysisException, ParseException)) as info:
        spark.sql(sql).schema  # noqa: B018 - analysed on access
    message = spark_sql_message(info.value)
    if expected.startswith("["):  # any other error: Spark's sentence, without its class, SQLSTATE and position
        assert expected not in message and "SQLSTATE" not in message and "pos " not in message, message
        assert message.startswith("Syntax error"), message
    else:
        assert message == expected


def test_changed_source_settings_refuse_the_old_checkpoint(runner, tmp_path):
    out = tmp_path / "lake"
    template = """
        sources:
          orders: {{type: generate, rows: 10, seed: {seed}}}
        sinks:
          lake: {{type: delta, from: orders, path: "{out}"}}
    """
    runner.run(template.format(seed=1, out=out))
    with pytest.raises(StreamlingError) as info:
        runner.run(template.format(seed=2, out=out))
    assert info.value.code == "checkpoint_incompatible"
    assert "delete" in info.value.headline() and str(Path(runner.tmp_path / "state")) in info.value.headline()


def test_failing_sink_stops_the_flow_with_the_node_named(runner, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the table directory should be")
    with pytest.raises(StreamlingError) as info:
        runner.run(f"""
            sources:
              orders: {{type: generate, rows: 10}}
            sinks:
              lake: {{type: delta, from: orders, path: "{blocker}/table"}}
        """)
    assert "'lake'" in info.value.headline()
