"""Postgres dynamic tables against a real server: the created schema, table and index; values
filled by a pipeline; rows inserted or deleted directly in Postgres honoured at the next epoch
(between runs and while a pipeline runs); one lookup round trip per epoch; cache and errors."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import Runner

from streamling.config import load_settings
from streamling.config.sections import RetrySettings
from streamling.errors import StreamlingError
from streamling.postgres import connect_attempts
from streamling.runtime import events as ev
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.runtime.retry import call_with_retry
from streamling.sources.generate import generate_batch
from streamling.spec import parse_pipeline
from streamling.transforms.dynamic_table import PostgresDynamicTable, open_backend

pytestmark = pytest.mark.postgres

ROWS, PER_EPOCH, THRESHOLD = 300, 100, 950


def customers(rows: int = ROWS) -> list[tuple[int, str, float]]:
    batch = generate_batch("orders", 0, rows, 0, 0).to_pydict()
    return list(zip(batch["id"], batch["customer"], batch["amount"], strict=True))


def table_node(schema: str, sql: str | None = None, **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "dynamic_table", "backend_type": "postgres", "backend_entity_name": "watch",
                            "schema": schema, **extra}
    if sql is not None:
        node["sql"] = sql
    return node


def checked_pipeline(schema: str, sink_table: str, table: dict[str, Any],
                     source: dict[str, Any] | None = None) -> str:
    doc = {
        "sources": {"orders": source or {"type": "generate", "rows": ROWS, "rows_per_batch": PER_EPOCH,
                                         "primary_key": "id"}},
        "transforms": {
            "watch": table,
            "checked": {"type": "sql", "sql": "SELECT id, customer, dynamic_table_check('watch', customer) AS hit, "
                                              "dynamic_table_check('watch', 'flag-x') AS flagged FROM orders"},
        },
        "sinks": {"db": {"type": "postgres", "from": "checked", "schema": schema, "table": sink_table}},
    }
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture()
def runner(spark: Any, tmp_path: Path, pg_environ: Mapping[str, str]) -> Runner:
    return Runner(spark, tmp_path, environ=pg_environ)


@pytest.mark.spark
def test_pipeline_fills_the_created_table_and_a_later_run_sees_direct_edits(
        spark: Any, tmp_path: Path, pg_environ: Mapping[str, str], pg: Any, unique_name: str) -> None:
    schema = unique_name
    first = Runner(spark, tmp_path / "first", environ=pg_environ)
    run = first.run(checked_pipeline(schema, "first", table_node(
        schema, f"SELECT customer FROM orders WHERE amount > {THRESHOLD}")))
    big = {c for _, c, a in customers() if a > THRESHOLD}

    # schema, table and index were created with Streamling's layout
    columns = pg.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s "
                         "AND table_name = 'watch' ORDER BY ordinal_position", (schema,)).fetchall()
    assert columns == [("value", "text"), ("updated_at", "timestamp with time zone")]
    indexes = {r[0] for r in pg.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = "
                                        "'watch'", (schema,))}
    assert "idx_watch_updated_at" in indexes and len(indexes) == 2  # plus the primary key's
    assert {r[0] for r in pg.execute(f'SELECT value FROM "{schema}".watch')} == big

    # each row was checked after its own epoch's values were added
    hits = dict(pg.execute(f'SELECT id, hit FROM "{schema}".first').fetchall())
    assert hits == {i: a > THRESHOLD for i, _, a in customers()}
    backend = run.plan.nodes["watch"].backend  # type: ignore[attr-defined]
    epochs = len(first.of_type(ev.EpochFlushed))
    assert epochs == ROWS // PER_EPOCH
    assert backend.stats["reads"] == epochs  # one lookup round trip per epoch, not per row

    # edit the table directly; a second pipeline that shares nothing else but reads it honours that
    removed, added = sorted(big)[0], "customer-0001"
    pg.execute(f'DELETE FROM "{schema}".watch WHERE value = %s', (removed,))
    pg.execute(f'INSERT INTO "{schema}".watch (value) VALUES (%s), (%s)', (added, "flag-x"))
    second = Runner(spark, tmp_path / "second", environ=pg_environ)
    second.run(checked_pipeline(schema, "second", table_node(schema)))
    now = (big - {removed}) | {added}
    got = {i: (h, f) for i, h, f in pg.execute(f'SELECT id, hit, flagged FROM "{schema}".second')}
    assert got == {i: (c in now, True) for i, c, _ in customers()}


@pytest.mark.spark
def test_rows_inserted_and_deleted_while_running_count_from_the_next_epoch(
        runner: Runner, pg: Any, unique_name: str) -> None:
    schema = unique_name
    text = checked_pipeline(schema, "live", table_node(schema), source={
        "type": "generate", "rows_per_second": 50, "rows_per_batch": 50, "primary_key": "id"})
    phase = {"n": 0, "last_flagged": -1}

    def flagged_ids() -> tuple[list[int], list[int]]:
        rows = pg.execute(f'SELECT id, flagged FROM "{schema}".live').fetchall()
        return [i for i, f in rows if f], [i for i, f in rows if not f]

    def progressed(_: Runner) -> bool:
        exists = pg.execute("SELECT to_regclass(%s)", (f"{schema}.live",)).fetchone()[0] is not None
        if not exists:
            return False
        yes, no = flagged_ids()
        if phase["n"] == 0 and no:  # running, nothing flagged yet: flag while it runs
            pg.execute(f'INSERT INTO "{schema}".watch (value) VALUES (%s)', ("flag-x",))
            phase["n"] = 1
        elif phase["n"] == 1 and yes:  # seen at a later epoch: now remove it
            pg.execute(f'DELETE FROM "{schema}".watch WHERE value = %s', ("flag-x",))
            phase["n"], phase["last_flagged"] = 2, max(yes)
        elif phase["n"] == 2:
            return any(i > max(yes) for i in no)  # unflagged again after the delete
        return False

    run = runner.run_until(text, progressed, timeout_secs=240)
    yes, no = flagged_ids()
    assert yes and min(yes) > min(no) and any(i > max(yes) for i in no)
    backend = run.plan.nodes["watch"].backend  # type: ignore[attr-defined]
    assert backend.stats["reads"] == len(runner.of_type(ev.EpochFlushed))


# --- the backend on its own (no Spark) ------------------------------------------------------------

class Tables:
    def __init__(self, environ: Mapping[str, str], schema: str) -> None:
        self.environ, self.schema = environ, schema
        self.opened: list[PostgresDynamicTable] = []
        self.epoch = 0

    def open(self, overrides: Mapping[str, Any] | None = None, **node: Any) -> PostgresDynamicTable:
        doc = {"sources": {"s": {"type": "generate", "rows": 1}},
               "transforms": {"watch": table_node(self.schema, **node),
                              "c": {"type": "sql", "sql": "SELECT id FROM s WHERE dynamic_table_check('watch', 'x')"}},
               "sinks": {"o": {"type": "print", "from": "c"}}}
        spec = parse_pipeline(yaml.safe_dump(doc, sort_keys=False)).nodes["watch"]
        settings = load_settings(environ=self.environ, cwd=Path("/nonexistent"), overrides=overrides)
        backend = open_backend(NodeContext(spec=spec, settings=settings), spec.options)
        assert isinstance(backend, PostgresDynamicTable)
        self.opened.append(backend)
        return backend

    def next_epoch(self) -> Epoch:
        self.epoch += 1
        return Epoch(self.epoch, "f", "app", started_at=time.time())


@pytest.fixture()
def tables(pg_environ: Mapping[str, str], unique_name: str) -> Iterator[Tables]:
    t = Tables(pg_environ, unique_name)
    yield t
    for backend in t.opened:
        backend.close()


def test_values_are_added_in_batches_and_read_once_per_epoch(tables: Tables, pg: Any) -> None:
    backend = tables.open(overrides={"dynamic_table_backend": {"max_batch_size": 2}})
    backend.add(["a", "b", "c", "a"])
    assert backend.stats["writes"] == 2  # max_batch_size values per statement
    epoch = tables.next_epoch()
    assert backend.members(epoch) == {"a", "b", "c"}
    assert backend.members(epoch) == {"a", "b", "c"}
    assert backend.stats["reads"] == 1  # the second check in the same epoch reuses the read
    pg.execute(f'DELETE FROM "{tables.schema}".watch WHERE value = %s', ("b",))
    assert backend.members(tables.next_epoch()) == {"a", "c"}
    assert backend.stats["reads"] == 2


def test_cached_table_reads_only_newer_rows_and_debounces(tables: Tables, pg: Any) -> None:
    backend = tables.open(cache=True, cache_refresh_debounce_ms=0)
    backend.add(["a"])
    assert backend.members(tables.next_epoch()) == {"a"}
    pg.execute(f'INSERT INTO "{tables.schema}".watch (value) VALUES (%s)', ("b",))
    assert backend.members(tables.next_epoch()) == {"a", "b"}
    # the cache is incremental: a direct delete is not seen until the cache is rebuilt (restart)
    pg.execute(f'DELETE FROM "{tables.schema}".watch WHERE value = %s', ("a",))
    assert backend.members(tables.next_epoch()) == {"a", "b"}
    slow = tables.open(cache=True, cache_refresh_debounce_ms=60_000)
    assert slow.members(tables.next_epoch()) == {"b"}
    pg.execute(f'INSERT INTO "{tables.schema}".watch (value) VALUES (%s)', ("c",))
    reads = slow.stats["reads"]
    assert slow.members(tables.next_epoch()) == {"b"}  # within the debounce window: no round trip
    assert slow.stats["reads"] == reads


def test_existing_table_with_its_own_columns(tables: Tables, pg: Any) -> None:
    pg.execute(f'CREATE SCHEMA "{tables.schema}"')
    pg.execute(f'CREATE TABLE "{tables.schema}".watch (address TEXT PRIMARY KEY)')  # no time column
    backend = tables.open(column="address")
    backend.add(["0xabc"])
    assert backend.members(tables.next_epoch()) == {"0xabc"}
    with pytest.raises(StreamlingError, match="has no time column 'updated_at'") as info:
        tables.open(column="address", cache=True).members(tables.next_epoch())
    assert info.value.node == "watch" and "turn 'cache' off" in (info.value.hint or "")
    with pytest.raises(StreamlingError, match="has no column 'value'"):
        tables.open().members(tables.next_epoch())


def test_non_orderable_time_column_fails_fast_with_cache(tables: Tables, pg: Any) -> None:
    pg.execute(f'CREATE SCHEMA "{tables.schema}"')
    pg.execute(f'CREATE TABLE "{tables.schema}".watch (value TEXT PRIMARY KEY, updated_at TEXT)')
    with pytest.raises(StreamlingError, match="cannot be compared with timestamps"):
        tables.open(cache=True).members(tables.next_epoch())


def test_unreachable_postgres_names_the_node_and_the_settings(tables: Tables) -> None:
    """The backend only classifies: one connection attempt per flow attempt, the flow's policy decides."""
    backend = tables.open(overrides={"dynamic_table_backend": {"postgres": {"port": 1}}})
    before = connect_attempts("127.0.0.1:1")
    with pytest.raises(StreamlingError) as info:
        call_with_retry(lambda: backend.members(tables.next_epoch()),
                        RetrySettings(max_attempts=2, initial_backoff_ms=1), "checking the watch list")
    text = info.value.headline()
    assert text.startswith("dynamic_table transform 'watch': cannot reach Postgres at 127.0.0.1:1: ")
    assert "check dynamic_table_backend.postgres.*" in text and info.value.retriable
    assert "gave up after 2 attempts" in str(info.value)
    assert connect_attempts("127.0.0.1:1") - before == 2


def test_cache_enabled_in_config_leaves_a_table_without_time_column_uncached(tables: Tables, pg: Any) -> None:
    pg.execute(f'CREATE SCHEMA "{tables.schema}"')
    pg.execute(f'CREATE TABLE "{tables.schema}".watch (value TEXT PRIMARY KEY)')  # no updated_at
    backend = tables.open(overrides={"dynamic_table_backend": {"postgres": {"cache_enabled": True}}})
    backend.add(["a"])
    assert backend.members(tables.next_epoch()) == {"a"}
    assert not backend.cache_enabled
    pg.execute(f'DELETE FROM "{tables.schema}".watch WHERE value = %s', ("a",))
    pg.execute(f'INSERT INTO "{tables.schema}".watch (value) VALUES (%s)', ("b",))
    assert backend.members(tables.next_epoch()) == {"b"}  # uncached: direct deletes are seen at once
    with_time = Tables(tables.environ, tables.schema + "_t")
    try:
        cached = with_time.open(overrides={"dynamic_table_backend": {"postgres": {"cache_enabled": True}}})
        cached.add(["x"])
        assert cached.members(with_time.next_epoch()) == {"x"} and cached.cache_enabled
    finally:
        for opened in with_time.opened:
            opened.close()
        pg.execute(f'DROP SCHEMA IF EXISTS "{tables.schema}_t" CASCADE')
