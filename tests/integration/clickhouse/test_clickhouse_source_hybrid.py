"""The ClickHouse source and the hybrid source (ClickHouse backfill, then Kafka) against the real
ClickHouse engine, a real broker and a real Postgres, restarted in each phase."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from harness import Runner

from streamling.runtime import events as ev

pytestmark = [pytest.mark.clickhouse, pytest.mark.postgres, pytest.mark.kafka, pytest.mark.spark]


def _pg_rows(pg: Any, table: str) -> dict[int, tuple[Any, ...]]:
    return {int(r[0]): tuple(r[1:]) for r in pg.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()}


def _stop_after_first_epoch(runner: Runner, yaml_text: str, **overrides: Any) -> None:
    """Run until the first epoch is finalized, then stop between epochs (a restart mid-phase)."""
    run = runner.pipeline(yaml_text, **overrides)
    run.bus.subscribe(lambda e: run.request_stop("restart test") if isinstance(e, ev.EpochFinalized) else None)
    run.start()
    try:
        run.wait(timeout_secs=120)
    finally:
        run.stop("restart test")


@pytest.fixture
def env(ch_environ: Mapping[str, str], pg_environ: Mapping[str, str],
        kafka_environ: Mapping[str, str]) -> dict[str, str]:
    return {**ch_environ, **pg_environ, **kafka_environ}


def test_clickhouse_source_pages_by_sort_key_and_resumes(spark: Any, tmp_path: Path, env: dict[str, str],
                                                         ch_client: Any, pg: Any, unique_name: str) -> None:
    table = unique_name
    ch_client.command(f"CREATE TABLE {table} (k UInt32, n UInt64, amount Decimal(50, 2), at DateTime, note String) "
                      "ENGINE = MergeTree ORDER BY k")
    # Two rows per key value: a page never splits them.
    values = ", ".join(f"({i // 2}, {i * 10}, {i}.25, toDateTime('2026-01-01 00:00:00', 'UTC') + {i}, 'n{i}')"
                       for i in range(40))
    ch_client.command(f"INSERT INTO {table} VALUES {values}")
    pipeline = f"""
        sources:
          hist: {{type: clickhouse, table_name: {table}, columns: 'n, k, amount, at', filter: 'k >= 2'}}
        transforms: {{}}
        sinks:
          out: {{type: postgres, from: hist, table: {table}, primary_key: n}}
    """
    runner = Runner(spark, tmp_path, env)
    overrides = {"clickhouse_source": {"page_size": 7}}
    _stop_after_first_epoch(runner, pipeline, **overrides)
    first = len(_pg_rows(pg, table))
    assert 8 <= first < 36  # at least one page (7 rows + the key's twin), not all of them
    runner.run(pipeline, **overrides)
    got = _pg_rows(pg, table)
    assert sorted(got) == [i * 10 for i in range(4, 40)]
    k, amount, at = got[370]
    assert (k, str(amount), at.timestamp()) == (18, "37.25", 1767225637.0)
    epochs = {e.epoch for e in runner.of_type(ev.EpochFinalized)}
    assert len(epochs) >= 4  # ~36 rows in pages of 7-8
    ch_client.command(f"INSERT INTO {table} VALUES (100, 9999, 1, now(), 'late')")
    runner.run(pipeline, **overrides)  # resumes after the last committed page: only the new row
    assert len(_pg_rows(pg, table)) == 37


def test_a_lost_checkpoint_resumes_after_the_page_the_state_backend_saved(
        spark: Any, tmp_path: Path, env: dict[str, str], ch_client: Any, unique_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Streamling keeps a ClickHouse source's position in the state backend and resumes from it: a
    checkpoint folder lost (or a driver moved to a host without it) with a durable backend kept
    must not read the table again from its first row."""
    import shutil

    ch_client.command(f"CREATE TABLE {unique_name} (k UInt32, n UInt64) ENGINE = MergeTree ORDER BY k")
    ch_client.command(f"INSERT INTO {unique_name} VALUES " + ", ".join(f"({i // 2}, {i})" for i in range(40)))
    pipeline = f"""
        sources:
          hist: {{type: clickhouse, table_name: {unique_name}, columns: 'k, n'}}
        transforms: {{}}
        sinks:
          out: {{type: blackhole, from: hist}}
    """
    runner = Runner(spark, tmp_path, env)
    overrides: dict[str, Any] = {
        "clickhouse_source": {"page_size": 7},
        "state_backend": {"backend_type": "Sqlite", "sqlite": {"database_path": str(tmp_path / "state.db")}}}
    _stop_after_first_epoch(runner, pipeline, **overrides)
    first = runner.input_rows()
    assert 8 <= first < 40
    shutil.rmtree(tmp_path / "state")  # the checkpoint is gone; the state backend's copy is not
    runner.events.clear()
    with caplog.at_level("INFO", logger="streamling.sources.clickhouse"):
        runner.run(pipeline, **overrides)
    assert runner.input_rows() == 40 - first
    last_key = first // 2 - 1  # pages end on a whole key value: two rows per key
    assert f"the state backend holds its position `k` = {last_key}; a new checkpoint starts after it" in caplog.text
    # Changed source settings refuse the checkpoint; deleting its folder would not start over, and
    # the hint says so instead of suggesting it.
    from streamling.errors import StreamlingError

    with pytest.raises(StreamlingError) as refused:
        runner.run(pipeline.replace("columns: 'k, n'", "columns: 'k, n', filter: 'n > 3'"), **overrides)
    assert refused.value.code == "checkpoint_incompatible"
    assert ("run it under a new application_id: source(s) ['hist'] keep their positions in the Sqlite state "
            "backend") in (refused.value.hint or ""), refused.value.hint


def test_a_sparse_sort_key_is_read_in_one_page_of_a_few_spans(spark: Any, tmp_path: Path, env: dict[str, str],
                                                                ch_client: Any, unique_name: str) -> None:
    """Keys far apart (hashes, epoch milliseconds, a resumed position far below the next rows) put
    ~9e18 key values between a page's first position and its last row: cut by the default
    sort_key_range that was 9e12 spans, and the driver grew until it died. Every row arrives once."""
    keys = [1, 10**12, 2**63 + 7]
    ch_client.command(f"CREATE TABLE {unique_name} (k UInt64, v String) ENGINE = MergeTree ORDER BY k")
    ch_client.command(f"INSERT INTO {unique_name} VALUES " + ", ".join(f"({k}, 'v{k}')" for k in keys))
    pipeline = f"""
        sources:
          hist: {{type: clickhouse, table_name: {unique_name}}}
        transforms: {{}}
        sinks:
          out: {{type: blackhole, from: hist}}
    """
    runner = Runner(spark, tmp_path, env)
    runner.run(pipeline, timeout_secs=60, clickhouse_source={"page_size": 1})  # each page starts far below its rows
    assert runner.input_rows() == len(keys)


def test_a_position_saved_while_reading_another_table_is_not_used(
        spark: Any, tmp_path: Path, env: dict[str, str], ch_client: Any, unique_name: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The state backend keys a ClickHouse source's position by the node's name. In one process (a
    notebook kernel, InMemory) or one durable backend, the same node reading another table must
    not start after the first table's last key: that skipped every row below it, silently."""
    first, second = f"{unique_name}_a", f"{unique_name}_b"
    for table, keys in ((first, range(100, 110)), (second, range(1, 6))):
        ch_client.command(f"CREATE TABLE {table} (k UInt64) ENGINE = MergeTree ORDER BY k")
        ch_client.command(f"INSERT INTO {table} VALUES " + ", ".join(f"({k})" for k in keys))
    pipeline = """
        sources:
          hist: {{type: clickhouse, table_name: {table}}}
        transforms: {{}}
        sinks:
          out: {{type: blackhole, from: hist}}
    """
    Runner(spark, tmp_path / "a", env).run(pipeline.format(table=first))
    runner = Runner(spark, tmp_path / "b", env)  # a new checkpoint: the state backend's position decides
    with caplog.at_level("WARNING", logger="streamling.sources.clickhouse"):
        runner.run(pipeline.format(table=second))
    assert runner.input_rows() == 5
    assert "holds a position saved while it read another table" in caplog.text


def _producer(bootstrap: str, admin: Any, topic: str) -> Any:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(timeout=30)
    return Producer({"bootstrap.servers": bootstrap})


def _send(producer: Any, topic: str, partition: int, rows: list[tuple[int, str, str]]) -> None:
    for key, value, op in rows:
        producer.produce(topic, value=json.dumps({"id": key, "v": value}).encode(), partition=partition,
                         headers=[("dbz.op", op.encode())])
    assert producer.flush(30) == 0


def test_hybrid_backfills_then_goes_live_at_the_recorded_offsets_across_restarts(
        spark: Any, tmp_path: Path, env: dict[str, str], ch_client: Any, pg: Any, unique_name: str,
        unique_topic: str, kafka_bootstrap: str, kafka_admin: Any) -> None:
    hist, offsets, topic = f"{unique_name}_h", f"{unique_name}_o", unique_topic
    ch_client.command(f"CREATE TABLE {hist} (id Int64, v String) ENGINE = MergeTree ORDER BY id")
    ch_client.command(f"INSERT INTO {hist} SELECT number, concat('h', toString(number)) FROM numbers(1, 30)")
    ch_client.command(f"CREATE TABLE {offsets} (topic String, partition Int32, offset Int64) "
                      "ENGINE = MergeTree ORDER BY (topic, partition)")
    producer = _producer(kafka_bootstrap, kafka_admin, topic)
    # What the history already holds: messages before the recorded offsets must not be applied again.
    _send(producer, topic, 0, [(1, "stale", "u"), (2, "stale", "u")])
    _send(producer, topic, 1, [(3, "stale", "u")])
    ch_client.command(f"INSERT INTO {offsets} VALUES ('{topic}', 0, 2), ('{topic}', 1, 1), ('other', 0, 99)")
    _send(producer, topic, 0, [(5, "live5", "u"), (40, "live40", "c")])
    _send(producer, topic, 1, [(7, "gone", "d"), (41, "live41", "c")])
    pipeline = f"""
        sources:
          orders:
            type: hybrid
            primary_key: id
            bounded_sources: [{{source_type: clickhouse, table_name: {hist}}}]
            unbounded_source:
              source_type: kafka
              topic: {topic}
              data_format: json
              schema: {{id: int64, v: string}}
            offset_table: {{topic_name: {topic}, table_name: {offsets}}}
        transforms: {{}}
        sinks:
          out: {{type: postgres, from: orders, table: {hist}, primary_key: id}}
    """
    runner = Runner(spark, tmp_path, env)
    overrides = {"clickhouse_source": {"page_size": 8},
                 "state_backend": {"backend_type": "Sqlite", "sqlite": {"database_path": str(tmp_path / "s.db")}}}
    expected = {i: (f"h{i}",) for i in range(1, 31)} | {5: ("live5",), 40: ("live40",), 41: ("live41",)}
    del expected[7]

    _stop_after_first_epoch(runner, pipeline, **overrides)  # restart during the backfill
    assert 8 <= len(_pg_rows(pg, hist)) < 30

    # job_mode runs the backfill only, then ends.
    runner.run(pipeline, job_mode=True, **overrides)
    assert len(_pg_rows(pg, hist)) == 30

    runner.run_until(pipeline, lambda r: _pg_rows(pg, hist) == expected, **overrides)
    _send(producer, topic, 1, [(42, "after-restart", "c"), (40, "live40b", "u")])
    # restart after the switch: Kafka resumes from its checkpoint, the history is not read again
    expected |= {42: ("after-restart",), 40: ("live40b",)}
    runner.run_until(pipeline, lambda r: _pg_rows(pg, hist) == expected, **overrides)
    # queries: backfill (stopped), backfill (job mode), drained backfill → live, live again
    assert len(runner.of_type(ev.FlowStarted)) == 5

    # The same node over another history, in a new checkpoint with the same state backend: the
    # recorded live phase belongs to the first history and is not resumed (that skipped all of it).
    other = f"{unique_name}_h2"
    ch_client.command(f"CREATE TABLE {other} (id Int64, v String) ENGINE = MergeTree ORDER BY id")
    ch_client.command(f"INSERT INTO {other} SELECT number, concat('o', toString(number)) FROM numbers(100, 10)")
    moved = pipeline.replace(f"table_name: {hist}}}", f"table_name: {other}}}").replace(
        f"table: {hist},", f"table: {other},")
    again = Runner(spark, tmp_path / "other", env)
    history = {i: (f"o{i}",) for i in range(100, 110)}
    again.run_until(moved, lambda r: history.items() <= _pg_rows(pg, other).items(), timeout_secs=90, **overrides)


def test_hybrid_refuses_a_live_topic_whose_columns_differ_from_the_history(
        spark: Any, tmp_path: Path, env: dict[str, str], ch_client: Any, unique_name: str, unique_topic: str,
        kafka_bootstrap: str, kafka_admin: Any) -> None:
    from streamling.errors import StreamlingError

    ch_client.command(f"CREATE TABLE {unique_name} (id Int64, v String) ENGINE = MergeTree ORDER BY id")
    _producer(kafka_bootstrap, kafka_admin, unique_topic)
    pipeline = f"""
        sources:
          orders:
            type: hybrid
            primary_key: id
            bounded_sources: [{{source_type: clickhouse, table_name: {unique_name}}}]
            unbounded_source: {{source_type: kafka, topic: {unique_topic}, data_format: json,
                               schema: {{id: string, w: string}}}}
        transforms: {{}}
        sinks:
          out: {{type: blackhole, from: orders}}
    """
    with pytest.raises(StreamlingError) as caught:
        Runner(spark, tmp_path, env).run(pipeline)
    assert ("hybrid source 'orders': phase live gives other columns than phase backfill-0: missing ['v']; "
            "extra ['w']; 'id' is string, not bigint") in str(caught.value)
