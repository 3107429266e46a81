"""A task's dependencies when they cannot be had: a wheel not built, a build that fails, a package pip
cannot find — each a clear error before any task runs, and nothing half-built left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamling.bundle.environments import build_artifacts, content_key, task_python
from streamling.bundle.model import Artifact
from streamling.errors import StreamlingError


def test_a_wheel_that_was_not_built_names_its_path_and_the_fix(tmp_path: Path) -> None:
    missing = str(tmp_path / "dist" / "*.whl")
    assert content_key([missing]) is None  # no fingerprint yet: the deploy builds the artifacts first
    with pytest.raises(StreamlingError, match=r"no wheel matches .*dist/\*\.whl") as info:
        task_python([missing])
    assert "artifacts" in (info.value.hint or "")


def test_a_failing_build_and_a_build_that_makes_nothing_say_which_artifact(tmp_path: Path) -> None:
    failed = r"artifact 'app': `echo compiling >&2; exit 3` failed .*\(exit 3\): compiling"
    with pytest.raises(StreamlingError, match=failed):
        build_artifacts([Artifact("app", tmp_path, "echo compiling >&2; exit 3", [str(tmp_path / "dist/*.whl")])])
    with pytest.raises(StreamlingError, match=r"artifact 'app': the build made no file matching"):
        build_artifacts([Artifact("app", tmp_path, "true", [str(tmp_path / "dist/*.whl")])])


def test_a_broken_wheel_and_a_package_pip_cannot_find_leave_no_environment(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path / "cache"))
    wheel = tmp_path / "broken-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip file")
    with pytest.raises(StreamlingError, match=r"broken-1.0-py3-none-any.whl is not a wheel"):
        task_python([str(wheel)])
    with pytest.raises(StreamlingError, match="cannot install the task's libraries"):
        task_python(["streamling-no-such-package-anywhere==0.0.1"])
    homes = tmp_path / "cache" / "task-envs"
    assert [p.name for p in homes.iterdir() if not p.name.endswith(".lock")] == []
