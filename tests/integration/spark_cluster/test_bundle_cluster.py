"""The repository's ``bundle.yml`` on its ``cluster`` target: the Kafka → Postgres notebook runs as a
continuous production job whose driver (client mode, supervised by the job runner) is SIGKILLed
mid-stream; the runner restarts it from its checkpoint and the table ends exact."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import NOTEBOOK_EVENTS, ROOT, attempts, bundle, produce_orders, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def env(tmp_path: Path, pg_environ: dict[str, str], kafka_service: dict[str, str], spark_cluster: dict[str, str],
        unique_topic: str, unique_name: str) -> Iterator[dict[str, str]]:
    environ = {k: v for k, v in pg_environ.items() if not k.startswith(("BUNDLE_VAR_", "STREAMLING__KAFKA"))}
    environ.update(kafka_service)
    environ.update(BUNDLE_VAR_root_path=str(tmp_path / "root"),
                   BUNDLE_VAR_spark_master=spark_cluster["STREAMLING_TEST_SPARK_MASTER"],
                   BUNDLE_VAR_orders_topic=unique_topic, BUNDLE_VAR_orders_table=unique_name)
    yield environ
    bundle(ROOT, environ, "destroy", "--auto-approve")


def _count(pg: Any, table: str) -> int:
    try:
        return int(pg.execute(f'SELECT count(*) FROM notebook."{table}"').fetchone()[0])
    except Exception:  # not created yet
        return 0


def test_repo_bundle_on_the_cluster_restarts_a_killed_driver_and_loses_nothing(
        env: dict[str, str], pg: Any, unique_topic: str, unique_name: str, kafka_service: dict[str, str]) -> None:
    bootstrap, registry = (kafka_service["STREAMLING_TEST_KAFKA_BOOTSTRAP"],
                           kafka_service["STREAMLING_TEST_SCHEMA_REGISTRY_URL"])
    produce_orders(bootstrap, registry, unique_topic, NOTEBOOK_EVENTS)
    started = time.monotonic()
    # Production mode refuses uncommitted changes; a test run's working copy may have some.
    deployed = bundle(ROOT, env, "deploy", "-t", "cluster", "--force")
    assert deployed.returncode == 0, deployed.stderr
    wait_for(lambda: _count(pg, unique_name) == 3, 300, "the notebook's three rows (production starts the job)")
    print(f"cluster target: deploy → rows in Postgres {time.monotonic() - started:.1f}s")

    # More orders, and the driver dies while it works through them.
    more = [("c", i, f"c{i}", 100.0 + i, "paid") for i in range(100, 2100)]
    produce_orders(bootstrap, registry, unique_topic, more[:1000])
    wait_for(lambda: _count(pg, unique_name) > 3, 120, "the second batch to start arriving")
    [running] = [a for a in attempts(ROOT, env, "-t", "cluster", "kafka_to_postgres") if a["state"] == "running"]
    os.killpg(running["pid"], signal.SIGKILL)
    killed = time.monotonic()
    produce_orders(bootstrap, registry, unique_topic, more[1000:])
    wait_for(lambda: _count(pg, unique_name) == 3 + len(more), 300, "every order after the restart")
    print(f"cluster target: driver killed → all rows {time.monotonic() - killed:.1f}s")
    rows = pg.execute(f'SELECT id, amount FROM notebook."{unique_name}" ORDER BY id').fetchall()
    assert rows == [(1, 125.0), (2, 15.5), (5, 42.0)] + [(i, 100.0 + i) for i in range(100, 2100)]
    states = [a["state"] for a in attempts(ROOT, env, "-t", "cluster", "kafka_to_postgres")]
    assert states[0] == "failed" and states[-1] == "running", states
