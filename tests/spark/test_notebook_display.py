"""``%streamling display`` on a real run: a transform's sampled rows and a Postgres sink's table."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamling.notebook.display import display_node
from streamling.notebook.session import NotebookPipeline

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


@pytest.fixture
def postgres(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test server's settings in the environment the notebook's settings read; its DSN."""
    if os.environ.get("STREAMLING_TEST_POSTGRES_DSN"):
        exports = dict(os.environ)
    else:
        from services import start_services

        exports = start_services("postgres")
    for name, value in exports.items():
        if name.startswith(("STREAMLING__POSTGRES_SINK__", "STREAMLING_TEST_POSTGRES_")):
            monkeypatch.setenv(name, value)
    yield exports["STREAMLING_TEST_POSTGRES_DSN"]


def _until(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the display did not update in time"
        time.sleep(0.1)


def test_display_shows_a_transforms_rows_and_what_the_postgres_sink_wrote(spark: Any, tmp_path: Path,
                                                                          postgres: str) -> None:
    import psycopg

    table = f"display_{uuid.uuid4().hex[:8]}"
    nb = NotebookPipeline(application_id=f"nb_{table}", cwd=tmp_path, spark=spark)
    nb.define("source", "orders", {"type": "generate", "rows": 3000, "rows_per_batch": 1000, "primary_key": "id"})
    nb.define("transform", "big", {"type": "sql", "sql": "SELECT id, customer, amount FROM orders WHERE amount > 500"})
    nb.define("sink", "out", {"type": "postgres", "from": ["big"], "schema": "public", "table": table,
                              "primary_key": "id"})
    rows_view = display_node(nb, "big", rows=150)  # before the run: they follow it when it starts
    table_view = display_node(nb, "out", rows=50)
    assert rows_view.status == table_view.status == "waiting"
    try:
        run = nb.start(sample_rows=20)
        assert run.wait(300) and run.error is None, run.error
        _until(lambda: rows_view.status == table_view.status == "stopped")
        rows_view.flush()
        table_view.flush()

        # The transform: its newest sampled epoch's rows, as many as the display asked for (not the run's 20).
        assert rows_view.columns[:3] == ["id", "customer", "amount"]
        assert rows_view.types[:3] == ["int64", "string", "double"]
        assert len(rows_view.rows) == 150 and all(r[2] > 500 for r in rows_view.rows)
        first_id = rows_view.epoch * 1000  # generate: epoch N holds ids N*1000 … N*1000+999
        assert all(first_id <= r[0] < first_id + 1000 for r in rows_view.rows)

        # The sink: rows queried from its table, highest key first.
        with psycopg.connect(postgres) as conn:
            stored = [r[0] for r in conn.execute(f'SELECT id FROM public."{table}" ORDER BY id DESC LIMIT 50')]
        assert [r[0] for r in table_view.rows] == stored and len(stored) == 50
        assert table_view.columns == ["id", "customer", "amount"] and table_view.types[0] == "bigint"
        assert f'rows of table "public"."{table}"' in table_view.caption and table_view.epoch == 2
        assert table_view.error == ""
        assert "50 rows · epoch 2" in table_view.summary_text()

        # A display made after the run shows its last rows: the last sample, the table queried again.
        late_rows, late_table = display_node(nb, "big", rows=10), display_node(nb, "out", rows=5)
        _until(lambda: late_table.status == "stopped" and late_table.rows != [])
        late_rows.flush()
        late_table.flush()
        assert late_rows.status == "stopped" and late_rows.rows == rows_view.rows[:10]
        assert rows_view.status == "replaced by a newer display of 'big'"
        assert [r[0] for r in late_table.rows] == stored[:5]
    finally:
        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS public."{table}"')
