"""The job's Python environment, packed for executors on other hosts.

Python workers on a cluster's executors import streamling, pyarrow and every plugin a pipeline
uses. A worker host should need nothing of ours beforehand — only Java, Spark and a Python of the
driver's minor version — so the driver packs what the job imports into one archive and Spark ships
it with the application (``spark.archives``, unpacked in each executor's working folder); the
executors' Python is that archive's launcher, ``./streamling_env/bin/streamling-python``.

What is packed is the closure of the runtime requirements of ``streamling``, of every installed
plugin distribution (entry-point group ``streamling.plugins``) and of ``spark.python_packages``:
each distribution's installed files (its ``RECORD``), or for an editable install the package folders
its top-level names import from. Not packed: ``pyspark/jars`` (the worker's Spark has them),
bytecode caches and test suites. The archive is built once per content (distributions and their
versions, the sources of editable installs, this Python's minor version) under
``$STREAMLING_CACHE_DIR/environments/<key>/`` and reused by every later job of that content: a
deployment ships the same file until its code or dependencies change.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import logging
import os
import re
import stat
import sys
import threading
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from packaging.requirements import Requirement

from streamling.errors import StreamlingError

log = logging.getLogger(__name__)

#: the folder the archive is unpacked into, in each executor's working folder
ALIAS = "streamling_env"
#: the Python every Python function of the job names (PySpark's ``PYSPARK_PYTHON``). A bare name,
#: found on each side's PATH: executors put the archive's ``bin`` (relative to their working folder)
#: first on theirs, the driver a folder whose ``streamling-python`` runs the driver's own
#: interpreter — the driver JVM starts Python too, to plan Python data sources, in its own working
#: folder, where no archive is unpacked.
EXECUTOR_PYTHON = "streamling-python"
#: the executors' PATH entry for the archive's launcher
EXECUTOR_PATH = f"./{ALIAS}/bin"
#: where the executors' PATH continues (where a worker's Python is usually installed)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LOCK = threading.Lock()
_SKIP_DIRS = {"__pycache__", "tests", "test"}
_SKIP_PREFIXES = ("pyspark/jars/", "pyarrow/include/", "pyarrow/src/")

#: The executors' Python. A POSIX shell script, so that it runs on any worker: it finds a Python of
#: the driver's minor version there (``STREAMLING_WORKER_PYTHON`` first, e.g. set through
#: ``spark.executorEnv``) and runs it with the archive's packages first on the path. A worker without
#: one fails the task with a message naming both versions (Spark passes a worker's stderr on).
_LAUNCHER = """#!/bin/sh
# Spark runs this as the executors' Python: the job's packages from this archive, a host's Python.
case "$0" in */*) bin=${{0%/*}} ;; *) bin=. ;; esac
here=$(cd "$bin/.." && pwd)
want={minor}
seen=""
for py in "${{STREAMLING_WORKER_PYTHON:-}}" python{minor} python3 python; do
  [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
  got=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
  if [ "$got" = "$want" ]; then
    PYTHONPATH="$here/site-packages${{PYTHONPATH:+:$PYTHONPATH}}"
    export PYTHONPATH
    exec "$py" "$@"
  fi
  seen="$seen${{seen:+, }}$py is $got"
done
host=unknown
read -r host </proc/sys/kernel/hostname 2>/dev/null
echo "{marker} $host has no Python $want (${{seen:-none found}}) but the driver runs Python \
{full}: install Python $want on every worker, or point spark.executorEnv.STREAMLING_WORKER_PYTHON at one" >&2
exit 1
"""


#: how the launcher's complaint starts (``worker_failure`` finds it in a failed task's text)
_MARKER = "streamling: worker host"
_NO_PYTHON = re.compile(re.escape(_MARKER) + r" .*?(?=\\n|\n|$)")


def worker_failure(text: str) -> StreamlingError | None:
    """A failed task's text (a Spark exception chain) → what the worker lacks, in the launcher's own
    words: executors could not start the job's Python. Terminal: only installing fixes it."""
    found = _NO_PYTHON.search(text)
    if found is not None:
        line = found.group(0).removeprefix("streamling: ").strip()
        return StreamlingError(f"executors cannot start Python: {line}", code="worker_python")
    if f"Cannot run program \"{EXECUTOR_PYTHON}\"" in text:
        return StreamlingError(f"executors cannot run {EXECUTOR_PYTHON} from the shipped environment",
                               code="worker_python", hint=f"keep {EXECUTOR_PATH} first on spark.executorEnv.PATH, "
                               "and check that the workers' disk allows running programs from Spark's work folder")
    return None


def driver_python_dir() -> Path:
    """A folder holding ``streamling-python`` for this driver: it runs this very interpreter. Put
    first on the driver's PATH before its JVM starts (see ``EXECUTOR_PYTHON``)."""
    from streamling.runtime.session import cache_dir

    digest = hashlib.sha256(sys.executable.encode()).hexdigest()[:12]
    folder = cache_dir() / "driver-python" / digest
    shim = folder / EXECUTOR_PYTHON
    text = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'
    if not shim.exists() or shim.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{EXECUTOR_PYTHON}.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(shim)
    return folder


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


#: streamling's own requirements that only the notebook front end imports, in the driver's kernel:
#: executors never do, so they and what only they need (jedi, prompt-toolkit, Pygments, the widget
#: bundles …) stay out of the archive
_NOTEBOOK_ONLY = frozenset({"ipython", "ipywidgets", "anywidget"})


def _closure(roots: Iterable[str]) -> list[md.Distribution]:
    """Installed distributions ``roots`` need at run time (extras they ask for included), less what
    only streamling's notebook front end needs (``_NOTEBOOK_ONLY``)."""
    installed: dict[str, md.Distribution] = {}
    for dist in md.distributions():
        installed.setdefault(_norm(dist.metadata["Name"] or ""), dist)
    found: dict[str, md.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(_norm(r), frozenset()) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        found_dist = installed.get(name)
        if found_dist is None or (name, extras) in done:
            continue
        done.add((name, extras))
        found[name] = found_dist
        for text in found_dist.requires or []:
            req = Requirement(text)
            wanted = [""] + sorted(extras)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted):
                continue
            if name == "streamling" and _norm(req.name) in _NOTEBOOK_ONLY:
                continue
            todo.append((_norm(req.name), frozenset(req.extras)))
    return sorted(found.values(), key=lambda d: _norm(d.metadata["Name"] or ""))


def _plugin_distributions() -> list[str]:
    names = []
    for ep in md.entry_points(group="streamling.plugins"):
        if ep.dist is not None:
            names.append(ep.dist.metadata["Name"])
    return names


def _editable_roots(dist: md.Distribution) -> list[Path]:
    """Package folders (or modules) an editable install imports from, found through its finder."""
    names = (dist.read_text("top_level.txt") or "").split()
    if not names:
        names = [_norm(dist.metadata["Name"] or "").replace("-", "_")]
    roots: list[Path] = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            roots.extend(Path(p) for p in spec.submodule_search_locations)
        elif spec.origin:
            roots.append(Path(spec.origin))
    return roots


def _is_editable(dist: md.Distribution) -> bool:
    return any(str(f).startswith("__editable__") for f in dist.files or [])


def _members(dists: list[md.Distribution]) -> Iterator[tuple[Path, str]]:
    """(file on this host, its path under the archive's site-packages) for everything packed."""
    for dist in dists:
        if _is_editable(dist):
            for root in _editable_roots(dist):
                if root.is_file():
                    yield root, root.name
                    continue
                for path in sorted(root.rglob("*")):
                    rel = path.relative_to(root.parent)
                    if path.is_file() and not _SKIP_DIRS.intersection(rel.parts):
                        yield path, str(rel)
            continue
        for file in dist.files or []:
            name = str(file)
            if name.startswith(("..", "/")) or name.startswith(_SKIP_PREFIXES) or name.endswith(".pth") \
                    or _SKIP_DIRS.intersection(Path(name).parts):
                continue
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                yield path, name


def _key(dists: list[md.Distribution], members: list[tuple[Path, str]]) -> str:
    digest = hashlib.sha256(f"{sys.version_info[:2]}|{_LAUNCHER}".encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version};".encode())
        if _is_editable(dist):  # its sources change without a version change
            for path, rel in members:
                stat = path.stat()
                digest.update(f"{rel}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def packed_environment(extra_packages: Iterable[str] = ()) -> Path:
    """The archive of this job's Python environment for ``spark.archives``, built on first use."""
    from streamling.runtime.session import cache_dir

    dists = _closure(["streamling", *_plugin_distributions(), *extra_packages])
    missing = [p for p in extra_packages if _norm(p) not in {_norm(d.metadata["Name"] or "") for d in dists}]
    if missing:
        raise StreamlingError(f"spark.python_packages names {missing}, which are not installed in this Python "
                              f"({sys.executable})", code="python_package_missing",
                              hint="pip install them here, or remove them from spark.python_packages")
    editable = [d for d in dists if _is_editable(d)]
    members = list(_members(editable))
    key = _key(dists, members)
    target = cache_dir() / "environments" / key / f"{ALIAS}.zip"
    with _LOCK:
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        try:
            _write(tmp, list(_members(dists)))
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
    log.info("packed the job's Python environment (%d distributions, %.0f MB) into %s", len(dists),
             target.stat().st_size / 1e6, target)
    return target


def _write(path: Path, members: list[tuple[Path, str]]) -> None:
    """An uncompressed (stored) zip: packing and unpacking cost little beyond copying (the file moves
    between hosts once per application, on the cluster's own network). Zip, because Spark unpacks a
    zip keeping each file's mode — the launcher must stay executable — and a ``.tar`` without it."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    launcher = _LAUNCHER.format(minor=minor, full=sys.version.split()[0], marker=_MARKER).encode()
    seen: set[str] = set()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        info = zipfile.ZipInfo(f"bin/{EXECUTOR_PYTHON}")
        info.external_attr = (stat.S_IFREG | 0o755) << 16
        archive.writestr(info, launcher)
        for source, rel in members:
            name = f"site-packages/{rel}"
            if name not in seen:
                seen.add(name)
                archive.write(source, arcname=name)
