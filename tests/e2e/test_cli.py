"""The ``streamling`` command as a user runs it: a real process, real Spark, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamling.sources.generate import generate_batch

pytestmark = [pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    env.setdefault("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))
    env.update(extra)
    return env


def streamling(*args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamling.cli", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def test_readme_main_command_prints_rows_and_leaves_the_delta_table(tmp_path: Path, spark: Any) -> None:
    table = generate_batch("orders", 0, 1000, 0, 0)
    expected = [i for i, a in zip(table.column("id").to_pylist(), table.column("amount").to_pylist(), strict=True)
                if a > 990]
    proc = subprocess.run([str(ROOT / "fixtures" / "dev"), "run", str(ROOT / "pipeline.yaml")], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [int(line.split(" -> ")[0]) for line in lines] == list(range(1, len(expected) + 1))
    assert all(" -> (sample_every=1) [Insert] {" in line for line in lines)
    rows = [json.loads(line.split("] ", 1)[1]) for line in lines]
    assert [r["id"] for r in rows] == expected
    assert rows[0]["total"] == pytest.approx(rows[0]["amount"] * rows[0]["quantity"])
    assert "Traceback" not in proc.stderr and "WARN" not in proc.stdout
    lake = spark.read.format("delta").load(str(tmp_path / "output" / "large_orders"))
    assert sorted(r.id for r in lake.select("id").collect()) == sorted(expected)

    assert "flow 'orders': starting fresh" in proc.stderr and "InMemory keeps no position" in proc.stderr
    assert not list((tmp_path / ".streamling").rglob("process-*"))  # the process's checkpoint went with it

    # A backend that keeps positions: this run starts over too (the InMemory run left nothing to
    # resume) and upserts the same rows. (A run that resumes it: tests/integration/storage/test_s3a.py.)
    sqlite = {"STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Sqlite"}
    again = streamling(str(ROOT / "pipeline.yaml"), cwd=tmp_path, **sqlite)
    assert again.returncode == 0 and again.stdout == proc.stdout, again.stderr[-3000:]
    assert "state_backend Sqlite resumes it on the next run" in again.stderr, again.stderr[-3000:]
    lake = spark.read.format("delta").load(str(tmp_path / "output" / "large_orders"))
    assert sorted(r.id for r in lake.select("id").collect()) == sorted(expected)


def test_validate_prints_one_json_object(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("sources:\n  s: {type: generate, rows: 5, primary_key: id}\n"
                    "sinks:\n  out: {type: blackhole, from: s}\n")
    proc = streamling(str(good), "--validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"success": True, "is_valid": True, "errors": [], "warnings": []}

    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  s: {type: generate, rows: 5, primary_key: nope}\n"
                   "sinks:\n  out: {type: prnt, from: s}\n")
    proc = streamling(str(bad), "--validate", cwd=tmp_path)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["success"] is True and result["is_valid"] is False
    assert result["errors"] == ["sink 'out': unknown sink type 'prnt' (did you mean 'print'?); available sink "
                                "types: blackhole, clickhouse, delta, kafka, postgres, postgres_aggregate, print, "
                                "webhook [sinks.out.type (line 4)]"]

    keyless = tmp_path / "keyless.yaml"
    keyless.write_text("sources:\n  s: {type: generate, rows: 5, primary_key: nope}\n"
                       "sinks:\n  out: {type: blackhole, from: s}\n")
    result = json.loads(streamling(str(keyless), "--validate", cwd=tmp_path).stdout)
    assert result["errors"] == [
        "Primary key validation failed for node 's': columns [\"nope\"] not found in schema. Available columns: "
        "[\"id\", \"customer\", \"country\", \"amount\", \"quantity\", \"created_at\", \"_gs_op\"]"]

    # an event-time column that cannot be one: valid (the rows would flow), and said as the run says it
    untimed = tmp_path / "untimed.yaml"
    untimed.write_text("sources:\n  s: {type: generate, rows: 5, primary_key: id,\n"
                       "      telemetry: {event_time: {column: customer}}}\n"
                       "sinks:\n  out: {type: blackhole, from: s}\n")
    result = json.loads(streamling(str(untimed), "--validate", cwd=tmp_path).stdout)
    assert result == {"success": True, "is_valid": True, "errors": [], "warnings": [
        "generate source 's': event-time instrumentation skipped: column 'customer' is string, not a timestamp or "
        "a number (telemetry.event_time.column)"]}


def test_a_failing_node_is_one_error_line_naming_it(tmp_path: Path) -> None:
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("""
sources:
  s: {type: generate, rows: 20, primary_key: id}
transforms:
  js:
    type: script
    from: s
    script: 'function process(input) { if (input.id === 3) throw new Error("boom"); return input; }'
sinks:
  out: {type: print, from: js}
""")
    proc = streamling(str(pipeline), cwd=tmp_path)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert [e.split(" ERROR ", 1)[1] for e in errors] == [
        "streamling: script transform 'js': row 3 of the batch (id=3): Error: boom (script line 1) — fix the "
        "script or the row"]
    # no py4j tracebacks, no cause chain through the sink that collected the rows, no JVM start-up chatter
    for noise in ("Traceback", "Caused by", "print sink", "Using incubator modules", "Setting default log level"):
        assert noise not in proc.stderr, noise
    # start, admin API, "starting fresh", stopping, the error
    assert len(proc.stderr.strip().splitlines()) <= 5, proc.stderr


def test_missing_pipeline_file_is_a_clear_error(tmp_path: Path) -> None:
    proc = streamling(cwd=tmp_path, timeout=60)
    assert proc.returncode == 1
    assert "pipeline file pipeline.yaml does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sigterm_to_the_process_group_finishes_the_epoch_and_exits_zero(tmp_path: Path) -> None:
    """As ``timeout`` and shells do, the signal goes to the whole group (``setsid`` + ``kill -TERM --
    -PGID``), and as systemd does by default to the JVM as well: the driver JVM, in a session of its
    own and started with SIGTERM ignored, keeps running while the epoch drains."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("sources:\n  s: {type: generate, rows_per_second: 2000, rows_per_batch: 1000}\n"
                        f"sinks:\n  lake: {{type: delta, from: s, path: \"{tmp_path / 'lake'}\"}}\n")
    from otlp_receiver import free_port

    admin = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamling.cli", str(pipeline)], cwd=tmp_path,
                            env=_env(STREAMLING__CHECKPOINT_INTERVAL_SEC="0.5", STREAMLING__ADMIN_API_PORT=str(admin)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 240
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if "finalized" in line:
            break
    assert any("finalized" in line for line in seen), "".join(seen[-30:])
    # A long-running job: Spark's UI (with its Structured Streaming tab) and the admin API are up.
    [ui] = [line.rsplit(" on ", 1)[1].strip() for line in seen if "Spark UI (Structured Streaming tab) on" in line]
    assert httpx.get(f"{ui}/StreamingQuery/", timeout=10, follow_redirects=True).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{admin}/health/ready", timeout=10).json()["status"] == "running"
    # systemd's default stop (KillMode=control-group) signals every process of the unit: the JVM too
    jvms = subprocess.run(["pgrep", "-P", str(proc.pid), "java"], capture_output=True, text=True).stdout.split()
    assert jvms, "the driver JVM is not a child of the command"
    os.killpg(proc.pid, signal.SIGTERM)
    for jvm in jvms:
        os.kill(int(jvm), signal.SIGTERM)
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 0, rest[-3000:]
    assert "received SIGTERM" in rest
    assert "pipeline finished" in rest
    assert "Traceback" not in rest and "Py4JJavaError" not in rest, rest[-3000:]


def test_a_stop_while_the_driver_starts_exits_zero_at_once(tmp_path: Path) -> None:
    """SIGTERM after the run began but before Spark is up: no epoch ran, none is owed; no epoch is
    started for it, and the exit is 0 (not the shutdown budget's 3)."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("sources:\n  s: {type: generate, rows_per_second: 2000, rows_per_batch: 1000}\n"
                        f"sinks:\n  lake: {{type: delta, from: s, path: \"{tmp_path / 'lake'}\"}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "streamling.cli", str(pipeline)], cwd=tmp_path,
                            env=_env(STREAMLING__ADMIN_API_PORT="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stderr is not None
    seen = []
    while not any("starting pipeline" in line for line in seen):
        line = proc.stderr.readline()
        assert line, "".join(seen)
        seen.append(line)
    os.killpg(proc.pid, signal.SIGTERM)  # the JVM is still being launched
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 0, rest[-3000:]
    assert "before the first epoch: nothing to finish" in rest or "while the pipeline was still starting" in rest, rest
    assert "finalized" not in rest and "Traceback" not in rest
    assert not (tmp_path / "lake" / "_delta_log").exists()
