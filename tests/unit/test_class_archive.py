"""The driver's class archive: keyed on what the JVM checks, used only when built, and a failed build
only costs start-up time."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamling.runtime import class_archive


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path / "cache"))
    out = []
    for name in ("a.jar", "b.jar"):
        (tmp_path / name).write_bytes(b"PK" + name.encode())
        out.append(tmp_path / name)
    return out


def test_the_key_follows_the_class_path_jars(jars: list[Path]) -> None:
    path = class_archive.archive_path(jars)
    assert path is not None and path.name == class_archive.ARCHIVE
    assert class_archive.archive_path(list(jars)) == path  # stable
    assert class_archive.archive_path(jars[:1]) != path  # another class path
    os.utime(jars[0], ns=(1, 1))  # a replaced jar: the JVM would refuse the old archive
    assert class_archive.archive_path(jars) != path
    assert class_archive.archive_path([*jars, jars[0].with_name("gone.jar")]) is None


def test_the_session_options_map_an_archive_only_once_it_is_built(jars: list[Path]) -> None:
    assert class_archive.java_options(jars) == ""
    path = class_archive.archive_path(jars)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    options = class_archive.java_options(jars)
    assert f"-XX:SharedArchiveFile={path}" in options and "-Xlog:cds=off" in options


def test_a_failed_build_leaves_nothing_and_warns(jars: list[Path], monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def failing(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, None, "Error: could not create the Java Virtual Machine.")

    monkeypatch.setattr(subprocess, "run", failing)
    path = class_archive.archive_path(jars)
    assert path is not None
    path.parent.mkdir(parents=True)
    killed = path.with_name(f".999999999.{class_archive.ARCHIVE}")  # a build killed mid-way
    killed.write_bytes(b"half an archive")
    assert class_archive.build(jars) is None
    assert "could not create the Java Virtual Machine" in caplog.text and "start without it" in caplog.text
    assert not list(path.parent.iterdir())


def test_an_existing_archive_is_not_rebuilt(jars: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = class_archive.archive_path(jars)
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")

    def no_build(*_: Any, **__: Any) -> None:
        raise AssertionError("rebuilt")

    monkeypatch.setattr(subprocess, "run", no_build)
    assert class_archive.build(jars) == path


def test_the_command_builds_a_missing_archive_in_the_background_once(jars: list[Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain install has no archive: the command's first run starts one build, detached and niced,
    after the run; not while one is under way, not again within a day of one that failed."""
    started: list[dict[str, Any]] = []

    def popen(args: list[str], **kwargs: Any) -> None:
        started.append({"args": args, **kwargs})

    monkeypatch.setattr(subprocess, "Popen", popen)
    path = class_archive.archive_path(jars)
    assert path is not None
    assert class_archive.build_in_background(jars) is True
    [call] = started
    assert call["args"][-3:] == ["--build", *map(str, jars)] and call["start_new_session"] is True
    assert call["stdout"] is subprocess.DEVNULL and callable(call["preexec_fn"])

    path.parent.mkdir(parents=True)
    building = path.parent / f".{os.getpid()}.{class_archive.ARCHIVE}"  # a live build's temporary file
    building.write_bytes(b"")
    assert class_archive.build_in_background(jars) is False
    building.unlink()
    (path.parent / class_archive.FAILED).touch()  # a build that failed just now
    assert class_archive.build_in_background(jars) is False
    os.utime(path.parent / class_archive.FAILED, (0, 0))  # … a day ago and more
    assert class_archive.build_in_background(jars) is True
    path.write_bytes(b"archive")
    assert class_archive.build_in_background(jars) is False
    assert len(started) == 2
