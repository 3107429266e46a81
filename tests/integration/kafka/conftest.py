"""Kafka and the schema registry for integration tests: ``fixtures/services/up kafka registry``.

If ``STREAMLING_TEST_KAFKA_BOOTSTRAP`` and ``STREAMLING_TEST_SCHEMA_REGISTRY_URL`` are already set
(``eval "$(fixtures/services/up kafka registry)"``, as ``fixtures/dev test`` does), those services are
used; otherwise the fixture script is run once per session and its exports parsed. The exports are
not written into ``os.environ``; tests get them through the fixtures below.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from services import start_services

_PREFIXES = ("STREAMLING__KAFKA_SOURCE__", "STREAMLING__KAFKA_SINK__", "STREAMLING_TEST_KAFKA_",
             "STREAMLING_TEST_SCHEMA_REGISTRY_")


@pytest.fixture(scope="session")
def kafka_service() -> dict[str, str]:
    """The services' exports: broker and schema-registry settings for sources and sinks."""
    if os.environ.get("STREAMLING_TEST_KAFKA_BOOTSTRAP") and os.environ.get("STREAMLING_TEST_SCHEMA_REGISTRY_URL"):
        return {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    exports = start_services("kafka", "registry")
    assert "STREAMLING_TEST_KAFKA_BOOTSTRAP" in exports and "STREAMLING_TEST_SCHEMA_REGISTRY_URL" in exports, exports
    return exports


@pytest.fixture(scope="session")
def kafka_environ(kafka_service: Mapping[str, str]) -> dict[str, str]:
    """An environment for ``load_settings(environ=…)``: this process's plus the services' exports."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    return {**base, **kafka_service}


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_service: Mapping[str, str]) -> str:
    return kafka_service["STREAMLING_TEST_KAFKA_BOOTSTRAP"]


@pytest.fixture(scope="session")
def schema_registry_url(kafka_service: Mapping[str, str]) -> str:
    return kafka_service["STREAMLING_TEST_SCHEMA_REGISTRY_URL"]


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_bootstrap})


@pytest.fixture()
def unique_topic(request: pytest.FixtureRequest, kafka_admin: Any) -> Iterator[str]:
    """A topic name no other test (or earlier run) uses; the topic is deleted afterwards if created."""
    stem = "".join(ch if ch.isalnum() else "_" for ch in request.node.name.lower())[:30].strip("_")
    name = f"t_{stem}_{uuid.uuid4().hex[:8]}"
    yield name
    for future in kafka_admin.delete_topics([name], operation_timeout=10).values():
        try:
            future.result(timeout=15)
        except Exception:  # never created, or already gone
            pass
