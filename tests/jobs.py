"""Helpers for tests that drive ``streamling bundle`` as a user does (importable as ``jobs``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]


def bundle(root: Path, env: Mapping[str, str], *args: str, timeout: float = 180,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``streamling bundle ARGS`` in ``root`` with exactly ``env`` (and ``stdin`` as its input)."""
    return subprocess.run([sys.executable, "-m", "streamling.cli", "bundle", *args], cwd=root, env=dict(env),
                          capture_output=True, text=True, timeout=timeout, input=stdin)


def runs(root: Path, env: Mapping[str, str], *args: str) -> list[dict[str, Any]]:
    """Runs oldest first, each with its attempts (``bundle runs -o json``)."""
    proc = bundle(root, env, "runs", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    return list(reversed(json.loads(proc.stdout)))


def attempts(root: Path, env: Mapping[str, str], *args: str) -> list[dict[str, Any]]:
    return [a for run in runs(root, env, *args) for a in run["attempts"]]


def wait_for(check: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``check`` until it gives a true value. A check that costs time (a ``streamling bundle``
    command starts a Python process) waits twice that between tries, so polling never takes the
    cores the drivers it waits for need."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = time.monotonic()
        value = check()
        if value:
            return value
        time.sleep(max(0.3, 2 * (time.monotonic() - started)))
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


ORDER_SCHEMA = {"type": "record", "name": "Order", "namespace": "shop", "doc": '{"primaryKeys":["id"]}',
                "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "string"},
                           {"name": "amount", "type": "double"}, {"name": "status", "type": "string"}]}
#: The notebook's own test data: (dbz.op, id, customer, amount, status).
NOTEBOOK_EVENTS = [("c", 1, "ada", 120.0, "paid"), ("c", 2, "bob", 15.5, "paid"), ("c", 3, "cyd", 310.0, "test"),
                   ("c", 4, "dee", 99.9, "paid"), ("u", 1, "ada", 125.0, "paid"), ("d", 4, "dee", 99.9, "paid"),
                   ("c", 5, "eve", 42.0, "paid")]


def produce_orders(bootstrap: str, registry_url: str, topic: str, events: list[tuple[str, int, str, float, str]],
                   admin: Any = None) -> None:
    """Avro orders with ``dbz.op`` headers, as kafka_to_postgres.ipynb's test-data cell writes them."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    admin = admin or AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    serialize = AvroSerializer(SchemaRegistryClient({"url": registry_url}), json.dumps(ORDER_SCHEMA))
    producer = Producer({"bootstrap.servers": bootstrap})
    for op, id_, customer, amount, status in events:
        value = serialize({"id": id_, "customer": customer, "amount": amount, "status": status},
                          SerializationContext(topic, MessageField.VALUE))
        producer.produce(topic, key=str(id_), value=value, headers=[("dbz.op", op.encode())])
    assert producer.flush(30) == 0


def ready_standby(workspace: Path, deployment: int) -> int | None:
    """The pid of the warm standby driver that is ready for ``deployment`` under the bundle root
    ``workspace``, if there is one."""
    for log in (workspace / "logs" / "standby").glob("*.log"):
        ready = log.with_suffix(".go.ready")
        if not log.name.startswith("_pool.") and ready.exists() and f"(deployment {deployment}) ready in" in \
                log.read_text():
            return int(ready.read_text())
    return None


def ready_pooled(workspace: Path, deployment: int) -> int | None:
    """The pid of a pooled warm driver (``job_runner.warm_drivers``) that is ready for ``deployment``
    under the bundle root ``workspace``, if there is one."""
    for log in (workspace / "logs" / "standby").glob("_pool.*.log"):
        ready = log.with_suffix(".go.ready")
        if ready.exists() and f"(deployment {deployment}) ready in" in log.read_text():
            return int(ready.read_text())
    return None


def run_store(postgres_service: Mapping[str, str], unique_name: str) -> dict[str, str]:
    """A target's ``job_runner.postgres`` settings on the test Postgres, in a schema of the test's own
    (``runs_<unique_name>``); the password stays in the environment, as users keep it."""
    return {"host": "127.0.0.1", "port": postgres_service["STREAMLING__POSTGRES_SINK__PORT"],
            "user": postgres_service["STREAMLING__POSTGRES_SINK__USER"],
            "db": postgres_service["STREAMLING__POSTGRES_SINK__DB"], "sslmode": "disable",
            "schema_name": f"runs_{unique_name}"}


def stop_lease_holder(pg: Any, unique_name: str) -> None:
    """SIGTERM the runner holding the run store's lease (on this machine) and wait until it is gone."""
    import os
    import signal

    [(pid,)] = pg.execute(f"SELECT pid FROM runs_{unique_name}.runner_lease").fetchall()
    os.kill(int(pid), signal.SIGTERM)

    def gone() -> bool:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        return False
    wait_for(gone, 30, "the runner to stop")

