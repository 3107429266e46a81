"""ClickHouse for integration tests: the server started by ``fixtures/services/up clickhouse``.

If ``STREAMLING_TEST_CLICKHOUSE_URL`` is already set (``eval "$(fixtures/services/up clickhouse)"``),
that server is used; otherwise the fixture script runs once per session and its exports are parsed
and handed to tests through ``ch_environ`` (never written into ``os.environ``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from services import start_services

_PREFIXES = ("STREAMLING__CLICKHOUSE_SOURCE__", "STREAMLING__CLICKHOUSE_SINK__", "STREAMLING_TEST_CLICKHOUSE_")


@pytest.fixture(scope="session")
def clickhouse_service() -> dict[str, str]:
    if os.environ.get("STREAMLING_TEST_CLICKHOUSE_URL"):
        return {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
    exports = start_services("clickhouse")
    assert "STREAMLING_TEST_CLICKHOUSE_URL" in exports, exports
    return exports


@pytest.fixture(scope="session")
def ch_environ(clickhouse_service: Mapping[str, str]) -> dict[str, str]:
    """An environment for ``load_settings(environ=…)``: this process's plus the service's exports."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    return {**base, **clickhouse_service}


@pytest.fixture()
def ch_client(ch_environ: Mapping[str, str]) -> Iterator[Any]:
    """A client of the service, through the same package the pipeline uses."""
    from streamling.clickhouse import connect
    from streamling.config import load_settings

    client = connect(load_settings(environ=ch_environ).clickhouse_source)
    yield client
    client.close()
