from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_lab import Lab, running_lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with running_lab(tmp_path) as server:
        yield server
