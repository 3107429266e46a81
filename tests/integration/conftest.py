"""Postgres for integration tests (postgres, kafka, …): the server started by ``fixtures/services/up postgres``.

If ``STREAMLING_TEST_POSTGRES_DSN`` is already set (``eval "$(fixtures/services/up postgres)"``), that
server is used; otherwise the fixture script is run once per session and its exports parsed. The
exports are not written into ``os.environ`` (other tests read default settings from it); tests get
them through the ``pg_environ`` fixture instead.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from services import parse_exports, start_services

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / "fixtures" / "services" / "up"
_PREFIXES = ("STREAMLING__POSTGRES_SINK__", "STREAMLING__STATE_BACKEND__POSTGRES__", "STREAMLING_TEST_POSTGRES_")


@pytest.fixture(scope="session")
def postgres_service() -> dict[str, str]:
    """The service's exports (sink and state-backend settings, plus a libpq URL)."""
    if os.environ.get("STREAMLING_TEST_POSTGRES_DSN"):
        return {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    env = {**os.environ, "STREAMLING_CACHE_DIR": os.environ.get("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))}
    proc = subprocess.run([str(UP), "postgres"], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"fixtures/services/up postgres failed:\n{proc.stderr[-3000:]}")
    exports = parse_exports(proc.stdout)
    assert "STREAMLING_TEST_POSTGRES_DSN" in exports, proc.stdout
    return exports


@pytest.fixture(scope="session")
def pg_environ(postgres_service: Mapping[str, str]) -> dict[str, str]:
    """An environment for ``load_settings(environ=…)``: this process's plus the service's exports."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    return {**base, **postgres_service}


@pytest.fixture(scope="session")
def pg_dsn(postgres_service: Mapping[str, str]) -> str:
    return postgres_service["STREAMLING_TEST_POSTGRES_DSN"]


@pytest.fixture()
def pg(pg_dsn: str) -> Iterator[Any]:
    """An autocommit connection for arranging and checking tables."""
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # The role is named like the state backend's schema ("streamling"); once that schema exists
        # the default "$user", public path would put unqualified test tables there, not in public.
        conn.execute("SET search_path TO public")
        yield conn


@pytest.fixture()
def unique_name(request: pytest.FixtureRequest) -> str:
    """A table/namespace name no other test (or earlier run) uses."""
    stem = "".join(ch if ch.isalnum() else "_" for ch in request.node.name.lower())[:30].strip("_")
    return f"t_{stem}_{uuid.uuid4().hex[:8]}"


# --- Kafka and the schema registry (fixtures/services/up kafka registry) ----------------------------
# If STREAMLING_TEST_KAFKA_BOOTSTRAP and STREAMLING_TEST_SCHEMA_REGISTRY_URL are already set (as
# `fixtures/dev test` does), those services are used; otherwise the script runs once per session.

_KAFKA_PREFIXES = ("STREAMLING__KAFKA_SOURCE__", "STREAMLING__KAFKA_SINK__", "STREAMLING_TEST_KAFKA_",
             "STREAMLING_TEST_SCHEMA_REGISTRY_")


@pytest.fixture(scope="session")
def kafka_service() -> dict[str, str]:
    """The services' exports: broker and schema-registry settings for sources and sinks."""
    if os.environ.get("STREAMLING_TEST_KAFKA_BOOTSTRAP") and os.environ.get("STREAMLING_TEST_SCHEMA_REGISTRY_URL"):
        return {k: v for k, v in os.environ.items() if k.startswith(_KAFKA_PREFIXES)}
    exports = start_services("kafka", "registry")
    assert "STREAMLING_TEST_KAFKA_BOOTSTRAP" in exports and "STREAMLING_TEST_SCHEMA_REGISTRY_URL" in exports, exports
    return exports


@pytest.fixture(scope="session")
def kafka_environ(kafka_service: Mapping[str, str]) -> dict[str, str]:
    """An environment for ``load_settings(environ=…)``: this process's plus the services' exports."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_KAFKA_PREFIXES)}
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


# --- HDFS (fixtures/services/up hdfs) ---------------------------------------------------------------

@pytest.fixture(scope="session")
def hdfs() -> dict[str, str]:
    """The NameNode's RPC URL (``STREAMLING_TEST_HDFS_URL``) and WebHDFS address (``…_HDFS_HTTP``)."""
    if os.environ.get("STREAMLING_TEST_HDFS_HTTP"):
        return {k: v for k, v in os.environ.items() if k.startswith("STREAMLING_TEST_HDFS_")}
    return start_services("hdfs")


# --- the S3-compatible store (fixtures/services/up s3) ---------------------------------------------

@pytest.fixture(scope="session")
def s3() -> dict[str, str]:
    if os.environ.get("STREAMLING_TEST_S3_ENDPOINT"):
        return {k: v for k, v in os.environ.items() if k.startswith(("STREAMLING_TEST_S3_", "STREAMLING_TEST_S3A_"))}
    return start_services("s3")


# --- ClickHouse (fixtures/services/up clickhouse) ---------------------------------------------------
# If STREAMLING_TEST_CLICKHOUSE_URL is already set (as `fixtures/dev test` does), that server is
# used; otherwise the script runs once per session and its exports reach tests through ch_environ.

_CLICKHOUSE_PREFIXES = ("STREAMLING__CLICKHOUSE_SOURCE__", "STREAMLING__CLICKHOUSE_SINK__",
                        "STREAMLING_TEST_CLICKHOUSE_")


@pytest.fixture(scope="session")
def clickhouse_service() -> dict[str, str]:
    if os.environ.get("STREAMLING_TEST_CLICKHOUSE_URL"):
        return {k: v for k, v in os.environ.items() if k.startswith(_CLICKHOUSE_PREFIXES)}
    exports = start_services("clickhouse")
    assert "STREAMLING_TEST_CLICKHOUSE_URL" in exports, exports
    return exports


@pytest.fixture(scope="session")
def ch_environ(clickhouse_service: Mapping[str, str]) -> dict[str, str]:
    """An environment for ``load_settings(environ=…)``: this process's plus the service's exports."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_CLICKHOUSE_PREFIXES)}
    return {**base, **clickhouse_service}


@pytest.fixture()
def ch_client(ch_environ: Mapping[str, str]) -> Iterator[Any]:
    """A client of the service, through the same package the pipeline uses."""
    from streamling.clickhouse import connect
    from streamling.config import load_settings

    client = connect(load_settings(environ=ch_environ).clickhouse_source)
    yield client
    client.close()
