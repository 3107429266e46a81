"""What a second run reads follows the state backend (Streamling's ``postgres_sink::test_update_where``),
through the command itself: each run is a new process, as a user's is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def _run(pipeline: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "streamling.cli", str(pipeline)], cwd=pipeline.parent, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_in_memory_state_reads_every_record_again_on_the_next_run(
        tmp_path: Path, unique_topic: str, unique_name: str, kafka_admin: Any, kafka_bootstrap: str,
        kafka_environ: dict[str, str], pg_environ: dict[str, str], pg: Any) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    kafka_admin.create_topics([NewTopic(unique_topic, num_partitions=1)])[unique_topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(1, 7):
        producer.produce(unique_topic, key=str(i), value=json.dumps({"id": i, "version": 1, "name": f"n{i}"}))
    assert producer.flush(30) == 0

    def pipeline(update_where: str) -> Path:
        path = tmp_path / "p.yaml"
        path.write_text(f"""
sources:
  events:
    type: kafka
    topic: {unique_topic}
    data_format: json
    starting_offsets: earliest
    primary_key: id
    schema: {{id: int64, version: int64, name: string}}
sinks:
  db:
    type: postgres
    from: events
    schema: {unique_name}
    table: items
    primary_key: id
    update_where: {{version: "{update_where}"}}
""")
        return path

    env = {k: v for k, v in {**kafka_environ, **pg_environ}.items()
           if not k.startswith("STREAMLING__") or k.startswith(("STREAMLING__KAFKA", "STREAMLING__POSTGRES_SINK"))}
    env.update(STREAMLING_CACHE_DIR=os.environ.get("STREAMLING_CACHE_DIR", str(ROOT / ".cache")),
               STREAMLING__APPLICATION_ID=unique_name, STREAMLING__NUM_RECORDS_BEFORE_STOP="6",
               STREAMLING__CHECKPOINT_INTERVAL_SEC="0.5")
    first = _run(pipeline(">"), env)
    assert "flow 'events': starting fresh" in first.stderr and "InMemory keeps no position" in first.stderr
    table = f'"{unique_name}".items'
    assert pg.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 6
    pg.execute(f"UPDATE {table} SET name = 'stale'")

    # The same application, update_where loosened: with InMemory the run reads all six again (it
    # would wait for them forever if it resumed) and the replayed versions now pass the condition.
    second = _run(pipeline(">="), env)
    assert "flow 'events': starting fresh" in second.stderr, second.stderr[-2000:]
    assert pg.execute(f"SELECT id, name FROM {table} ORDER BY id").fetchall() == [(i, f"n{i}") for i in range(1, 7)]
    # nothing of the first process is left under state_dir
    assert not [p for p in (tmp_path / ".streamling").rglob("process-*")]
