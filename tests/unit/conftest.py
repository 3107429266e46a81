"""Fixtures of the unit tests (no Spark)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture()
def restore_logging() -> Iterator[None]:
    """Put the root logger back as it was: the CLI's ``main`` installs its own handlers and level."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
