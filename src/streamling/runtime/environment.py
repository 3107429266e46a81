"""The job's Python environment, packed for executors on other hosts.

Python workers on a cluster's executors import streamling, pyarrow and every plugin a pipeline
uses. A worker host should need nothing of ours beforehand — only Java, Spark and a Python of the
driver's minor version. So the driver packs what the job imports and serves it to the workers, and
each worker host keeps one unpacked copy per content in a cache of its own:

- **Parts.** ``deps-<key>.zip``: the installed distributions, keyed by their names and versions;
  ``code-<key>.zip``: the sources of editable installs (streamling itself while it is developed,
  a project's own plugins), keyed by their files' sizes and times. A code change ships a few MB,
  not the dependencies again. Built once per content under ``$STREAMLING_CACHE_DIR/environments``.
- **Launcher.** A few kB that Spark ships with the application (``spark.archives``, unpacked as
  ``./streamling_env`` in each executor's working folder): ``bin/streamling-python``, the
  executors' Python. It finds a Python of the driver's minor version on the worker, makes sure each
  part is in the host's cache (``$STREAMLING_WORKER_CACHE``, default ``${TMPDIR:-/tmp}/streamling-envs``;
  ``environment_fetch`` downloads and unpacks a missing one, once per host) and runs that Python
  with the parts first on its path.
- **Serving.** The driver process serves the parts over HTTP (``EnvironmentServer``: a random
  token in every path, only the parts of its own sessions) on ``spark.python_environment_port``
  (0: any free port), and tells executors where through ``streamling_env.url``, a file added to the
  application once the driver's address is known.

Why not ship the parts through Spark (``spark.archives``/``spark.files``)? Spark copies such a file
on the driver (and unpacks an archive there too), then copies and unpacks it again for every
executor of every application, and keeps those copies in the workers' work folders after the
application ends unless ``spark.worker.cleanup`` is on: about 1.5 GB per executor per application for
an environment of 0.5 GB, and a driver killed hard leaves its own copies behind for good. A host's
cache costs one copy per content, and an application starting on a host that already has it sends
nothing.

What is packed is the closure of the runtime requirements of ``streamling``, of every installed
plugin distribution (entry-point group ``streamling.plugins``) and of ``spark.python_packages``:
each distribution's installed files (its ``RECORD``), or for an editable install the package folders
its top-level names import from. Not packed: ``pyspark/jars`` (the worker's Spark has them),
bytecode caches and test suites.
"""

from __future__ import annotations

import hashlib
import http.server
import importlib.metadata as md
import importlib.util
import logging
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from streamling.errors import StreamlingError
from streamling.util import process_alive

log = logging.getLogger(__name__)

#: the folder the launcher archive is unpacked into, in each executor's working folder
ALIAS = "streamling_env"
#: the Python every Python function of the job names (PySpark's ``PYSPARK_PYTHON``). A bare name,
#: found on each side's PATH: executors put the launcher's ``bin`` (relative to their working
#: folder) first on theirs, the driver a folder whose ``streamling-python`` runs the driver's own
#: interpreter — the driver JVM starts Python too, to plan Python data sources, in its own working
#: folder, where no archive is unpacked.
EXECUTOR_PYTHON = "streamling-python"
#: the executors' PATH entry for the launcher
EXECUTOR_PATH = f"./{ALIAS}/bin"
#: where the executors' PATH continues (where a worker's Python is usually installed)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the file (in each executor's files folder) that holds the base URL of the parts
URL_FILE = f"{ALIAS}.url"
#: how many builds of each kind of part the driver's cache keeps (the newest used)
KEEP_BUILDS = 3
_LOCK = threading.Lock()
_SKIP_DIRS = {"__pycache__", "tests", "test"}
_SKIP_PREFIXES = ("pyspark/jars/", "pyarrow/include/", "pyarrow/src/")
_FETCH = "environment_fetch.py"

#: The executors' Python. A POSIX shell script, so that it runs on any worker: it finds a Python of
#: the driver's minor version there (``STREAMLING_WORKER_PYTHON`` first, e.g. set through
#: ``spark.executorEnv``), makes sure each part is in the host's cache and runs that Python with the
#: parts first on the path. A worker without such a Python, or that cannot fetch a part, fails the
#: task with a message saying why (Spark passes a worker's stderr on).
_LAUNCHER = """#!/bin/sh
# Spark runs this as the executors' Python: the job's packages from the host's cache, a host's Python.
case "$0" in */*) bin=${{0%/*}} ;; *) bin=. ;; esac
here=$(cd "$bin/.." && pwd)
want={minor}
seen=""
for py in "${{STREAMLING_WORKER_PYTHON:-}}" python{minor} python3 python; do
  [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
  got=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
  if [ "$got" = "$want" ]; then
    cache=${{STREAMLING_WORKER_CACHE:-${{TMPDIR:-/tmp}}/streamling-envs}}
    path=""
    for part in {parts}; do
      "$py" -I -S "$here/bin/{fetch}" "$cache" "$part" "$here/.." || exit 1  # fetched once, marked used each time
      path="$path${{path:+:}}$cache/$part"
    done
    PYTHONPATH="$path${{PYTHONPATH:+:$PYTHONPATH}}"
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


#: how the launcher's complaints start (``worker_failure`` finds them in a failed task's text)
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
    from streamling.runtime.jars import cache_dir

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


#: the line a bundle task's environment uses to layer itself over streamling's (``bundle.environments``)
LAYER_PTH = "_streamling_base.pth"


def task_distributions() -> list[str]:
    """A bundle task's own libraries: the distributions of this interpreter's site-packages when it
    is a task environment layered over streamling's (it holds ``LAYER_PTH``; see
    ``streamling.bundle.environments``). Its executors need them as much as its driver does."""
    import sysconfig

    own = Path(sysconfig.get_path("purelib"))
    if not (own / LAYER_PTH).is_file():
        return []
    return [str(d.metadata["Name"]) for d in md.distributions(path=[str(own)])]


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


@dataclass(frozen=True)
class PackedEnvironment:
    """What a shipping session needs: the launcher archive for ``spark.archives`` and the parts the
    driver serves (name → zip on this host)."""

    launcher: Path
    parts: dict[str, Path]


def _digest(*items: str) -> str:
    digest = hashlib.sha256(f"{sys.version_info[:2]}".encode())
    for item in items:
        digest.update(item.encode())
        digest.update(b";")
    return digest.hexdigest()[:16]


def packed_environment(extra_packages: Iterable[str] = ()) -> PackedEnvironment:
    """This job's Python environment, packed for executors; each part built on first use."""
    from streamling.runtime.jars import cache_dir

    dists = _closure(["streamling", *_plugin_distributions(), *task_distributions(), *extra_packages])
    missing = [p for p in extra_packages if _norm(p) not in {_norm(d.metadata["Name"] or "") for d in dists}]
    if missing:
        raise StreamlingError(f"spark.python_packages names {missing}, which are not installed in this Python "
                              f"({sys.executable})", code="python_package_missing",
                              hint="pip install them here, or remove them from spark.python_packages")
    editable = [d for d in dists if _is_editable(d)]
    fixed = [d for d in dists if not _is_editable(d)]
    code = list(_members(editable))
    parts: dict[str, list[tuple[Path, str]] | None] = {
        "deps-" + _digest(*(f"{d.metadata['Name']}=={d.version}" for d in fixed)): None,
    }
    if code:  # its sources change without a version change
        parts["code-" + _digest(*(f"{d.metadata['Name']}=={d.version}" for d in editable),
                                *(f"{rel}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p, rel in code))] = code
    root = cache_dir() / "environments"
    built: dict[str, Path] = {}
    with _LOCK:
        for name, members in parts.items():
            target = root / f"{name}.zip"
            if not target.exists():
                t0 = time.monotonic()
                _write_atomically(target, lambda z, m=members: _write_part(z, m if m is not None else _members(fixed)))
                log.info("packed the job's Python environment's %s (%.0f MB) in %.1f s", target.name,
                         target.stat().st_size / 1e6, time.monotonic() - t0)
            os.utime(target)
            built[name] = target
        text = _LAUNCHER.format(minor=f"{sys.version_info[0]}.{sys.version_info[1]}", full=sys.version.split()[0],
                                marker=_MARKER, parts=" ".join(built), fetch=_FETCH)
        launcher = root / f"launcher-{_digest(text)}.zip"
        if not launcher.exists():
            _write_atomically(launcher, lambda z: _write_launcher(z, text))
        os.utime(launcher)
        _forget_old_builds(root)
    return PackedEnvironment(launcher, built)


def _write_atomically(target: Path, write: Any) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
            write(archive)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def _write_part(archive: zipfile.ZipFile, members: Iterable[tuple[Path, str]]) -> None:
    """Stored, not compressed: packing and unpacking cost little beyond copying, and a part crosses
    the network once per worker host and content."""
    seen: set[str] = set()
    for source, rel in members:
        if rel not in seen:
            seen.add(rel)
            archive.write(source, arcname=rel)


def _write_launcher(archive: zipfile.ZipFile, text: str) -> None:
    """Spark unpacks a zip keeping each file's mode (a ``.tar`` without): the launcher stays
    executable."""
    info = zipfile.ZipInfo(f"bin/{EXECUTOR_PYTHON}")
    info.external_attr = (stat.S_IFREG | 0o755) << 16
    archive.writestr(info, text)
    fetch = resources.files("streamling.runtime").joinpath(_FETCH).read_text()
    archive.writestr(zipfile.ZipInfo(f"bin/{_FETCH}"), fetch)


def _forget_old_builds(root: Path) -> None:
    """Keep the ``KEEP_BUILDS`` newest used builds of each kind; drop the rest (and folders of the
    layout before parts). A driver still serving a dropped part holds it open (``EnvironmentServer``)."""
    kinds: dict[str, list[Path]] = {}
    for entry in root.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif not entry.name.startswith("."):
            kinds.setdefault(entry.name.split("-", 1)[0], []).append(entry)
    for entries in kinds.values():
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP_BUILDS:]:
            old.unlink(missing_ok=True)


class EnvironmentServer:
    """Serves the parts of this process's shipping sessions to their executors over HTTP.

    Every path starts with a random token, and only registered parts are served, each from a file
    descriptor opened at registration (a part dropped from the cache meanwhile still serves). One
    per process: the first shipping session starts it, on ``spark.python_environment_port``."""

    def __init__(self, bind: str, port: int) -> None:
        self.token = secrets.token_urlsafe(18)
        self._files: dict[str, int] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                prefix, _, name = self.path.lstrip("/").partition("/")
                fd = server._files.get(name.removesuffix(".zip")) if secrets.compare_digest(
                    prefix, server.token) and name.endswith(".zip") else None
                if fd is None:
                    self.send_error(404)
                    return
                size = os.fstat(fd).st_size
                self.send_response(200)
                self.send_header("Content-Type", "application/zip")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                self.wfile.flush()
                offset = 0
                while offset < size:
                    sent = os.sendfile(self.connection.fileno(), fd, offset, size - offset)
                    if sent == 0:
                        break
                    offset += sent

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("environment server: " + format, *args)

        try:
            self._http = http.server.ThreadingHTTPServer((bind, port), Handler)
        except OSError as exc:
            raise StreamlingError(f"cannot serve the job's Python environment to executors on {bind}:{port}: {exc}",
                                  code="environment_server",
                                  hint="choose a free spark.python_environment_port (0 picks one)") from exc
        self._http.daemon_threads = True
        self.bind, self.port = bind, int(self._http.server_address[1])
        threading.Thread(target=self._http.serve_forever, name="streamling-environment-server", daemon=True).start()

    def register(self, parts: dict[str, Path]) -> None:
        with self._lock:
            for name, path in parts.items():
                if name not in self._files:
                    self._files[name] = os.open(path, os.O_RDONLY)

    def url(self, host: str) -> str:
        """The parts' base URL for executors that reach the driver at ``host``."""
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/{self.token}/"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()


_SERVER: EnvironmentServer | None = None


def environment_server(bind: str, port: int) -> EnvironmentServer:
    """This process's server, started on first use (restarted on another address or port)."""
    global _SERVER
    with _LOCK:
        if _SERVER is not None and (_SERVER.bind != bind or port not in (0, _SERVER.port)):
            _SERVER.close()
            _SERVER = None
        if _SERVER is None:
            _SERVER = EnvironmentServer(bind, port)
        return _SERVER


def publish(context: Any, packed: PackedEnvironment, port: int) -> None:
    """Serve ``packed`` to the executors of ``context`` (a started SparkContext): the parts over
    HTTP, their base URL as ``streamling_env.url`` in the application's files."""
    from streamling.runtime.jars import cache_dir

    conf = context.getConf()
    host = conf.get("spark.driver.host")
    server = environment_server(conf.get("spark.driver.bindAddress", host), port)
    server.register(packed.parts)
    folder = cache_dir() / "driver-python" / f"url-{os.getpid()}-{context.applicationId}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / URL_FILE).write_text(server.url(host) + "\n")
    context.addFile(str(folder / URL_FILE))
    for stale in folder.parent.glob("url-*"):
        if stale != folder and not process_alive(stale.name.split("-")[1]):
            shutil.rmtree(stale, ignore_errors=True)

