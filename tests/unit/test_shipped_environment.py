"""The environment shipped to executors on other hosts: what it holds, and what its launcher says on
a worker without a Python of the driver's minor version."""

from __future__ import annotations

import os
import subprocess
import sys
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


def _launcher(tmp_path: Path, minor: str) -> Path:
    script = tmp_path / "env" / "bin" / "python"
    script.parent.mkdir(parents=True)
    script.write_text(environment._LAUNCHER.format(minor=minor, full=f"{minor}.7", marker=environment._MARKER))
    script.chmod(0o755)
    (tmp_path / "env" / "site-packages").mkdir()
    (tmp_path / "env" / "site-packages" / "shipped_probe.py").write_text("WHERE = 'archive'\n")
    return script


def test_the_launcher_runs_a_python_of_the_same_minor_with_the_archives_packages(tmp_path: Path) -> None:
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    script = _launcher(tmp_path, minor)
    env = {"PATH": os.environ["PATH"], "STREAMLING_WORKER_PYTHON": sys.executable, "PYTHONPATH": "/spark/pyspark.zip"}
    out = subprocess.run([str(script), "-c", "import shipped_probe, sys; print(shipped_probe.WHERE, *sys.path[1:3])"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    # the archive's packages first, then what Spark put on the path
    assert out == ["archive", str(tmp_path / "env" / "site-packages"), "/spark/pyspark.zip"]


def test_a_worker_without_that_python_fails_naming_both_versions(tmp_path: Path) -> None:
    script = _launcher(tmp_path, "3.99")
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


def test_the_launcher_needs_no_tool_beyond_the_shell(tmp_path: Path) -> None:
    script = _launcher(tmp_path, f"{sys.version_info[0]}.{sys.version_info[1]}")
    proc = subprocess.run(["/bin/sh", str(script), "-c", "print(1)"], capture_output=True, text=True,
                          env={"PATH": "/nonexistent", "STREAMLING_WORKER_PYTHON": sys.executable})
    assert proc.stdout.strip() == "1", proc.stderr


def test_a_python_package_that_is_not_installed_is_named_before_anything_is_packed(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    monkeypatch.setenv("STREAMLING_CACHE_DIR", str(tmp_path))
    with pytest.raises(StreamlingError) as info:
        environment.packed_environment(["no-such-distribution"])
    assert "spark.python_packages names ['no-such-distribution'], which are not installed" in info.value.headline()
    assert not (tmp_path / "environments").exists()
