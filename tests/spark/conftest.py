"""Helpers for running whole pipelines in-process on the shared SparkSession."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Runner

pytestmark = pytest.mark.spark


@pytest.fixture
def runner(spark: Any, tmp_path: Path) -> Runner:
    return Runner(spark, tmp_path)


@pytest.fixture
def read_delta(spark: Any) -> Callable[[Path], list[dict[str, Any]]]:
    def read(path: Path) -> list[dict[str, Any]]:
        rows = spark.read.format("delta").load(str(path)).collect()
        return sorted((r.asDict() for r in rows), key=lambda r: tuple(str(v) for v in r.values()))

    return read
