"""The postgres sink's partition writers: several per epoch (``parallelism``), each in its own Spark
task and transaction, with failures reported to the driver instead of raised into Spark."""

from __future__ import annotations

import collections
import random
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from test_postgres_sink import ROW_DDL, SINK, Harness, rows

from streamling.config.sections import RetrySettings
from streamling.errors import StreamlingError
from streamling.runtime.retry import call_with_retry

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


@pytest.fixture()
def h(spark: Any, pg_environ: Mapping[str, str]) -> Iterator[Harness]:
    harness = Harness(spark, pg_environ)
    yield harness
    harness.close()


def last_op_per_key(batches: list[list[tuple[Any, ...]]]) -> list[tuple[Any, ...]]:
    """What row-by-row application of the batches leaves in the table."""
    table: dict[int, tuple[Any, ...]] = {}
    for batch in batches:
        for row in batch:
            if row[3] == "d":
                table.pop(row[0], None)
            else:
                table[row[0]] = row[:3]
    return sorted(table.values())


def test_parallel_writers_leave_the_last_op_of_every_key(h: Harness, pg: Any, unique_name: str) -> None:
    """Forty ops per key, interleaved over the input partitions, written by four writers: each key's
    ops stay in one writer and in the epoch's order, so the table holds each key's last op."""
    sink = h.sink(unique_name, parallelism=4)
    rng = random.Random(7)
    batches = []
    for _ in range(2):
        batch = []
        for version in range(40):
            for key in range(60):
                op = rng.choice("iuud")
                batch.append((key, None if op == "d" else f"k{key}v{version}", float(version), op))
        batches.append(batch)
    for batch in batches:
        assert h.write(sink, batch) == len(batch)
    expected = last_op_per_key(batches)
    assert 0 < len(expected) < 60  # some keys end deleted, the others updated
    assert rows(pg, unique_name) == expected
    h.write(sink, batches[-1], epoch_id=h.epoch)  # a replayed epoch converges to the same table
    assert rows(pg, unique_name) == expected


def test_keyless_replay_after_a_failed_partition_writes_only_the_missing_rows(h: Harness, pg: Any,
                                                                              unique_name: str) -> None:
    """One of four writers fails (a CHECK rejects one row): the other partitions commit with their
    epoch mark. The replay, with its rows arriving in other input partitions and another order,
    writes only the partition that failed: every row once."""
    pg.execute(f"CREATE TABLE {unique_name} (id bigint, name text CONSTRAINT no_poison CHECK (name <> 'poison'), "
               "amount double precision)")
    sink = h.sink(unique_name, primary_key=None, parallelism=4)
    batch = [(i, "poison" if i == 17 else f"n{i % 5}", float(i % 3), "i") for i in range(48)]
    with pytest.raises(StreamlingError) as info:
        h.write(sink, batch, epoch_id=1)
    err = info.value
    assert not err.retriable and err.node == SINK and err.code == "postgres_error"
    assert "SQLSTATE 23514" in str(err) and "of 4" in str(err)
    partial = len(rows(pg, unique_name))
    assert 0 < partial < len(batch)  # the other writers committed

    pg.execute(f"ALTER TABLE {unique_name} DROP CONSTRAINT no_poison")
    replay = h.spark.createDataFrame(list(reversed(batch)), ROW_DDL).repartition(3)
    from streamling.runtime.nodes import Epoch

    epoch = Epoch(epoch_id=1, flow="f0", application_id="test", sink_token="tok")
    assert sink.write(replay, epoch) == len(batch)
    expected = sorted(r[:3] for r in batch)
    assert rows(pg, unique_name, order="id") == expected
    assert sink.write(replay, epoch) == len(batch)  # written in full: nothing more
    assert rows(pg, unique_name, order="id") == expected


def test_failed_writers_are_raised_once_on_the_driver_naming_the_sink(h: Harness, pg: Any,
                                                                      unique_name: str) -> None:
    """Two writers hit a transient failure (SQLSTATE 40001 from a trigger) in every attempt: the
    flow's policy alone retries (each writer ran once per attempt: Spark retried no task) and the
    one error raised names the sink, what it attempted and how many writers failed."""
    pg.execute(f"CREATE TABLE {unique_name} (id bigint PRIMARY KEY, name text, amount double precision)")
    pg.execute(f"CREATE SEQUENCE {unique_name}_hits")
    pg.execute(f"""CREATE FUNCTION {unique_name}_fail() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.name = 'conflict' THEN
            PERFORM nextval('{unique_name}_hits');
            RAISE EXCEPTION 'simulated serialization failure' USING ERRCODE = '40001';
          END IF;
          RETURN NEW;
        END $$""")
    pg.execute(f"CREATE TRIGGER fail BEFORE INSERT ON {unique_name} FOR EACH ROW EXECUTE FUNCTION {unique_name}_fail()")
    sink = h.sink(unique_name, parallelism=4)
    from pyspark.sql import functions as F

    ids = h.spark.range(40).repartition(4, "id").select("id", F.spark_partition_id().alias("p")).collect()
    first_per_partition = {p: i for i, p in sorted((r["id"], r["p"]) for r in ids)[::-1]}
    poisoned = sorted(first_per_partition.values())[:2]  # two ids in two different writers
    first_per_partition_of = {i: p for p, i in first_per_partition.items()}
    batch = [(i, "conflict" if i in poisoned else f"n{i}", 1.0, "i") for i in range(40)]
    retries: list[int] = []
    policy = RetrySettings(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=20)
    with pytest.raises(StreamlingError) as info:
        call_with_retry(lambda: h.write(sink, batch, epoch_id=1), policy, "writing",
                        lambda _exc, attempt: retries.append(attempt))
    err = info.value
    text = str(err)
    assert err.retriable and err.node == SINK and err.node_kind == "postgres sink"
    assert err.code == "postgres_unavailable"
    assert text.startswith(f"postgres sink '{SINK}': cannot write to Postgres at ")
    assert "writing epoch 1, partition" in text and "of 4 (2 writers failed)" in text
    assert "SQLSTATE 40001: simulated serialization failure" in text and "gave up after 3 attempts" in text
    assert retries == [1, 2]
    (hits,) = pg.execute(f"SELECT last_value FROM {unique_name}_hits").fetchone()
    assert hits == 3 * 2  # three flow attempts × two failing writers, each run exactly once
    written = collections.Counter(r[0] for r in rows(pg, unique_name))
    failed = {first_per_partition_of[i] for i in poisoned}
    # the two failing writers' partitions rolled back as a whole, the two others committed
    assert set(written) == {r["id"] for r in ids if r["p"] not in failed} and set(written.values()) == {1}
