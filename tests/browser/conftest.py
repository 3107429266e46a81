from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser_lab import Lab, running_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """One JupyterLab per test module: its tests write notebooks of their own names."""
    with running_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server
