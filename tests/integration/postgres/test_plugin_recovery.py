"""Streamling's README plugin pipeline (random_source → SQL → Postgres) killed with SIGKILL mid-run and
started again: it resumes from the plugin's checkpointed offset and the table ends exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from basic_plugin import RandomSource
from harness import kill_at_line

from streamling.plugins.testing import SourceRunner

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]
ROWS = 20_000


def test_plugin_source_killed_and_restarted_loses_nothing(tmp_path: Path, pg_environ: dict[str, str], pg: Any,
                                                         unique_name: str) -> None:
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
sources:
  random_source:
    type: basic_plugin.random_source
    options:
      max_rows: "{ROWS}"
      record_batch_size: "2000"
transforms:
  filtered:
    type: sql
    primary_key: alphanumeric_field
    sql: SELECT * FROM random_source WHERE num_field > 100
sinks:
  db: {{type: postgres, from: filtered, schema: {unique_name}, table: random_rows}}
""")
    env = {**pg_environ, "STREAMLING_CACHE_DIR": str(ROOT / ".cache"), "STREAMLING__APPLICATION_ID": unique_name,
           "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Postgres", "STREAMLING__STATE_DIR": str(tmp_path / "state"),
           "STREAMLING__CHECKPOINT_INTERVAL_SEC": "0"}
    cmd = [sys.executable, "-m", "streamling.cli", str(pipeline)]
    # sinks wrote epoch 3; Spark may not have committed it yet
    kill_at_line(cmd, tmp_path, env, "epoch 3 flushed")
    partial = pg.execute(f'SELECT count(*) FROM "{unique_name}".random_rows').fetchone()[0]
    assert 0 < partial

    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    flushed = [line for line in rerun.stderr.splitlines() if " flushed " in line]
    assert 0 < len(flushed) < ROWS // 2000, "the rerun must resume, not start over: " + "\n".join(flushed)

    expected = SourceRunner(RandomSource, {"max_rows": ROWS, "record_batch_size": 2000})
    expected.run()
    table = expected.table()
    want = table.filter(pc.greater(table.column("num_field"), 100))
    rows = pg.execute(f'SELECT alphanumeric_field, num_field, float_field, bool_field FROM "{unique_name}".random_rows '
                      "ORDER BY alphanumeric_field").fetchall()
    assert len(rows) == want.num_rows
    assert rows == sorted(zip(want.column("alphanumeric_field").to_pylist(), want.column("num_field").to_pylist(),
                              want.column("float_field").to_pylist(), want.column("bool_field").to_pylist(),
                              strict=True))
    state = pg.execute("SELECT data FROM streamling.state WHERE namespace = %s AND key = %s",
                       (unique_name, "basic_plugin.random_source:random_source")).fetchone()
    assert state is not None and state[0]["offset"] == {"v": ROWS}
