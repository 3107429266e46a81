"""Checkpoints and a Delta table on an S3-compatible object store (``fixtures/services/up s3``:
SeaweedFS's S3 gateway, Hadoop's ``s3a://`` with ``hadoop-aws`` 3.5.0), through the CLI as a user
runs it; and the two mistakes users make first — a wrong secret, a bucket that does not exist — each
a terminal error that says what to fix and never shows the secret."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from services import delta_table_on_s3, s3a_conf

pytestmark = [pytest.mark.slow, pytest.mark.s3]

ROWS = 3_000


def _env(s3: dict[str, str], name: str, **over: str) -> dict[str, str]:
    """The CLI's settings: the s3a jars on the driver's class path (local mode), the store's endpoint
    and credentials as a user sets them (spark.conf), no retry storm against a refusing store."""
    conf = {"spark.driver.extraClassPath": s3["STREAMLING_TEST_S3A_JARS"].replace(",", ":"), **s3a_conf(s3), **over}
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    env.update({f"STREAMLING__SPARK__CONF__{k}": v for k, v in conf.items()})
    env.update(STREAMLING__SPARK__MASTER="local[2]", STREAMLING__APPLICATION_ID=name, STREAMLING__ADMIN_API_PORT="0")
    return env


def _run(tmp_path: Path, env: dict[str, str], lake: str, state: str) -> subprocess.CompletedProcess[str]:
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(textwrap.dedent(f"""
        sources:
          orders: {{type: generate, rows: {ROWS}, rows_per_batch: 1000, primary_key: id}}
        transforms:
          shaped: {{type: sql, sql: "SELECT id, customer, amount * quantity AS total FROM orders"}}
        sinks:
          lake: {{type: delta, from: shaped, path: "{lake}"}}
    """))
    return subprocess.run([str(Path(sys.executable).with_name("streamling")), str(pipeline)], cwd=tmp_path,
                          env={**env, "STREAMLING__STATE_DIR": state}, capture_output=True, text=True, timeout=400)


def test_checkpoints_and_a_delta_table_on_s3(tmp_path: Path, s3: dict[str, str], unique_name: str) -> None:
    base = f"s3a://{s3['STREAMLING_TEST_S3_BUCKET']}/tests/{unique_name}"
    # a backend that keeps positions, so the next run resumes the checkpoint on S3
    env = {**_env(s3, unique_name), "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Sqlite",
           "STREAMLING__STATE_BACKEND__SQLITE__DATABASE_PATH": str(tmp_path / "state.db")}
    first = _run(tmp_path, env, f"{base}/lake", f"{base}/state")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "pipeline finished" in first.stderr and "Traceback" not in first.stderr
    # Run again: the checkpoint on S3 says the source is drained, so nothing is written twice.
    again = _run(tmp_path, env, f"{base}/lake", f"{base}/state")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"flow 'orders': resuming the checkpoint at {base}/state/" in again.stderr, again.stderr[-3000:]
    assert "state_backend Sqlite" in again.stderr and " flushed " not in again.stderr, again.stderr[-3000:]
    # The table, as its Delta log on the store says (read without Spark): every id once.
    ids = delta_table_on_s3(s3, f"{base}/lake").column("id").to_pylist()
    assert (len(ids), len(set(ids)), min(ids), max(ids)) == (ROWS, ROWS, 0, ROWS - 1)


def test_a_wrong_secret_is_terminal_masked_and_names_the_key(tmp_path: Path, s3: dict[str, str],
                                                             unique_name: str) -> None:
    base = f"s3a://{s3['STREAMLING_TEST_S3_BUCKET']}/tests/{unique_name}"
    proc = _run(tmp_path, _env(s3, unique_name, **{"spark.hadoop.fs.s3a.secret.key": "wrong-secret-4711"}),
                f"{base}/lake", f"{base}/state")
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert errors and base in errors[-1] and "spark.hadoop.fs.s3a.secret.key" in proc.stderr, proc.stderr[-3000:]
    assert "wrong-secret-4711" not in proc.stderr and "Traceback" not in proc.stderr
    assert "gave up after" not in proc.stderr  # terminal: refused at once, not retried


def test_a_missing_bucket_is_terminal_and_says_so(tmp_path: Path, s3: dict[str, str], unique_name: str) -> None:
    base = f"s3a://no-such-bucket-{unique_name.replace('_', '-')[:30]}/tests"
    proc = _run(tmp_path, _env(s3, unique_name), f"{base}/lake", f"{base}/state")
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert errors and "bucket" in errors[-1].lower(), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "gave up after" not in proc.stderr
