"""Dynamic tables end to end on Spark with the InMemory backend: filled by ``sql`` from each epoch's
batch before the SQL transforms that check it, and ``dynamic_table_check`` semantics."""

from __future__ import annotations

import pytest

from streamling.errors import StreamlingError
from streamling.runtime import events as ev
from streamling.sources.generate import generate_batch

pytestmark = pytest.mark.spark

ROWS, PER_EPOCH, THRESHOLD = 300, 100, 950
LATE = "customer-0099"  # the only big spender of epoch 1 (rows 100..199) with that name


def orders() -> list[dict]:
    return generate_batch("orders", 0, ROWS, 0, 0).to_pylist()


def test_filled_from_the_same_epoch_and_checked_with_values_lists_and_nulls(runner, tmp_path, read_delta):
    flagged_path, big_path = tmp_path / "flagged", tmp_path / "big"
    run = runner.run(f"""
        sources:
          orders: {{type: generate, rows: {ROWS}, rows_per_batch: {PER_EPOCH}, primary_key: id}}
        transforms:
          big_spenders:
            type: dynamic_table
            backend_type: in-memory
            backend_entity_name: big_spenders
            sql: SELECT customer FROM orders WHERE amount > {THRESHOLD}
          flagged:
            type: sql
            sql: >-
              SELECT id, customer,
                     dynamic_table_check('big_spenders', customer) AS is_big,
                     dynamic_table_check('big_spenders', '{LATE}') AS late_known,
                     dynamic_table_check('big_spenders', array('nobody', NULL, customer)) AS any_big,
                     dynamic_table_check('big_spenders', CAST(NULL AS STRING)) AS null_value,
                     dynamic_table_check('big_spenders', CAST(array() AS ARRAY<STRING>)) AS empty_list,
                     dynamic_table_check('big_spenders', CAST(NULL AS ARRAY<STRING>)) AS null_list,
                     dynamic_table_check(tbl, customer) AS by_column
              FROM (SELECT 'big_spenders' AS tbl, * FROM orders) AS o
          big_only:
            type: sql
            sql: SELECT id FROM orders WHERE dynamic_table_check('big_spenders', customer)
        sinks:
          flagged_out: {{type: delta, from: flagged, path: "{flagged_path}"}}
          big_out: {{type: delta, from: big_only, path: "{big_path}"}}
    """)
    flow = run.plan.describe()["flows"][0]
    assert flow["transforms"].index("big_spenders") < flow["transforms"].index("flagged")
    assert [e.epoch for e in runner.of_type(ev.EpochFlushed)] == [0, 1, 2]

    expected = {r["id"]: r for r in orders()}
    rows = read_delta(flagged_path)
    assert len(rows) == ROWS
    for row in rows:
        big = expected[row["id"]]["amount"] > THRESHOLD
        # the row's own value was added by this epoch's batch before the check ran
        assert row["is_big"] is big, row
        assert row["any_big"] is big, row
        assert row["late_known"] is (row["id"] >= PER_EPOCH), row  # added in epoch 1, kept after
        assert row["null_value"] is None and row["null_list"] is None and row["empty_list"] is False
        assert row["by_column"] is big, row  # the table named by a constant column
    assert sorted(r["id"] for r in read_delta(big_path)) == sorted(
        i for i, r in expected.items() if r["amount"] > THRESHOLD)
    backend = run.plan.nodes["big_spenders"].backend  # type: ignore[attr-defined]
    assert len(backend.members(None)) == sum(1 for r in expected.values() if r["amount"] > THRESHOLD)


def test_sql_selecting_several_columns_is_reported_at_analysis(runner, tmp_path):
    with pytest.raises(StreamlingError, match="select exactly one column"):
        runner.run(f"""
            sources:
              orders: {{type: generate, rows: 10}}
            transforms:
              seen:
                type: dynamic_table
                backend_type: InMemory
                backend_entity_name: seen
                sql: SELECT * FROM orders
              checked:
                type: sql
                sql: SELECT id FROM orders WHERE dynamic_table_check('seen', customer)
            sinks:
              out: {{type: delta, from: checked, path: "{tmp_path / 'out'}"}}
        """)
