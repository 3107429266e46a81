"""The ClickHouse source on ReplacingMergeTree tables: Streamling's FINAL semantics, computed by the
source itself (``ReplacingMergeTree(version, is_deleted)``).

Per sorting-key tuple the row with the highest version wins, a delete wins a tie of versions, a key
whose winner is a delete is dropped, and the version and ``is_deleted`` columns take part whether or
not ``columns`` selects them (the hybrid source projects to the live topic's columns). Pages are cut
on the first sort-key column, so a hot key with more rows than ``page_size`` is still read whole,
once. Mirrors Streamling's e2e tests ``test_clickhouse_source_replacing_dedup_when_version_column_
not_selected``, ``…_tied_version_delete_drops_key`` and ``…_hot_first_key_exceeds_page_size``.

Each test runs the source as a flow does: ``read_stream`` on the shared SparkSession, an
``availableNow`` query, every micro-batch collected (so a duplicate emission is counted).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamling.config import load_settings
from streamling.runtime.nodes import NodeContext
from streamling.sources.clickhouse import ClickHouseSource
from streamling.spec import parse_pipeline

pytestmark = [pytest.mark.clickhouse, pytest.mark.spark]

RMT = ("(block_number UInt64, id String, payload String, insert_timestamp DateTime, is_deleted UInt8) "
       "ENGINE = ReplacingMergeTree(insert_timestamp, is_deleted) ORDER BY (block_number, id)")


def source(environ: Mapping[str, str], table: str, page_size: int | None = None,
           **options: Any) -> ClickHouseSource:
    doc = {"sources": {"ch": {"type": "clickhouse", "table_name": table, **options}},
           "sinks": {"out": {"type": "blackhole", "from": "ch"}}}
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["ch"]
    overrides: dict[str, Any] = {"clickhouse_source": {"page_size": page_size}} if page_size else {}
    return ClickHouseSource(NodeContext(spec=spec, settings=load_settings(environ=environ, overrides=overrides)))


def scan(spark: Any, tmp_path: Path, node: ClickHouseSource) -> tuple[list[str], list[dict[str, Any]], int]:
    """The source's columns, every row it emitted (duplicates kept) and the number of non-empty epochs."""
    rows: list[dict[str, Any]] = []
    epochs: list[int] = []

    def collect(batch: Any, batch_id: int) -> None:
        got = [r.asDict() for r in batch.collect()]
        if got:
            epochs.append(batch_id)
        rows.extend(got)

    frame = node.read_stream(spark)
    query = (frame.writeStream.foreachBatch(collect).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    query.awaitTermination(120)
    query.stop()
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return frame.columns, rows, len(epochs)


def test_dedup_by_version_when_the_version_column_is_not_selected(spark: Any, tmp_path: Path,
                                                                 ch_environ: Mapping[str, str], ch_client: Any,
                                                                 unique_name: str) -> None:
    ch_client.command(f"CREATE TABLE {unique_name} {RMT}")
    # 5 keys, 9 rows in one part: the newest version wins wherever it sits; a delete at the newest
    # version drops its key ('d'); an older delete does not ('e').
    ch_client.command(f"""INSERT INTO {unique_name} SETTINGS optimize_on_insert = 0 VALUES
        (1, 'a', 'a1', toDateTime(1000), 0),
        (2, 'b', 'b_old', toDateTime(1000), 0), (2, 'b', 'b_new', toDateTime(2000), 0),
        (3, 'c', 'c_new', toDateTime(2000), 0), (3, 'c', 'c_old', toDateTime(1000), 0),
        (4, 'd', 'd_alive', toDateTime(1000), 0), (4, 'd', 'd_deleted', toDateTime(2000), 1),
        (5, 'e', 'e_alive', toDateTime(2000), 0), (5, 'e', 'e_deleted', toDateTime(1000), 1)""")
    columns, rows, _ = scan(spark, tmp_path, source(ch_environ, unique_name, columns="block_number,id,payload"))
    assert columns == ["block_number", "id", "payload", "_gs_op"]  # the version is not leaked
    assert sorted((r["id"], r["payload"]) for r in rows) == [("a", "a1"), ("b", "b_new"), ("c", "c_new"),
                                                             ("e", "e_alive")]
    # Selected or not, the same rows (and a filter sees the winning row, as with FINAL).
    _, rows, _ = scan(spark, tmp_path / "all", source(ch_environ, unique_name))
    assert sorted((r["id"], r["payload"], r["is_deleted"]) for r in rows) == [
        ("a", "a1", 0), ("b", "b_new", 0), ("c", "c_new", 0), ("e", "e_alive", 0)]
    _, rows, _ = scan(spark, tmp_path / "filtered",
                      source(ch_environ, unique_name, columns="id,payload", filter="payload LIKE '%old'"))
    assert rows == []  # 'b_old' and 'c_old' are superseded: a filter never resurrects a stale version


def test_a_delete_wins_a_tie_of_versions_and_drops_the_key(spark: Any, tmp_path: Path,
                                                          ch_environ: Mapping[str, str], ch_client: Any,
                                                          unique_name: str) -> None:
    ch_client.command(f"CREATE TABLE {unique_name} {RMT}")
    # Live and delete at the same version, in both orders; ClickHouse's own FINAL keeps the row read
    # last ('b' survives it), Streamling drops both keys.
    ch_client.command(f"""INSERT INTO {unique_name} SETTINGS optimize_on_insert = 0 VALUES
        (1, 'a', 'a_alive', toDateTime(1000), 0), (1, 'a', 'a_alive', toDateTime(1000), 1),
        (2, 'b', 'b_alive', toDateTime(1000), 1), (2, 'b', 'b_alive', toDateTime(1000), 0),
        (3, 'c', 'c_alive', toDateTime(1000), 0)""")
    _, rows, _ = scan(spark, tmp_path, source(ch_environ, unique_name, columns="block_number,id,payload"))
    assert [(r["id"], r["payload"]) for r in rows] == [("c", "c_alive")]


def test_a_hot_first_key_larger_than_a_page_arrives_once(spark: Any, tmp_path: Path,
                                                         ch_environ: Mapping[str, str], ch_client: Any,
                                                         unique_name: str) -> None:
    ch_client.command(f"CREATE TABLE {unique_name} {RMT}")
    ch_client.command(f"SYSTEM STOP MERGES {unique_name}")
    # Blocks 0..9 and 101: one row each. Hot block 100: 100 ids in 'old' then 'new' versions (every
    # third also a 'mid' one) in separate parts; h090..h099 get a newer tombstone. 255 raw rows.
    sparse = [f"({b}, 's{b}', 'new', toDateTime(1000), 0)" for b in range(10)] + \
        ["(101, 't0', 'new', toDateTime(1000), 0)"]
    old = [f"(100, 'h{i:03}', 'old', toDateTime(1000), 0)" for i in range(100)]
    mid = [f"(100, 'h{i:03}', 'mid', toDateTime(1500), 0)" for i in range(0, 100, 3)]
    new = [f"(100, 'h{i:03}', 'new', toDateTime(2000), 0)" for i in range(100)]
    tombstones = [f"(100, 'h{i:03}', 'new', toDateTime(3000), 1)" for i in range(90, 100)]
    for part in (sparse, old, mid, new, tombstones):
        ch_client.command(f"INSERT INTO {unique_name} SETTINGS optimize_on_insert = 0 VALUES {', '.join(part)}")
    node = source(ch_environ, unique_name, page_size=30, columns="block_number,id,payload")
    _, rows, epochs = scan(spark, tmp_path, node)
    ids = [r["id"] for r in rows]
    assert len(ids) == 101 and len(set(ids)) == 101  # every live key exactly once
    assert sum(1 for r in rows if r["block_number"] == 100) == 90
    assert {r["payload"] for r in rows} == {"new"}  # no stale version
    assert not [i for i in ids if "h090" <= i <= "h099"]  # tombstoned ids dropped
    assert epochs >= 2  # it was paged: sparse blocks before, the hot block whole in one page


def test_a_replacing_table_without_a_version_reads_as_final(spark: Any, tmp_path: Path,
                                                           ch_environ: Mapping[str, str], ch_client: Any,
                                                           unique_name: str) -> None:
    # No version column: ClickHouse keeps the row inserted last, which only FINAL knows.
    ch_client.command(f"CREATE TABLE {unique_name} (k UInt64, v String) ENGINE = ReplacingMergeTree ORDER BY k")
    ch_client.command(f"INSERT INTO {unique_name} SETTINGS optimize_on_insert = 0 VALUES (1, 'old'), (2, 'x'), "
                      "(1, 'new')")
    _, rows, _ = scan(spark, tmp_path, source(ch_environ, unique_name, columns="k,v"))
    assert sorted((int(r["k"]), r["v"]) for r in rows) == [(1, "new"), (2, "x")]
