"""The postgres sink against a real server: CDC semantics, table creation, replays and failures."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml

from streamling.config import load_settings
from streamling.config.sections import RetrySettings
from streamling.errors import StreamlingError
from streamling.postgres import connect_attempts
from streamling.postgres.columns import compatible
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.runtime.retry import call_with_retry
from streamling.sinks.postgres import PostgresSink
from streamling.spec import parse_pipeline

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

SINK = "pg_out"
ROW_DDL = "id long, name string, amount double, _gs_op string"


class Harness:
    """Builds sinks through the real pipeline spec and settings, and closes them afterwards."""

    def __init__(self, spark: Any, environ: Mapping[str, str]) -> None:
        self.spark = spark
        self.environ = environ
        self.sinks: list[PostgresSink] = []
        self.epoch = 0

    def sink(self, table: str, *, primary_key: str | None = "id", input_ddl: str | None = ROW_DDL,
             overrides: Mapping[str, Any] | None = None, open_now: bool = True, **options: Any) -> PostgresSink:
        node: dict[str, Any] = {"type": "postgres", "from": "gen", "table": table, **options}
        if primary_key is not None:
            node["primary_key"] = primary_key
        doc = {"sources": {"gen": {"type": "generate", "rows": 1}}, "transforms": {}, "sinks": {SINK: node}}
        spec = parse_pipeline(yaml.safe_dump(doc, sort_keys=False)).nodes[SINK]
        settings = load_settings(environ=self.environ, overrides=overrides)
        schema = None
        if input_ddl is not None:
            schema = self.spark.createDataFrame([], input_ddl).schema
        ctx = NodeContext(spec=spec, settings=settings, primary_key=spec.options.key_columns(),
                          input_schema=schema)
        sink = PostgresSink(ctx)
        self.sinks.append(sink)
        if open_now:
            sink.open(self.spark)
        return sink

    def write(self, sink: PostgresSink, rows: list[tuple[Any, ...]], ddl: str = ROW_DDL,
              epoch_id: int | None = None, token: str = "tok") -> int:
        if epoch_id is None:
            self.epoch += 1
            epoch_id = self.epoch
        df = self.spark.createDataFrame(rows, ddl)
        return sink.write(df, Epoch(epoch_id=epoch_id, flow="f0", application_id="test", sink_token=token))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


@pytest.fixture()
def h(spark: Any, pg_environ: Mapping[str, str]) -> Iterator[Harness]:
    harness = Harness(spark, pg_environ)
    yield harness
    harness.close()


def rows(pg: Any, table: str, order: str = "id", columns: str = "*") -> list[tuple[Any, ...]]:
    return pg.execute(f"SELECT {columns} FROM {table} ORDER BY {order}").fetchall()


def column_types(pg: Any, schema: str, table: str) -> dict[str, str]:
    cur = pg.execute("SELECT column_name, data_type FROM information_schema.columns "
                     "WHERE table_schema = %s AND table_name = %s", (schema, table))
    return dict(cur.fetchall())


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- CDC semantics ---------------------------------------------------------------------------------

def test_insert_then_update(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name)
    assert h.write(sink, [(1, "a", 1.0, "i"), (2, "b", 2.0, "i")]) == 2
    assert h.write(sink, [(1, "a2", 10.0, "u")]) == 1
    assert rows(pg, unique_name) == [(1, "a2", 10.0), (2, "b", 2.0)]


def test_update_of_unseen_id_inserts_and_null_op_upserts(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name)
    h.write(sink, [(5, "x", 1.0, "U"), (6, "y", 2.0, None)])
    assert rows(pg, unique_name) == [(5, "x", 1.0), (6, "y", 2.0)]


def test_insert_then_delete(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name)
    h.write(sink, [(1, "a", 1.0, "i"), (2, "b", 2.0, "i")])
    assert h.write(sink, [(1, None, None, "d")]) == 1
    assert rows(pg, unique_name) == [(2, "b", 2.0)]
    h.write(sink, [(2, "b", 2.0, "D")])  # op letters are case-insensitive
    assert rows(pg, unique_name) == []


def test_delete_of_missing_id_is_a_noop(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name)
    h.write(sink, [(99, None, None, "d")])
    assert rows(pg, unique_name) == []
    h.write(sink, [(1, "a", 1.0, "i")])
    h.write(sink, [(99, None, None, "d")])
    assert rows(pg, unique_name) == [(1, "a", 1.0)]


def test_ten_versions_of_one_id_in_one_batch_last_wins(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name)
    batch = [(1, f"v{i}", float(i), "i" if i == 0 else "u") for i in range(10)]
    batch += [(2, "gone", 0.0, "i"), (2, "gone", 1.0, "u"), (2, None, None, "d")]  # ends deleted
    batch += [(3, None, None, "d"), (3, "back", 3.0, "i")]  # ends present
    assert h.write(sink, batch) == len(batch)
    assert rows(pg, unique_name) == [(1, "v9", 9.0), (3, "back", 3.0)]


def test_composite_key(h: Harness, pg: Any, unique_name: str) -> None:
    ddl = "tenant string, id long, name string, _gs_op string"
    sink = h.sink(unique_name, primary_key="tenant, id", input_ddl=ddl)
    h.write(sink, [("a", 1, "a1", "i"), ("b", 1, "b1", "i"), ("a", 2, "a2", "i")], ddl)
    h.write(sink, [("a", 1, "a1-new", "u"), ("b", 1, None, "d"), ("b", 2, "b2", "i")], ddl)
    assert rows(pg, unique_name, order="tenant, id") == [("a", 1, "a1-new"), ("a", 2, "a2"), ("b", 2, "b2")]
    pk = pg.execute("SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i JOIN pg_attribute a "
                    "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                    "WHERE i.indrelid = %s::regclass AND i.indisprimary", (unique_name,)).fetchone()
    assert pk == (["id", "tenant"],)


def test_on_conflict_nothing_keeps_the_first_row(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name, on_conflict="nothing")
    h.write(sink, [(1, "first", 1.0, "i")])
    h.write(sink, [(1, "second", 2.0, "u"), (2, "new", 2.0, "i")])
    assert rows(pg, unique_name) == [(1, "first", 1.0), (2, "new", 2.0)]
    h.write(sink, [(1, None, None, "d")])  # deletes still apply
    assert rows(pg, unique_name) == [(2, "new", 2.0)]


def test_on_conflict_nothing_keeps_the_first_row_of_a_key_within_an_epoch(h: Harness, pg: Any,
                                                                        unique_name: str) -> None:
    sink = h.sink(unique_name, on_conflict="nothing")
    h.write(sink, [(1, "first", 1.0, "i"), (1, "second", 2.0, "u"), (2, "a", 1.0, "i"), (2, "b", 2.0, "u"),
                   (2, "c", 3.0, "u")])
    assert rows(pg, unique_name) == [(1, "first", 1.0), (2, "a", 1.0)]
    # A delete resets the key: the first version after the last delete is what row-by-row gives.
    h.write(sink, [(1, "x", 0.0, "u"), (1, None, None, "d"), (1, "again", 3.0, "i"), (1, "later", 4.0, "u"),
                   (2, None, None, "d"), (3, "n1", 1.0, "i"), (3, "n2", 2.0, "u")])
    assert rows(pg, unique_name) == [(1, "again", 3.0), (3, "n1", 1.0)]


def test_all_columns_in_key_means_do_nothing(h: Harness, pg: Any, unique_name: str) -> None:
    ddl = "a long, b string, _gs_op string"
    sink = h.sink(unique_name, primary_key="a,b", input_ddl=ddl)
    h.write(sink, [(1, "x", "i"), (1, "x", "u"), (2, "y", "i")], ddl)
    h.write(sink, [(1, "x", "u")], ddl)
    assert rows(pg, unique_name, order="a") == [(1, "x"), (2, "y")]


def test_update_where_only_newer_versions(h: Harness, pg: Any, unique_name: str) -> None:
    ddl = "id long, version long, name string, _gs_op string"
    sink = h.sink(unique_name, input_ddl=ddl, update_where={"version": ">"})
    h.write(sink, [(1, 5, "v5", "i"), (2, 1, "v1", "i")], ddl)
    h.write(sink, [(1, 3, "stale", "u"), (2, 2, "v2", "u")], ddl)
    assert rows(pg, unique_name) == [(1, 5, "v5"), (2, 2, "v2")]
    h.write(sink, [(1, 7, "v7", "u")], ddl)
    assert rows(pg, unique_name) == [(1, 7, "v7"), (2, 2, "v2")]


def test_deduplicate_false_applies_rows_in_order(h: Harness, pg: Any, unique_name: str) -> None:
    """Without dedup each row counts: with ``version >`` the highest version wins, not the last row."""
    ddl = "id long, version long, name string, _gs_op string"
    sink = h.sink(unique_name, input_ddl=ddl, update_where={"version": ">"}, deduplicate=False)
    h.write(sink, [(1, 1, "v1", "i"), (1, 3, "v3", "u"), (1, 2, "v2", "u"), (2, 1, "x", "i"), (2, 1, None, "d")],
            ddl)
    assert rows(pg, unique_name) == [(1, 3, "v3")]


def test_without_key_rows_are_appended_once_per_epoch(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name, primary_key=None)
    batch = [(1, "a", 1.0, "i"), (1, "a", 1.0, "i"), (2, "gone?", 0.0, "d")]
    assert h.write(sink, batch, epoch_id=1) == 3
    assert h.write(sink, batch, epoch_id=1) == 3  # replay of the same epoch: not inserted again
    assert rows(pg, unique_name) == [(1, "a", 1.0), (1, "a", 1.0)]
    h.write(sink, [(3, "c", 3.0, "i")], epoch_id=2)
    assert len(rows(pg, unique_name)) == 3


# --- tables and types ------------------------------------------------------------------------------

WIDE_DDL = ("id long, i int, s string, f double, r float, d decimal(10,2), ts timestamp, day date, ok boolean, "
            "bin binary, payload struct<x:int, tags:array<string>, at:timestamp>, nums array<int>, "
            "attrs map<string,double>, _gs_op string")


def test_table_created_in_new_schema_with_mapped_types(h: Harness, pg: Any, unique_name: str) -> None:
    schema = f"s_{unique_name}"
    sink = h.sink(unique_name, schema=schema, input_ddl=WIDE_DDL)
    types = column_types(pg, schema, unique_name)
    assert types == {
        "id": "bigint", "i": "integer", "s": "text", "f": "double precision", "r": "real", "d": "numeric",
        "ts": "timestamp with time zone", "day": "date", "ok": "boolean", "bin": "bytea", "payload": "jsonb",
        "nums": "jsonb", "attrs": "jsonb",
    }
    numeric = pg.execute("SELECT numeric_precision, numeric_scale FROM information_schema.columns "
                         "WHERE table_schema = %s AND table_name = %s AND column_name = 'd'",
                         (schema, unique_name)).fetchone()
    assert numeric == (10, 2)
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    h.write(sink, [
        (1, 7, 'comma, "quote"\nnewline', 0.1 + 0.2, 1.5, decimal.Decimal("12.34"), when, dt.date(2024, 5, 6),
         True, b"\x00\xffA", {"x": 1, "tags": ["a", "b"], "at": when}, [1, 2], {"k": 1.5}, "i"),
        (2, None, "", float("nan"), float("-inf"), None, None, None, False, b"", None, [], {}, "i"),
        (3, None, None, None, None, None, None, None, None, None, {"x": None, "tags": None, "at": None}, None,
         None, "i"),
    ], WIDE_DDL)
    got = rows(pg, f'"{schema}"."{unique_name}"')
    assert got[0][:10] == (1, 7, 'comma, "quote"\nnewline', 0.30000000000000004, 1.5, decimal.Decimal("12.34"),
                           when, dt.date(2024, 5, 6), True, b"\x00\xffA")
    assert got[0][10]["x"] == 1 and got[0][10]["tags"] == ["a", "b"] and got[0][10]["at"].startswith("2024-05-06")
    assert got[0][11:] == ([1, 2], {"k": 1.5})
    assert got[1][2] == "" and got[1][3] != got[1][3] and got[1][4] == float("-inf") and got[1][9] == b""
    assert got[1][11:] == ([], {})
    assert got[2][2] is None and got[2][9] is None and got[2][10] == {}
    value = pg.execute(f"""SELECT payload->'tags'->>1 FROM "{schema}"."{unique_name}" WHERE id = 1""").fetchone()
    assert value == ("b",)


def test_table_created_lazily_on_first_write(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name, input_ddl=None)
    assert column_types(pg, "public", unique_name) == {}
    h.write(sink, [(1, "a", 1.0, "i")])
    assert column_types(pg, "public", unique_name) == {"id": "bigint", "name": "text",
                                                         "amount": "double precision"}
    assert rows(pg, unique_name) == [(1, "a", 1.0)]


def test_existing_table_with_extra_and_wider_columns_is_used(h: Harness, pg: Any, unique_name: str) -> None:
    pg.execute(f"CREATE TABLE {unique_name} (id numeric(30,0) PRIMARY KEY, name varchar(20), "
               "amount numeric, note text DEFAULT 'kept')")
    sink = h.sink(unique_name)
    h.write(sink, [(1, "a", 1.5, "i")])
    assert rows(pg, unique_name) == [(1, "a", decimal.Decimal("1.5"), "kept")]


def test_existing_table_with_incompatible_type_is_an_error(h: Harness, pg: Any, unique_name: str) -> None:
    pg.execute(f"CREATE TABLE {unique_name} (id integer PRIMARY KEY, name text, amount boolean)")
    with pytest.raises(StreamlingError) as info:
        h.sink(unique_name)
    err = info.value
    assert not err.retriable and err.node == SINK and err.code == "postgres_schema_mismatch"
    assert '"id" is integer but the input needs BIGINT' in str(err)
    assert '"amount" is boolean' in str(err)


def test_existing_table_without_matching_key_is_an_error(h: Harness, pg: Any, unique_name: str) -> None:
    pg.execute(f"CREATE TABLE {unique_name} (id bigint, name text, amount double precision)")
    with pytest.raises(StreamlingError, match="no primary key or unique index on \\(id\\)"):
        h.sink(unique_name)


def test_constraint_violation_is_not_retried(h: Harness, pg: Any, unique_name: str) -> None:
    pg.execute(f"CREATE TABLE {unique_name} (id bigint PRIMARY KEY, name text NOT NULL, amount float8)")
    # a retry would wait a minute first: finishing well before that proves there was none, even on a busy machine
    sink = h.sink(unique_name, overrides={"retry": {"max_attempts": 5, "initial_backoff_ms": 60000,
                                                    "max_backoff_ms": 60000}})
    started = time.monotonic()
    with pytest.raises(StreamlingError) as info:
        h.write(sink, [(1, None, 1.0, "i")])
    assert time.monotonic() - started < 30  # no backoff: failed on the first attempt
    err = info.value
    assert not err.retriable and err.node == SINK and err.node_kind == "postgres sink"
    assert "SQLSTATE 23502" in str(err) and "name" in str(err)
    h.write(sink, [(1, "fine", 1.0, "i")])  # the sink stays usable after the rollback
    assert rows(pg, unique_name) == [(1, "fine", 1.0)]


# --- replays and failures --------------------------------------------------------------------------

def test_reconnects_after_the_server_drops_the_connection(h: Harness, pg: Any, unique_name: str) -> None:
    sink = h.sink(unique_name, overrides={"retry": {"max_attempts": 3, "initial_backoff_ms": 10}})
    h.write(sink, [(1, "a", 1.0, "i")])
    pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
               (f"streamling:{SINK}",))
    h.write(sink, [(2, "b", 2.0, "i")])
    assert rows(pg, unique_name) == [(1, "a", 1.0), (2, "b", 2.0)]


def test_unreachable_server_fails_after_bounded_retries(h: Harness, pg_environ: Mapping[str, str],
                                                        unique_name: str) -> None:
    """The sink only classifies; the flow's policy makes the attempts: one connection attempt each."""
    port = closed_port()
    environ = {**pg_environ, "STREAMLING__POSTGRES_SINK__PORT": str(port)}
    harness = Harness(h.spark, environ)
    try:
        policy = {"max_attempts": 3, "initial_backoff_ms": 50, "max_backoff_ms": 100}
        sink = harness.sink(unique_name, open_now=False, overrides={"retry": policy})
        target = f"127.0.0.1:{port}/{pg_environ['STREAMLING__POSTGRES_SINK__DB']}"
        started = time.monotonic()
        with pytest.raises(StreamlingError) as info:
            call_with_retry(lambda: harness.write(sink, [(1, "a", 1.0, "i")]), RetrySettings(**policy), "writing")
        assert time.monotonic() - started < 10
        assert connect_attempts(target) == 3
        err = info.value
        text = str(err)
        assert err.retriable and err.node == SINK and err.node_kind == "postgres sink"
        assert f"127.0.0.1:{port}/" in text and "gave up after 3 attempts" in text and "pg_out" in text
        assert pg_environ["STREAMLING__POSTGRES_SINK__PASS"] not in err.describe(debug=True)
        with pytest.raises(StreamlingError, match="opening the sink"):
            sink.open(h.spark)
        assert connect_attempts(target) == 4
    finally:
        harness.close()


def test_wrong_password_points_at_the_credentials_not_the_data(h: Harness, pg_environ: Mapping[str, str],
                                                               unique_name: str) -> None:
    """A refused login is a settings problem: the hint names the user/pass keys, nothing is retried."""
    environ = {**pg_environ, "STREAMLING__POSTGRES_SINK__PASS": "not-the-password"}
    harness = Harness(h.spark, environ)
    try:
        policy = {"max_attempts": 5, "initial_backoff_ms": 2000}
        sink = harness.sink(unique_name, open_now=False, overrides={"retry": policy})
        env = pg_environ
        target = f"127.0.0.1:{env['STREAMLING__POSTGRES_SINK__PORT']}/{env['STREAMLING__POSTGRES_SINK__DB']}"
        before = connect_attempts(target)
        with pytest.raises(StreamlingError) as info:
            call_with_retry(lambda: harness.write(sink, [(1, "a", 1.0, "i")]), RetrySettings(**policy), "writing")
        assert connect_attempts(target) == before + 1  # not retried
        err = info.value
        text = err.describe(debug=True)
        assert not err.retriable and err.node == SINK and err.code == "postgres_auth"
        assert "password authentication failed" in text and "refused the login of user" in text
        assert "check postgres_sink.user/pass (STREAMLING__POSTGRES_SINK__PASS" in text
        assert "fix the table or the data" not in text and "not-the-password" not in text
    finally:
        harness.close()


def test_a_hung_connection_is_dropped_after_twice_the_statement_timeout(
        h: Harness, pg: Any, unique_name: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server that stops answering without closing the socket (its backend SIGSTOPped, loopback
    only, for a few seconds at most) costs 2 × statement_timeout_secs, then a fresh connection.

    The partition writer runs here, in the test process, exactly as an executor task runs it (with
    this process's pool of writer connections), so the hung connection is the one the next write
    takes and the pool's warning is logged where the test sees it."""
    sink = h.sink(unique_name, overrides={"postgres_sink": {"statement_timeout_secs": 1}})
    writer = sink.partition_writer(h.spark.createDataFrame([], ROW_DDL).schema,
                                   Epoch(epoch_id=1, flow="f0", application_id="test", sink_token="tok"))

    def write(batch: list[tuple[Any, ...]]) -> dict[str, Any]:
        return writer.write(h.spark.createDataFrame(batch, ROW_DDL).toArrow(), 0)

    assert write([(1, "a", 1.0, "i")])["error_kind"] is None
    (pid,) = pg.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s "  # the writer's, newest
                        "ORDER BY backend_start DESC LIMIT 1", (f"streamling:{SINK}",)).fetchone()
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="streamling.postgres"):
            result = write([(2, "b", 2.0, "i")])  # the pooled connection hangs: dropped, a fresh one writes
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert result["error_kind"] is None and result["attempts"] == 1
    assert 2 <= elapsed < 5
    assert any("did not complete within 2 s" in r.getMessage() for r in caplog.records)
    assert rows(pg, unique_name) == [(1, "a", 1.0), (2, "b", 2.0)]

    # Hanging in the middle of an epoch's statements: a transient error, and the next attempt writes.
    stopped: list[int] = []

    def hang(conn: Any) -> None:
        (own,) = conn.execute("SELECT pg_backend_pid()").fetchone()
        stopped.append(own)
        os.kill(own, signal.SIGSTOP)
        conn.execute("SELECT 1")

    try:
        with pytest.raises(StreamlingError) as info:
            sink._run("probing", hang)
    finally:
        for own in stopped:
            os.kill(own, signal.SIGCONT)
    assert info.value.retriable and "did not complete within 2 s" in str(info.value)
    h.write(sink, [(3, "c", 3.0, "i")])
    assert len(rows(pg, unique_name)) == 3


def test_per_sink_connection_override(h: Harness, pg: Any, pg_environ: Mapping[str, str], unique_name: str) -> None:
    """``STREAMLING__POSTGRES_SINK_CONNECTIONS__<SINK>__DB`` sends this sink to another database."""
    other = f"db_{unique_name}"
    pg.execute(f'CREATE DATABASE "{other}"')
    try:
        environ = {**pg_environ, "STREAMLING__POSTGRES_SINK_CONNECTIONS__PG_OUT__DB": other}
        harness = Harness(h.spark, environ)
        sink = harness.sink(unique_name)
        harness.write(sink, [(1, "a", 1.0, "i")])
        harness.close()
        assert column_types(pg, "public", unique_name) == {}
        import psycopg

        dsn = pg_environ["STREAMLING_TEST_POSTGRES_DSN"].replace("/streamling?", f"/{other}?")
        with psycopg.connect(dsn) as conn:
            assert rows(conn, unique_name) == [(1, "a", 1.0)]
    finally:
        pg.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')


# --- type compatibility rules (no server needed, kept next to the sink's other checks) ------------

@pytest.mark.parametrize(("expected", "actual", "ok"), [
    ("BIGINT", "bigint", True), ("BIGINT", "integer", False), ("BIGINT", "numeric", True),
    ("BIGINT", "numeric(19,0)", True), ("BIGINT", "numeric(18,0)", False), ("INTEGER", "bigint", True),
    ("NUMERIC(10,2)", "numeric(12,2)", True), ("NUMERIC(10,2)", "numeric(10,1)", False),
    ("NUMERIC(10,2)", "numeric(10,4)", False), ("NUMERIC(18,0)", "bigint", True), ("NUMERIC(10,0)", "integer", False),
    ("DOUBLE PRECISION", "real", False), ("TEXT", "character varying(20)", True), ("TEXT", "integer", False),
    ("TIMESTAMPTZ", "timestamp with time zone", True), ("TIMESTAMPTZ", "timestamp(3) with time zone", False),
    ("JSONB", "json", True), ("BYTEA", "text", False), ("BOOLEAN", "boolean", True),
])
def test_compatibility_rules(expected: str, actual: str, ok: bool) -> None:
    assert compatible(expected, actual) is ok
