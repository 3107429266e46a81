"""Shared fixtures: one SparkSession per test process; how the suite splits over pytest-xdist workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from streamling.config import load_settings
    from streamling.runtime.session import build_session

    settings = load_settings(environ={}, cwd=ROOT / "tests")
    session = build_session(settings, app_name="streamling-tests")
    yield session
    session.stop()


#: Tests that use the shared services, the Spark clusters and the CLI: one worker runs them one after
#: another, as they stop and kill services, workers and drivers that the others of them rely on.
SERVICE_TESTS = ("tests/integration/", "tests/e2e/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``--dist loadgroup`` (``fixtures/dev test`` runs two workers): the service
    tests in one group, every other file in a group of its own (a notebook's cells share a kernel, a
    module's tests their fixtures), so the second worker runs the in-process Spark, unit, notebook and
    browser tests while the first runs the service tests."""
    for item in items:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        group = "services" if path.startswith(SERVICE_TESTS) else path
        item.add_marker(pytest.mark.xdist_group(group))
