"""Shared fixtures: one SparkSession per test process; how the suite splits over pytest-xdist workers."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: `fixtures/dev test` runs two workers
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work units for the workers: the service tests are one unit, every other file one of its own
    (a notebook's cells share a kernel, a module's tests their fixtures). One worker runs the service
    tests while the other runs the in-process Spark, unit, notebook and browser tests."""
    from xdist.scheduler import LoadScopeScheduling

    class _Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "services" if path.startswith(SERVICE_TESTS) else path

    return _Scheduling(config, log)
