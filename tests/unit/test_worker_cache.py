"""A worker host's cache of shipped environment parts does not grow without end: a new part keeps
the most recently used ones of its kind and any part a live process still runs with."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from streamling.runtime.environment_fetch import prune


def _part(cache: Path, name: str, used: float) -> Path:
    folder = cache / name
    (folder / "pkg").mkdir(parents=True)
    (folder / ".complete").touch()
    (cache / f"{name}.lock").touch()
    os.utime(folder / ".complete", (used, used))
    return folder


def test_old_parts_go_unless_recently_used_or_in_use(tmp_path: Path) -> None:
    now = time.time()
    parts = {f"deps-{i}": _part(tmp_path, f"deps-{i}", now - 1000 * i) for i in range(6)}
    code = _part(tmp_path, "code-0", now - 10_000)  # another kind: not counted against deps
    busy = subprocess.Popen(["sleep", "30"], env={**os.environ, "PYTHONPATH": f"/elsewhere:{parts['deps-5']}"})
    try:
        removed = prune(str(tmp_path), "deps", keep=3)
    finally:
        busy.kill()
        busy.wait()
    assert sorted(removed) == ["deps-3", "deps-4"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["code-0", "deps-0", "deps-1", "deps-2",
                                                                       "deps-5"]
    assert not (tmp_path / "deps-3.lock").exists() and code.is_dir()
