"""Helpers for running whole pipelines in-process on the shared SparkSession."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streamling.config import Settings, load_settings
from streamling.runtime import events as ev
from streamling.runtime.pipeline import PipelineRun
from streamling.spec import parse_pipeline

pytestmark = pytest.mark.spark


class Runner:
    """Runs a pipeline YAML to completion in a per-test state dir and records its events."""

    def __init__(self, spark: Any, tmp_path: Path) -> None:
        self.spark = spark
        self.tmp_path = tmp_path
        self.events: list[ev.Event] = []

    def settings(self, **overrides: Any) -> Settings:
        base: dict[str, Any] = {"state_dir": str(self.tmp_path / "state"), "application_id": "test_app",
                                "checkpoint_interval_sec": 0}
        base.update(overrides)
        return load_settings(environ={}, cwd=self.tmp_path, overrides=base)

    def pipeline(self, yaml_text: str, **overrides: Any) -> PipelineRun:
        spec = parse_pipeline(textwrap.dedent(yaml_text))
        bus = ev.EventBus()
        bus.subscribe(self.events.append)
        return PipelineRun(spec, self.settings(**overrides), self.spark, bus)

    def run(self, yaml_text: str, timeout_secs: float = 180, **overrides: Any) -> PipelineRun:
        run = self.pipeline(yaml_text, **overrides)
        run.start()
        try:
            run.wait(timeout_secs=timeout_secs)
        finally:
            run.stop("test finished")
        return run

    def of_type(self, kind: type[ev.Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def runner(spark: Any, tmp_path: Path) -> Runner:
    return Runner(spark, tmp_path)


@pytest.fixture
def read_delta(spark: Any) -> Callable[[Path], list[dict[str, Any]]]:
    def read(path: Path) -> list[dict[str, Any]]:
        rows = spark.read.format("delta").load(str(path)).collect()
        return sorted((r.asDict() for r in rows), key=lambda r: tuple(str(v) for v in r.values()))

    return read
