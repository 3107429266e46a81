"""Shared fixtures: one SparkSession for the whole test session."""

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
