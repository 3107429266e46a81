"""Running whole pipelines in-process on the shared SparkSession (importable as ``harness``)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streamling.config import Settings, load_settings
from streamling.runtime import events as ev
from streamling.runtime.pipeline import PipelineRun
from streamling.spec import parse_pipeline


class Runner:
    """Runs a pipeline YAML in a per-test state dir and records its events."""

    def __init__(self, spark: Any, tmp_path: Path, environ: Mapping[str, str] | None = None) -> None:
        self.spark = spark
        self.tmp_path = tmp_path
        self.environ = dict(environ or {})
        self.events: list[ev.Event] = []
        #: attach the run's telemetry (stats, metrics, admin API when admin_api_port is set) as the CLI does
        self.with_telemetry = False
        self.telemetry: Any = None

    def settings(self, **overrides: Any) -> Settings:
        base: dict[str, Any] = {"state_dir": str(self.tmp_path / "state"), "application_id": "test_app",
                                "checkpoint_interval_sec": 0}
        base.update(overrides)
        return load_settings(environ=self.environ, cwd=self.tmp_path, overrides=base)

    def pipeline(self, yaml_text: str, **overrides: Any) -> PipelineRun:
        spec = parse_pipeline(textwrap.dedent(yaml_text))
        bus = ev.EventBus()
        bus.subscribe(self.events.append)
        run = PipelineRun(spec, self.settings(**overrides), self.spark, bus)
        if self.with_telemetry:
            from streamling.telemetry.attach import attach

            self.telemetry = attach(run.plan, run.settings, bus)
        return run

    def close_telemetry(self) -> None:
        if self.telemetry is not None:
            self.telemetry.close()

    def run(self, yaml_text: str, timeout_secs: float = 180, **overrides: Any) -> PipelineRun:
        """Run until every flow ends by itself (bounded sources) or ``timeout_secs``."""
        run = self.pipeline(yaml_text, **overrides)
        run.start()
        try:
            run.wait(timeout_secs=timeout_secs)
        finally:
            run.stop("test finished")
        return run

    def run_until(self, yaml_text: str, done: Callable[[Runner], bool], timeout_secs: float = 180,
                  **overrides: Any) -> PipelineRun:
        """Run an unbounded pipeline until ``done(self)`` holds, then stop it between epochs."""
        run = self.pipeline(yaml_text, **overrides)
        run.start()
        try:
            deadline = time.monotonic() + timeout_secs
            while time.monotonic() < deadline and not done(self):
                failed = [r.failure for r in run.runners if r.failure is not None]
                if failed:
                    raise failed[0]
                time.sleep(0.2)
            else:
                if not done(self):
                    raise AssertionError(f"pipeline did not get there in {timeout_secs}s; events: {self.events[-5:]}")
        finally:
            run.request_stop("test finished")
            run.wait(timeout_secs=60)
            run.stop("test finished")
        return run

    def of_type(self, kind: type[ev.Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def input_rows(self) -> int:
        return sum(e.input_rows for e in self.of_type(ev.EpochFinalized))


def kill_at_line(cmd: list[str], cwd: Path, env: Mapping[str, str], marker: str,
                 timeout_secs: float = 300) -> list[str]:
    """Start ``cmd``, SIGKILL it (no chance to clean up) as soon as its stderr shows ``marker``,
    and return the stderr lines seen; fails when the marker never came."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if marker in line:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert any(marker in line for line in seen), "".join(seen[-40:])
    return seen
