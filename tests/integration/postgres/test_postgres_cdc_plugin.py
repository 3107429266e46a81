"""The community-style ``postgres_cdc_source`` plugin on a real server: the initial copy, then inserts,
updates and deletes from logical replication, across a restart, into a Postgres upsert sink that ends
equal to the source table; the slot advances only as epochs are finalized."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Runner

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _rows(pg: Any, table: str) -> list[tuple[Any, ...]]:
    return pg.execute(f"SELECT id, name, amount::text, paid, updated_at FROM {table} ORDER BY id").fetchall()


def test_copy_then_changes_across_a_restart_end_equal(spark: Any, tmp_path: Path, pg: Any, pg_environ: dict[str, str],
                                                      unique_name: str) -> None:
    source = f"public.{unique_name}_src"
    pg.execute(f"CREATE TABLE {source} (id bigint PRIMARY KEY, name text, amount numeric(10, 2), paid boolean, "
               "updated_at timestamptz)")
    pg.execute(f"INSERT INTO {source} SELECT i, 'name-' || i, i * 1.25, i % 2 = 0, "
               "timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second' FROM generate_series(1, 2500) i")
    env = pg_environ
    pipeline = textwrap.dedent(f"""
        sources:
          cdc:
            type: postgres_cdc_source
            host: {env['STREAMLING__POSTGRES_SINK__HOST']}
            port: {env['STREAMLING__POSTGRES_SINK__PORT']}
            database: {env['STREAMLING__POSTGRES_SINK__DB']}
            username: {env['STREAMLING__POSTGRES_SINK__USER']}
            password: {env['STREAMLING__POSTGRES_SINK__PASS']}
            sslmode: disable
            table: {source}
            slot_name: {unique_name}
            publication_name: {unique_name}
            batch_size: 1000
        transforms:
          copy:
            type: sql
            primary_key: id
            sql: SELECT id, name, amount, paid, updated_at, _gs_op FROM cdc
        sinks:
          out: {{type: postgres, from: copy, schema: {unique_name}, table: target}}
    """)
    target = f'"{unique_name}".target'
    runner = Runner(spark, tmp_path, environ=pg_environ)

    def equal(_: Runner) -> bool:
        try:
            return _rows(pg, target) == _rows(pg, source)
        except Exception:  # noqa: BLE001 - the sink has not created the table yet
            return False

    try:
        runner.run_until(pipeline, equal, timeout_secs=120, checkpoint_interval_sec=0.5)
        slot = f"SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{unique_name}'"
        after_copy = pg.execute(slot).fetchone()[0]

        # While stopped: changes in several transactions, some touching the same key twice.
        pg.execute(f"INSERT INTO {source} SELECT i, 'late-' || i, i, true, now() FROM generate_series(2501, 2800) i")
        pg.execute(f"UPDATE {source} SET amount = amount + 1, name = name || '!' WHERE id % 25 = 0")
        pg.execute(f"DELETE FROM {source} WHERE id % 40 = 0")
        pg.execute(f"UPDATE {source} SET paid = NOT paid WHERE id BETWEEN 2790 AND 2800")
        with pg.transaction():
            pg.execute(f"INSERT INTO {source} VALUES (9001, 'in-tx', 1, false, now())")
            pg.execute(f"UPDATE {source} SET name = 'in-tx-2' WHERE id = 9001")
        # Resumed from its checkpoint: the copy is not read again, the changes are; once their epoch is
        # finalized the slot moves past them (the source's finalize hook), so Postgres may recycle that WAL.
        moved = f"SELECT confirmed_flush_lsn > '{after_copy}'::pg_lsn FROM pg_replication_slots " \
                f"WHERE slot_name = '{unique_name}'"
        runner.run_until(pipeline, lambda r: equal(r) and pg.execute(moved).fetchone()[0], timeout_secs=120,
                         checkpoint_interval_sec=0.5)
        assert len(_rows(pg, target)) == 2800 - 70 + 1
        assert pg.execute(f"SELECT name FROM {target} WHERE id = 9001").fetchone()[0] == "in-tx-2"
    finally:
        # A planner's last peek may still hold the slot for a moment after the run stopped.
        for _ in range(50):
            if not pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
                              (unique_name,)).fetchone():
                break
            time.sleep(0.2)
        pg.execute(f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                   f"WHERE slot_name = '{unique_name}'")
        pg.execute(f'DROP PUBLICATION IF EXISTS "{unique_name}"')
