"""Pruning of a worker host's jar cache (``HostJars.prune``, run as its command-line tool): each
artifact keeps its most recently used versions, and no version a live process has open goes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pyspark

from streamling.runtime.jars import native_jar


def _version(cache: Path, folder: str, used: float) -> Path:
    (cache / folder).mkdir(parents=True)
    jar = cache / folder / f"{folder.split('@')[0]}-1.0.jar"
    jar.write_bytes(b"PK")
    (cache / folder / ".complete").touch()
    os.utime(cache / folder / ".complete", (used, used))
    (cache / f"{folder}.lock").touch()
    return jar


def _prune(cache: Path, keep: int) -> list[str]:
    jar = native_jar()
    assert jar is not None, "streamling's JVM classes need a JDK (javac)"
    spark_jars = Path(pyspark.__file__).parent / "jars"
    java = shutil.which("java")
    assert java is not None
    proc = subprocess.run([java, "-cp", f"{jar}:{spark_jars}/*", "streamling.spark.HostJars", "prune", str(cache),
                           str(keep)], capture_output=True, text=True, timeout=60, check=True)
    return sorted(proc.stdout.split())


def test_prune_keeps_each_artifacts_newest_versions_and_those_in_use(tmp_path: Path) -> None:
    cache = tmp_path / "jars"
    held = _version(cache, "hadoop-aws@0001", 100)  # the oldest, but a live process has it open
    for i, folder in enumerate(["hadoop-aws@0002", "hadoop-aws@0003", "hadoop-aws@0004", "hadoop-aws@0005"]):
        _version(cache, folder, 200 + i)
    _version(cache, "kafka-clients@0001", 50)  # old, but the only version of its artifact
    (cache / "delta-spark@0001.partial").mkdir()  # a fetch in progress (or killed): not a version yet
    with held.open("rb"):
        removed = _prune(cache, keep=2)
    assert removed == ["hadoop-aws@0002", "hadoop-aws@0003"]
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [
        "delta-spark@0001.partial", "hadoop-aws@0001", "hadoop-aws@0004", "hadoop-aws@0005", "kafka-clients@0001"]
    assert not (cache / "hadoop-aws@0002.lock").exists()
    # Once nothing holds it, the oldest goes too.
    assert _prune(cache, keep=2) == ["hadoop-aws@0001"]
