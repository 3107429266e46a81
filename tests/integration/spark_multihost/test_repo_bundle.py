"""The repository's ``bundle.yml`` on its ``cluster`` target, on the cluster of two hosts: the Kafka →
Postgres notebook runs as a continuous production job (driver on host A in client mode, supervised by
the job runner, executors on both hosts reading Kafka and writing Postgres at host A's address). Host
B's worker is SIGKILLed mid-stream, then the driver: the runner restarts it from its checkpoint and
the table ends exact. The quickstart job deploys with its Delta table on HDFS (a relative path would be
refused on a cluster of several hosts)."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import NOTEBOOK_EVENTS, ROOT, attempts, bundle, produce_orders, ready_standby, wait_for
from services import start_services

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture
def env(tmp_path: Path, pg_environ: dict[str, str], kafka_service: dict[str, str], two_hosts: dict[str, str],
        unique_topic: str, unique_name: str) -> Iterator[dict[str, str]]:
    shared_pg = pg_environ.get("STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS")
    shared_kafka = kafka_service.get("STREAMLING_TEST_KAFKA_HOSTS_BOOTSTRAP")
    if not shared_pg or not shared_kafka:
        pytest.fail("postgres and kafka must listen on host A's end of the two-host pair: restart them as root "
                    "(`fixtures/services/down postgres kafka; fixtures/services/up postgres kafka`)")
    driver = two_hosts["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]
    environ = {k: v for k, v in pg_environ.items() if not k.startswith(("BUNDLE_VAR_", "STREAMLING__KAFKA"))}
    environ.update(kafka_service)
    environ.update({
        # Executors on either host reach the services at host A's address, and the driver there.
        "STREAMLING__KAFKA_SOURCE__BROKERS": shared_kafka, "STREAMLING__POSTGRES_SINK__HOST": shared_pg,
        "STREAMLING__SPARK__CONF__spark.driver.host": driver,
        "STREAMLING__SPARK__CONF__spark.hadoop.dfs.replication": "1",
        "BUNDLE_VAR_root_path": str(tmp_path / "root"),
        "BUNDLE_VAR_spark_master": two_hosts["STREAMLING_TEST_MULTIHOST_MASTER"],
        "BUNDLE_VAR_lake_path": f"{two_hosts['STREAMLING_TEST_HDFS_URL']}/tests/{unique_name}/large_orders",
        "BUNDLE_VAR_orders_topic": unique_topic, "BUNDLE_VAR_orders_table": unique_name})
    yield environ
    bundle(ROOT, environ, "destroy", "--auto-approve")


def _cores_by_application(two_hosts: dict[str, str]) -> list[int]:
    """The cores of each application the cluster's master runs now (its web UI's JSON), most first."""
    with urllib.request.urlopen(f"{two_hosts['STREAMLING_TEST_MULTIHOST_MASTER_UI']}/json/", timeout=10) as r:
        return sorted((int(app["cores"]) for app in json.loads(r.read())["activeapps"]), reverse=True)


def _count(pg: Any, table: str) -> int:
    try:
        return int(pg.execute(f'SELECT count(*) FROM notebook."{table}"').fetchone()[0])
    except Exception:  # not created yet
        return 0


def test_repo_bundle_on_two_hosts_loses_a_worker_and_the_driver_and_loses_nothing(
        env: dict[str, str], pg: Any, unique_topic: str, unique_name: str, kafka_service: dict[str, str],
        two_hosts: dict[str, str]) -> None:
    bootstrap, registry = (kafka_service["STREAMLING_TEST_KAFKA_BOOTSTRAP"],
                           kafka_service["STREAMLING_TEST_SCHEMA_REGISTRY_URL"])
    produce_orders(bootstrap, registry, unique_topic, NOTEBOOK_EVENTS)
    started = time.monotonic()
    # Production mode refuses uncommitted changes; a test run's working copy may have some.
    deployed = bundle(ROOT, env, "deploy", "-t", "cluster", "--force")
    assert deployed.returncode == 0, deployed.stderr
    # The runner keeps runs on one host's disk here: validate and deploy say what that means.
    assert "job_runner.store: postgres" in deployed.stderr
    wait_for(lambda: _count(pg, unique_name) == 3, 300, "the notebook's three rows (production starts the job)")
    print(f"two hosts: deploy → rows in Postgres {time.monotonic() - started:.1f}s")

    # More orders; host B's worker dies while they are read, then the driver.
    more = [("c", i, f"c{i}", 100.0 + i, "paid") for i in range(100, 2100)]
    produce_orders(bootstrap, registry, unique_topic, more[:1000])
    wait_for(lambda: _count(pg, unique_name) > 3, 120, "the second batch to start arriving")
    # A production target keeps a warm standby driver: on a cluster its application is registered
    # but holds no core while it waits (they are all the active driver's), and so does the target's
    # pooled warm driver.
    root = Path(env["BUNDLE_VAR_root_path"])
    standby = wait_for(lambda: ready_standby(root, 1), 240, "the warm standby (an application without executors)")
    cores = _cores_by_application(two_hosts)
    assert cores[0] > 0 and cores[1:] and set(cores[1:]) == {0}, cores
    worker_b = Path(two_hosts["STREAMLING_TEST_MULTIHOST_WORKER_B_PIDFILE"])
    try:
        os.kill(int(worker_b.read_text()), signal.SIGKILL)
        [running] = [a for a in attempts(ROOT, env, "-t", "cluster", "kafka_to_postgres") if a["state"] == "running"]
        os.killpg(running["pid"], signal.SIGKILL)
        killed = time.monotonic()
        produce_orders(bootstrap, registry, unique_topic, more[1000:])
        wait_for(lambda: _count(pg, unique_name) == 3 + len(more), 300, "every order after the restart")
        print(f"two hosts: worker b and driver killed → all rows {time.monotonic() - killed:.1f}s")
    finally:
        start_services("spark_multihost")  # host B's worker comes back
    rows = pg.execute(f'SELECT id, amount FROM notebook."{unique_name}" ORDER BY id').fetchall()
    assert rows == [(1, 125.0), (2, 15.5), (5, 42.0)] + [(i, 100.0 + i) for i in range(100, 2100)]
    history = attempts(ROOT, env, "-t", "cluster", "kafka_to_postgres")
    states = [a["state"] for a in history]
    assert states[0] == "failed" and states[-1] == "running", states
    # the standby took the attempt and claimed its executors then
    assert history[1]["pid"] == standby and "warm standby takes over" in Path(history[1]["log_path"]).read_text()
