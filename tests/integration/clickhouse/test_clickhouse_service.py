"""The ClickHouse test service: the real engine's SQL behind ClickHouse's HTTP interface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pytest

from streamling.clickhouse import connect, error, is_transient
from streamling.config import load_settings

pytestmark = pytest.mark.clickhouse


def test_replacing_merge_tree_final_through_arrow(ch_client: Any, unique_name: str) -> None:
    ch_client.command(f"CREATE TABLE {unique_name} (id UInt64, v String, ver UInt64, is_deleted UInt8) "
                      "ENGINE = ReplacingMergeTree(ver, is_deleted) ORDER BY id")
    for ver, rows in enumerate([[(1, "a", 0), (2, "b", 0), (3, "c", 0)], [(1, "a2", 0), (3, "c", 1)]], start=1):
        ch_client.insert_arrow(unique_name, pa.table({
            "id": pa.array([r[0] for r in rows], pa.uint64()), "v": [r[1] for r in rows],
            "ver": pa.array([ver] * len(rows), pa.uint64()), "is_deleted": pa.array([r[2] for r in rows], pa.uint8())}))
    got = ch_client.query_arrow(f"SELECT id, v FROM {unique_name} FINAL ORDER BY id", use_strings=True)
    assert got.to_pylist() == [{"id": 1, "v": "a2"}, {"id": 2, "v": "b"}]


def test_errors_carry_clickhouse_codes_and_are_classified(ch_client: Any, ch_environ: Mapping[str, str]) -> None:
    with pytest.raises(Exception) as bad_sql:
        ch_client.query("SELECT nope FROM system.one")
    assert not is_transient(bad_sql.value)
    sink = load_settings(environ=ch_environ).clickhouse_sink
    message = error("clickhouse sink", "out", "reading", bad_sql.value, sink)
    assert "Code: 47" in str(message) and "UNKNOWN_IDENTIFIER" in str(message) and not message.retriable
    conn = load_settings(environ=ch_environ).clickhouse_source.model_copy(update={"password": "wrong"})
    with pytest.raises(Exception) as refused:
        connect(conn).query("SELECT 1")
    assert "516" in str(refused.value) and not is_transient(refused.value)
    assert "wrong" not in str(error("clickhouse source", "s", "connecting", refused.value, conn))
