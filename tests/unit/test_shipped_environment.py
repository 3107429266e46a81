"""The environment shipped to executors on other hosts: what it holds, how a worker host fetches it
once, and what its launcher says on a worker that lacks a Python of the driver's minor version or
cannot reach the driver."""

from __future__ import annotations

import importlib.metadata as md
import io
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamling.config import Settings
from streamling.errors import StreamlingError
from streamling.runtime import environment


def _names(dists: list) -> set[str]:
    return {environment._norm(d.metadata["Name"]) for d in dists}


def test_the_closure_holds_the_runtime_requirements_and_the_plugins_not_the_dev_tools() -> None:
    names = _names(environment._closure(["streamling", *environment._plugin_distributions()]))
    assert {"streamling", "pyarrow", "pyspark", "delta-spark", "psycopg", "confluent-kafka", "wasmtime"} <= names
    assert {"streamling-basic-plugin", "streamling-postgres-cdc"} <= names  # entry-point plugins
    assert not {"pytest", "jupyterlab", "playwright", "chdb", "mypy"} & names  # [dev] extras stay home


def test_editable_sources_are_packed_and_the_workers_spark_jars_are_not() -> None:
    dists = environment._closure(["streamling", "pyspark"])
    packed = {rel for _, rel in environment._members(dists)}
    assert "streamling/runtime/flow.py" in packed and "streamling/storage.py" in packed
    assert "pyspark/sql/dataframe.py" in packed
    assert not any(rel.startswith("pyspark/jars/") or "__pycache__" in rel for rel in packed)


def test_masters_that_span_hosts_ship_the_environment_by_default() -> None:
    assert not Settings().spark.ships_environment()
    assert not Settings(spark={"master": "spark://127.0.0.1:7077"}).spark.ships_environment()
    assert Settings(spark={"master": "spark://10.0.0.1:7077"}).spark.ships_environment()
    assert not Settings(spark={"master": "spark://10.0.0.1:7077", "python_environment": "local"}).spark \
        .ships_environment()


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, environment.EnvironmentServer]]:
    """An executor's files folder (the launcher unpacked as ``streamling_env``, ``streamling_env.url``)
    and the server of two tiny parts, as a driver publishes them."""
    server = environment.EnvironmentServer("127.0.0.1", 0)
    server.register({"deps-1": _zip(tmp_path / "deps-1.zip", {"shipped_probe.py": "WHERE = 'deps'\n"}),
                     "code-2": _zip(tmp_path / "code-2.zip", {"shipped_code.py": "WHERE = 'code'\n"})})
    files = tmp_path / "executor"
    (files / environment.ALIAS / "bin").mkdir(parents=True)
    (files / environment.URL_FILE).write_text(server.url("127.0.0.1") + "\n")
    try:
        yield files, server
    finally:
        server.close()


def _launcher(files: Path, minor: str, parts: str = "deps-1 code-2") -> Path:
    script = files / environment.ALIAS / "bin" / environment.EXECUTOR_PYTHON
    script.write_text(environment._LAUNCHER.format(minor=minor, full=f"{minor}.7", marker=environment._MARKER,
                                                   parts=parts, fetch=environment._FETCH))
    script.chmod(0o755)
    fetch = Path(environment.__file__).with_name(environment._FETCH)
    shutil.copy(fetch, script.with_name(environment._FETCH))
    return script


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "STREAMLING_WORKER_PYTHON": sys.executable,
            "STREAMLING_WORKER_CACHE": str(cache), **extra}


PROBE = "import shipped_probe, shipped_code, sys; print(shipped_probe.WHERE, shipped_code.WHERE, *sys.path[1:4])"


def test_the_launcher_fetches_each_part_once_per_host_and_runs_the_workers_python_with_them(
        served: tuple[Path, environment.EnvironmentServer], tmp_path: Path) -> None:
    files, server = served
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    script = _launcher(files, minor)
    cache = tmp_path / "host-cache"
    env = _env(cache, PYTHONPATH="/spark/pyspark.zip")
    out = subprocess.run([str(script), "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout.split()
    # the parts first, in order, then what Spark put on the path
    assert out == ["deps", "code", str(cache / "deps-1"), str(cache / "code-2"), "/spark/pyspark.zip"]
    assert sorted(p.name for p in cache.iterdir()) == ["code-2", "code-2.lock", "deps-1", "deps-1.lock"]
    # another executor of the host (or a later application) finds them there: the driver is not asked again
    server.close()
    (tmp_path / "other" / environment.ALIAS / "bin").mkdir(parents=True)
    other = _launcher(tmp_path / "other", minor)
    again = subprocess.run([str(other), "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert again.stdout.split()[:2] == ["deps", "code"]


def test_what_a_fetch_killed_half_way_left_is_cleared_by_the_next_one(
        served: tuple[Path, environment.EnvironmentServer], tmp_path: Path) -> None:
    files, _ = served
    cache = tmp_path / "host-cache"
    (cache / "deps-1.partial" / "pyarrow").mkdir(parents=True)  # unpacking stopped by a SIGKILL
    (cache / "deps-1.partial" / "pyarrow" / "lib.so").write_bytes(b"half")
    (cache / "deps-1.partial.zip").write_bytes(b"PK half a download")
    (cache / "deps-1").mkdir()  # an incomplete part (no .complete): never trusted
    script = _launcher(files, f"{sys.version_info[0]}.{sys.version_info[1]}")
    out = subprocess.run([str(script), "-c", PROBE], env=_env(cache), capture_output=True, text=True, check=True)
    assert out.stdout.split()[:2] == ["deps", "code"]
    assert sorted(p.name for p in cache.iterdir()) == ["code-2", "code-2.lock", "deps-1", "deps-1.lock"]
    assert {p.name for p in (cache / "deps-1").iterdir()} - {"__pycache__"} == {".complete", "shipped_probe.py"}


def test_a_part_the_worker_cannot_fetch_fails_the_task_saying_where_it_looked(
        served: tuple[Path, environment.EnvironmentServer], tmp_path: Path) -> None:
    files, _ = served
    script = _launcher(files, f"{sys.version_info[0]}.{sys.version_info[1]}", parts="deps-1 code-9")
    cache = tmp_path / "host-cache"
    proc = subprocess.run([str(script), "-c", PROBE], env=_env(cache), capture_output=True, text=True)
    assert proc.returncode == 1
    error = environment.worker_failure(f"org.apache.spark.SparkException: Task failed\\n{proc.stderr}\\n\\tat x")
    assert error is not None and not error.retriable
    assert error.headline().startswith(f"executors cannot start Python: worker host {socket.gethostname()} cannot "
                                       "fetch code-9 from http://127.0.0.1:"), error.headline()
    assert "404" in error.headline() and "spark.python_environment_port" in error.headline()
    # nothing half-made is left to be trusted later; the part that could be fetched stays
    assert sorted(p.name for p in cache.iterdir()) == ["code-9.lock", "deps-1", "deps-1.lock"]


def test_a_host_new_to_the_job_whose_driver_is_gone_fails_the_task_naming_the_driver(
        served: tuple[Path, environment.EnvironmentServer], tmp_path: Path) -> None:
    files, server = served
    server.close()  # the driver died, or a firewall drops its port
    script = _launcher(files, f"{sys.version_info[0]}.{sys.version_info[1]}")
    proc = subprocess.run([str(script), "-c", PROBE], env=_env(tmp_path / "new-host"), capture_output=True,
                          text=True)
    assert proc.returncode == 1
    error = environment.worker_failure(proc.stderr)
    assert error is not None and "cannot fetch deps-1 from http://127.0.0.1:" in error.headline()
    assert "Connection refused" in error.headline() and "spark.python_environment_port" in error.headline()
    assert sorted(p.name for p in (tmp_path / "new-host").iterdir()) == ["deps-1.lock"]  # nothing half-made


def test_the_server_serves_registered_parts_only_and_only_under_its_token(
        served: tuple[Path, environment.EnvironmentServer]) -> None:
    _, server = served
    base = server.url("127.0.0.1")
    with urllib.request.urlopen(base + "deps-1.zip") as response:
        assert zipfile.ZipFile(io.BytesIO(response.read())).namelist() == ["shipped_probe.py"]
    for path in (base + "deps-3.zip", base.replace(server.token, "guess") + "deps-1.zip", base + "deps-1"):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(path)
        assert info.value.code == 404


def test_a_worker_without_that_python_fails_naming_both_versions(
        served: tuple[Path, environment.EnvironmentServer], tmp_path: Path) -> None:
    script = _launcher(served[0], "3.99")
    proc = subprocess.run([str(script), "-c", "pass"], env={"PATH": os.environ["PATH"]}, capture_output=True,
                          text=True)
    assert proc.returncode == 1
    assert "has no Python 3.99" in proc.stderr and "but the driver runs Python 3.99.7" in proc.stderr
    assert f"(python3 is {sys.version_info[0]}." in proc.stderr or "(none found)" in proc.stderr
    assert f"worker host {os.uname().nodename} has" in proc.stderr
    assert "spark.executorEnv.STREAMLING_WORKER_PYTHON" in proc.stderr
    # what the driver makes of it once Spark passed the worker's stderr on inside a task failure
    error = environment.worker_failure(f"org.apache.spark.SparkException: Job aborted\\n{proc.stderr}\\n\\tat x")
    assert error is not None and not error.retriable and error.headline().startswith(
        "executors cannot start Python: worker host ")
    assert "has no Python 3.99" in error.headline() and "\\tat" not in error.headline()


def test_the_launcher_needs_no_tool_beyond_the_shell(served: tuple[Path, environment.EnvironmentServer],
                                                     tmp_path: Path) -> None:
    script = _launcher(served[0], f"{sys.version_info[0]}.{sys.version_info[1]}")
    proc = subprocess.run(["/bin/sh", str(script), "-c", "import shipped_code; print(1)"], capture_output=True,
                          text=True, env={**_env(tmp_path / "cache"), "PATH": "/nonexistent"})
    assert proc.stdout.strip() == "1", proc.stderr


def test_dependencies_and_editable_sources_are_separate_parts_built_once(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(environment, "_closure", lambda roots: [md.distribution("packaging"),
                                                                md.distribution("streamling")])
    packed = environment.packed_environment()
    deps, code = sorted(packed.parts, reverse=True)
    assert deps.startswith("deps-") and code.startswith("code-")
    assert "packaging/version.py" in zipfile.ZipFile(packed.parts[deps]).namelist()
    assert "streamling/runtime/flow.py" in zipfile.ZipFile(packed.parts[code]).namelist()
    launcher = zipfile.ZipFile(packed.launcher)
    assert launcher.namelist() == [f"bin/{environment.EXECUTOR_PYTHON}", f"bin/{environment._FETCH}"]
    assert f"for part in {deps} {code}; do" in launcher.read(f"bin/{environment.EXECUTOR_PYTHON}").decode()
    built = {p: p.stat().st_ino for p in [packed.launcher, *packed.parts.values()]}
    again = environment.packed_environment()
    assert {p: p.stat().st_ino for p in [again.launcher, *again.parts.values()]} == built


def test_the_cache_keeps_the_newest_builds_of_each_kind(tmp_path: Path, monkeypatch: Any) -> None:
    root = tmp_path / "environments"
    (root / "0efa22fcde9c1668").mkdir(parents=True)  # the layout before parts
    for i in range(5):
        for kind in ("deps", "code", "launcher"):
            path = root / f"{kind}-{i}.zip"
            path.write_bytes(b"x")
            os.utime(path, (1000 + i, 1000 + i))
    environment._forget_old_builds(root)
    assert sorted(p.name for p in root.iterdir()) == sorted(
        f"{kind}-{i}.zip" for kind in ("deps", "code", "launcher") for i in (2, 3, 4))


def test_a_python_package_that_is_not_installed_is_named_before_anything_is_packed(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path))
    with pytest.raises(StreamlingError) as info:
        environment.packed_environment(["no-such-distribution"])
    assert "spark.python_packages names ['no-such-distribution'], which are not installed" in info.value.headline()
    assert not (tmp_path / "environments").exists()


def test_a_task_environments_libraries_are_shipped_with_streamlings(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A task with libraries runs on its own environment layered over streamling's: executors on other
    hosts get those libraries in the packed environment too."""
    from streamling.bundle.environments import task_python

    wheel = tmp_path / "tiny_lookup-1.0-py3-none-any.whl"  # the smallest wheel pip installs, written by hand
    with zipfile.ZipFile(wheel, "w") as out:
        out.writestr("tiny_lookup/__init__.py", "REGIONS = {'US': 'americas'}\n")
        out.writestr("tiny_lookup-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny-lookup\nVersion: 1.0\n")
        out.writestr("tiny_lookup-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                         "Tag: py3-none-any\n")
        out.writestr("tiny_lookup-1.0.dist-info/RECORD", "")
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path / "cache"))
    python = task_python([str(wheel)])
    assert python is not None
    script = ("from streamling.runtime import environment as e\n"
              "names = {d.metadata['Name'] for d in e._closure(['streamling', *e.task_distributions()])}\n"
              "print(e.task_distributions(), 'tiny-lookup' in names, 'pyspark' in names)")
    shown = subprocess.run([python, "-c", script], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "['tiny-lookup'] True True"
    assert environment.task_distributions() == []  # streamling's own interpreter has no task libraries
    missing = subprocess.run([sys.executable, "-c", "import tiny_lookup"], capture_output=True)
    assert missing.returncode != 0  # installed into the task's environment only
