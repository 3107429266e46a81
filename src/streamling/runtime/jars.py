"""The jars a session of ours loads, kept in streamling's cache.

Connector jars are resolved from Maven Central once (``mvn dependency:copy-dependencies`` over
the pom shipped in this package) into ``$STREAMLING_CACHE_DIR/jars/<pom hash>/``; streamling's own
JVM classes are compiled from their shipped source on first use. ``runtime.session`` passes both
to Spark.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import threading
from importlib import resources
from pathlib import Path

from streamling.errors import StreamlingError

#: the session module's logger: what it logs about jars it logged before they had a module
log = logging.getLogger("streamling.runtime.session")
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where the connector jars, the class archive and packed environments are kept:
    ``STREAMLING_CACHE_DIR``; else, for streamling run from a source checkout, that checkout's
    ``.cache/`` — the one ``fixtures/dev setup`` fills, so the command run directly finds what the
    set-up fetched and built; else the user's cache (``$XDG_CACHE_HOME/streamling``)."""
    explicit = os.environ.get("STREAMLING_CACHE_DIR")
    if explicit:
        return Path(explicit).resolve()
    checkout = Path(__file__).resolve().parents[3]  # <checkout>/src/streamling/runtime/jars.py
    if (checkout / "pyproject.toml").is_file() and (checkout / "src" / "streamling").is_dir():
        return checkout / ".cache"
    return (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "streamling").resolve()


def ensure_jars() -> list[Path]:
    """The connector jars, downloading them on first use. Safe to call concurrently."""
    pkg = resources.files("streamling.runtime")
    pom = Path(str(pkg.joinpath("connectors.pom.xml")))
    settings_xml = Path(str(pkg.joinpath("connectors.settings.xml")))
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    target = cache_dir() / "jars" / digest
    marker = target / ".complete"
    with _LOCK:
        if not marker.exists():
            if shutil.which("mvn") is None:
                raise StreamlingError(
                    "cannot fetch the Spark connector jars: Maven ('mvn') is not installed",
                    code="jars_missing", user=True,
                    hint="install Maven (apt-get install maven) or copy the jars into " + str(target))
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            cmd = ["mvn", "-q", "-B", "-s", str(settings_xml), "-f", str(pom),
                   "dependency:copy-dependencies", "-DexcludeTransitive=true", f"-DoutputDirectory={tmp}"]
            log.info("fetching connector jars into %s", target)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
                raise StreamlingError(f"cannot fetch the Spark connector jars from Maven Central:\n{tail}",
                                      code="jars_missing", retriable=True,
                                      hint="check network access to repo.maven.apache.org")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
            marker.touch()
    return sorted(target.glob("*.jar"))


#: The JVM classes streamling ships as source (compiled once against this pyspark's jars).
NATIVE_SOURCES = ("GenerateSource.java", "Drain.java", "HostJars.java")
NATIVE_JAR = "streamling-native.jar"
#: where a local session's jars go (see ``build_session``)
CLASS_PATH = "spark.driver.extraClassPath"
#: the Spark plugin that gives a cluster's executors their jars from each host's cache, and the
#: setting listing those jars (see ``HostJars.java``)
HOST_JARS_PLUGIN = "streamling.spark.HostJars"
HOST_JARS = "spark.streamling.hostJars"


def java_home() -> Path | None:
    """The Java installation Spark's launcher runs: ``JAVA_HOME``, else the one whose ``java`` is
    first on PATH (links resolved); None without either."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return Path(home).resolve()
    java = shutil.which("java")
    return Path(java).resolve().parent.parent if java else None


def native_jar() -> Path | None:
    """streamling's own JVM classes (the ``generate`` source's row reader), compiled on first use.

    They are shipped as Java source and built with the JDK's ``javac`` against the jars of the
    installed pyspark, into ``$STREAMLING_CACHE_DIR/native/<hash>/``: no build step at install
    time and never a jar built for another Spark. ``None`` when no ``javac`` is at hand (a JRE
    only): callers then use their Python implementation, which gives the same rows, slower."""
    import pyspark

    pkg = resources.files("streamling.runtime").joinpath("java")
    sources = [Path(str(pkg.joinpath(name))) for name in NATIVE_SOURCES]
    spark_jars = Path(pyspark.__file__).parent / "jars"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + pyspark.__version__.encode()).hexdigest()[:12]
    jar = cache_dir() / "native" / digest / NATIVE_JAR
    with _LOCK:
        if jar.exists():
            return jar
        home = java_home()
        javac = (shutil.which("javac", path=str(home / "bin")) if home else None) or shutil.which("javac")
        jar_tool = Path(javac).with_name("jar") if javac else None
        if javac is None or jar_tool is None or not jar_tool.exists():
            log.info("no JDK (javac, jar) found: the generate source reads its rows in Python workers")
            return None
        tmp = jar.parent / f".build-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "classes").mkdir(parents=True)
        try:
            for cmd in ([javac, "-nowarn", "--release", "17", "-cp", f"{spark_jars}/*", "-d", str(tmp / "classes"),
                         *map(str, sources)],
                        [str(jar_tool), "cf", str(tmp / jar.name), "-C", str(tmp / "classes"), "."]):
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    # Only start-up speed depends on these classes: run without them, and say why.
                    log.warning("cannot build streamling's JVM classes with %s (the generate source reads its "
                                "rows in Python workers instead; check that this JDK can compile for Java 17): %s",
                                cmd[0], (proc.stdout + proc.stderr).strip().splitlines()[-1:])
                    return None
            (tmp / jar.name).replace(jar)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return jar


def driver_jars() -> list[Path]:
    """Every jar a session of ours loads: the connectors, then streamling's own JVM classes."""
    native = native_jar()
    return [*ensure_jars(), *([native] if native is not None else [])]
