"""Kill the process mid-run (SIGKILL, no chance to clean up), rerun from the same checkpoint:
the Postgres table ends exactly as if nothing had happened, and offsets reach the state backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import kill_at_line

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[3]
ROWS = 30_000  # cdc profile: 3 events per key → 10,000 keys


def _cmd(pipeline: Path) -> list[str]:
    return [sys.executable, "-m", "streamling.cli", str(pipeline)]


def test_sigkill_mid_run_then_rerun_loses_nothing(tmp_path: Path, pg_environ: dict[str, str], pg: Any,
                                                  unique_name: str) -> None:
    schema = unique_name
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(f"""
sources:
  changes: {{type: generate, profile: cdc, rows: {ROWS}, rows_per_batch: 2000, primary_key: id}}
transforms:
  latest:
    type: sql
    sql: SELECT id, version, customer, amount * 2 AS doubled FROM changes WHERE id >= 0
sinks:
  db: {{type: postgres, from: latest, schema: {schema}, table: accounts}}
""")
    env = {**pg_environ, "STREAMLING_CACHE_DIR": str(ROOT / ".cache"),
           "STREAMLING__APPLICATION_ID": unique_name, "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Postgres",
           "STREAMLING__STATE_DIR": str(tmp_path / "state")}
    # sinks wrote epoch 3; Spark may not have committed it yet
    kill_at_line(_cmd(pipeline), tmp_path, env, "epoch 3 flushed")
    partial = pg.execute(f'SELECT count(*) FROM "{schema}".accounts').fetchone()[0]
    assert 0 < partial < ROWS // 3

    rerun = subprocess.run(_cmd(pipeline), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    replayed = [json.loads(line.split("flushed ", 1)[1].split(" in ")[0]) for line in rerun.stderr.splitlines()
                if " flushed " in line]
    assert replayed, rerun.stderr[-2000:]

    rows = pg.execute(f'SELECT id, version, doubled FROM "{schema}".accounts ORDER BY id').fetchall()
    keys = ROWS // 3
    assert [r[0] for r in rows] == [k for k in range(keys) if k % 5 != 0]  # every 5th key ends deleted
    assert {r[1] for r in rows} == {3}  # the last version of every surviving key
    state = pg.execute("SELECT data FROM streamling.state WHERE namespace = %s AND key = %s",
                       (unique_name, "generate:changes")).fetchone()
    assert state is not None and state[0]["offset"] == {"row": ROWS}
