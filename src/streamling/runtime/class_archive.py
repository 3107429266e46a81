"""A class-data-sharing archive of the driver JVM's classes, so a local run starts in less time.

A cold Spark driver spends much of its start-up loading and verifying classes (Spark SQL, the
streaming engine, Delta), with both cores of a small machine busy throughout. Java's dynamic CDS
archive (``-XX:ArchiveClassesAtExit``) records the classes a representative run loaded, already
parsed and verified; later JVMs map it (``-XX:SharedArchiveFile``): measured in-process on 2 cores,
session start 3.9 → 2.3 s, the first query 2.2 → 1.2 s, the first Delta commit 2.4 → 1.9 s; the
README's run 8.8 → 5.8 s to its first row.

The archive is built by ``build()`` (``fixtures/dev setup`` runs it) with a small pipeline in a
JVM of its own, into ``$STREAMLING_CACHE_DIR/cds/<key>/``; the key covers what the JVM checks
before it uses an archive (the JDK, the class path's jars and their sizes and times), so a changed
install builds a new one instead of tripping over the old. A local session whose archive is
missing starts as before; once the command's run is over, ``build_in_background`` builds it in a
detached, lower-priority process, so that a plain ``pip install`` gets it from its second run on.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from streamling.util import process_alive

log = logging.getLogger(__name__)
ARCHIVE = "driver.jsa"
#: a JVM that cannot use the archive (say, a class path changed by ``spark.conf``) runs without
#: it; these keep that from printing CDS warnings on the user's terminal
QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path(jars: list[Path]) -> Path | None:
    """Where the archive for this JDK, pyspark and these class-path jars lives (it may not exist
    yet); None without a JDK to key it on."""
    import pyspark

    from streamling.runtime.jars import cache_dir, java_home

    home = java_home()
    if home is None:
        return None
    release = home / "release"
    parts = [str(home), release.read_text(errors="replace") if release.exists() else "", pyspark.__version__]
    spark_jars = Path(pyspark.__file__).parent / "jars"
    for jar in [*jars, *sorted(spark_jars.glob("*.jar"))]:
        try:
            stat = jar.stat()
        except OSError:
            return None
        parts.append(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return cache_dir() / "cds" / digest / ARCHIVE


def java_options(jars: list[Path]) -> str:
    """The driver's JVM options that map the archive, or "" when none has been built."""
    path = archive_path(jars)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None and path.exists() else ""


_TRAINING = textwrap.dedent("""
    sources:
      orders: {type: generate, rows: 2000, rows_per_batch: 1000, primary_key: id}
    transforms:
      big: {type: sql, sql: "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders WHERE amount > 500"}
    sinks:
      console: {type: print, from: big}
      lake: {type: delta, from: big, path: "%s"}
""")


def _train(target: Path) -> None:
    """Run a small pipeline (generate → SQL → print + keyed Delta: an append, then a MERGE) in a
    fresh JVM that writes the classes it loaded to ``target`` when it exits."""
    from pyspark import SparkContext

    from streamling.config import load_settings
    from streamling.runtime.pipeline import PipelineRun
    from streamling.runtime.session import build_session
    from streamling.spec import parse_pipeline

    with tempfile.TemporaryDirectory(prefix="streamling-cds-") as work:
        settings = load_settings(environ={}, cwd=Path(work),
                                 overrides={"state_dir": str(Path(work) / "state"), "admin_api_port": 0})
        spark = build_session(settings, java_options=f"-XX:ArchiveClassesAtExit={target}")
        spec = parse_pipeline(_TRAINING % (Path(work) / "lake"))
        run = PipelineRun(spec, settings, spark)
        run.run()
        gateway = SparkContext._gateway
        proc = getattr(gateway, "proc", None)
        spark.stop()
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:  # the JVM exits when its stdin closes, and writes the archive as it does
            proc.stdin.close()
            proc.wait(timeout=300)


def build(jars: list[Path]) -> Path | None:
    """Build the archive for a local session with these jars, unless it exists (about 20 s)."""
    path = archive_path(jars)
    if path is None or path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".*.{ARCHIVE}"):  # ~200 MB each, left by builds that were killed
        if not process_alive(stale.name.split(".")[1]):
            stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{os.getpid()}.{ARCHIVE}")
    tmp.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "streamling.runtime.class_archive", str(tmp)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900)
    if proc.returncode != 0 or not tmp.exists() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        # Only start-up time depends on the archive: say why and go on without it.
        log.warning("cannot build the JVM class archive (local runs start without it): %s",
                    (proc.stderr.strip().splitlines() or ["no archive written"])[-1])
        return None
    tmp.replace(path)
    return path


#: a build attempt that failed: no other attempt for a day (a JDK without CDS fails every time)
FAILED = ".failed"
RETRY_FAILED_SECS = 24 * 3600


def build_in_background(jars: list[Path]) -> bool:
    """Start ``build(jars)`` in a detached, niced process unless the archive exists, a build is
    under way or one failed within the last day. Returns whether one was started. The command
    calls this after its run, so the build never competes with the pipeline."""
    import time

    path = archive_path(jars)
    if path is None or path.exists() or any(process_alive(t.name.split(".")[1]) for t in path.parent.glob(
            f".*.{ARCHIVE}")):
        return False
    failed = path.parent / FAILED
    if failed.exists() and time.time() - failed.stat().st_mtime < RETRY_FAILED_SECS:
        return False
    subprocess.Popen([sys.executable, "-m", "streamling.runtime.class_archive", "--build", *map(str, jars)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, preexec_fn=lambda: os.nice(10))
    return True


def _build_or_mark(jars: list[Path]) -> None:
    path = archive_path(jars)
    if build(jars) is None and path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / FAILED).touch()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--build"]:
        _build_or_mark([Path(j) for j in sys.argv[2:]])
    else:
        _train(Path(sys.argv[1]))
