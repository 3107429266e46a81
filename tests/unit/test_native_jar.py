"""streamling's JVM classes are built once per source and pyspark; a failed build only costs speed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamling.runtime import jars


def test_built_once_into_the_cache_then_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path))
    jar = jars.native_jar()
    assert jar is not None and jar.name == jars.NATIVE_JAR and jar.is_relative_to(tmp_path)
    built = jar.stat().st_mtime_ns

    def no_build(*_: Any, **__: Any) -> None:
        raise AssertionError("rebuilt")

    monkeypatch.setattr(subprocess, "run", no_build)
    assert jars.native_jar() == jar and jar.stat().st_mtime_ns == built


def test_a_failed_build_falls_back_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path))

    def failing(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", "error: release version 17 not supported")

    monkeypatch.setattr(subprocess, "run", failing)
    assert jars.native_jar() is None
    assert "release version 17 not supported" in caplog.text and "Python workers instead" in caplog.text
    assert not list(tmp_path.rglob("*.jar")) and not list(tmp_path.rglob(".build-*"))
