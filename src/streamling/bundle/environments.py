"""What a job task's Python needs besides streamling: its wheels, PyPI packages and requirements.

Databricks installs a task's ``libraries`` (``whl``, ``pypi``, ``requirements``) and its job
environment's ``dependencies`` on its cluster; here ``deploy`` first builds the bundle's
``artifacts`` (wheels) and then, for each distinct set of requirements, a virtual environment of its
own under ``$STREAMLING_CACHE_DIR/task-envs/<content key>/`` — built once and reused by every
deployment that asks for the same content (wheel files by their bytes). It never installs into the
environment streamling itself runs from: the task environment sees streamling's packages through a
``.pth`` line, and what the task asks for is installed over them in its own site-packages (a pinned
version wins for that task only). The task's driver runs on that environment's interpreter, and on a
loopback cluster so do its executors; on several hosts the shipped environment (``runtime.environment``)
packs the driver's distributions, these included.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from streamling.errors import StreamlingError
from streamling.runtime.environment import LAYER_PTH

if TYPE_CHECKING:
    from streamling.bundle.model import Artifact

log = logging.getLogger("streamling.bundle.environments")

#: the command that builds a wheel when an artifact names none (Databricks' templates use uv or build)
DEFAULT_BUILD = "{python} -m pip wheel --quiet --no-deps --wheel-dir dist ."


def build_artifacts(artifacts: list[Artifact]) -> list[Path]:
    """Run each artifact's build in its folder; the wheels it made (its ``files``)."""
    made: list[Path] = []
    for artifact in artifacts:
        command = artifact.build or DEFAULT_BUILD.format(python=shlex.quote(sys.executable))
        env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        log.info("building artifact '%s' in %s: %s", artifact.name, artifact.path, command)
        done = subprocess.run(command, shell=True, cwd=artifact.path, env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise StreamlingError(f"artifact '{artifact.name}': `{command}` failed in {artifact.path} (exit "
                                  f"{done.returncode}): {tail}", code="artifact_build_failed",
                                  hint="run the build there by hand, fix it, and deploy again")
        files = [Path(f) for pattern in artifact.files for f in sorted(glob.glob(pattern))]
        if not files:
            raise StreamlingError(f"artifact '{artifact.name}': the build made no file matching "
                                  f"{', '.join(artifact.files)}", code="artifact_build_failed",
                                  hint="point artifacts.<name>.files at the wheels the build writes")
        made.extend(files)
    return made


def _resolve(requirements: list[str]) -> list[str]:
    """pip arguments for the requirements: wheel globs become the newest matching file."""
    args: list[str] = []
    for item in requirements:
        if item.startswith("-r "):
            path = item[3:].strip()
            if not Path(path).is_file():
                raise StreamlingError(f"requirements file {path} does not exist", code="bundle_missing_file")
            args += ["-r", path]
        elif " --index-url " in item:
            package, _, url = item.partition(" --index-url ")
            args += [package.strip(), "--extra-index-url", url.strip()]
        elif item.startswith("/"):
            matches = sorted(glob.glob(item), key=os.path.getmtime)
            if not matches:
                raise StreamlingError(f"no wheel matches {item}", code="bundle_missing_file",
                                      hint="build it with the bundle's artifacts (deploy builds them first), or fix "
                                           "the path")
            args.append(matches[-1])
        else:
            args.append(item)
    return args


def file_digest(path: Path) -> bytes:
    """A wheel's digest is its members' names and bytes: a rebuild of the same sources (new zip
    timestamps) keeps its environment and leaves running tasks alone."""
    if path.suffix != ".whl":
        return hashlib.sha256(path.read_bytes()).digest()
    import zipfile

    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(path) as wheel:
            for name in sorted(wheel.namelist()):
                digest.update(name.encode() + b"\0" + hashlib.sha256(wheel.read(name)).digest())
    except zipfile.BadZipFile as exc:
        raise StreamlingError(f"{path} is not a wheel ({exc})", code="libraries_failed",
                              hint="rebuild it (deploy builds the bundle's artifacts), or fix the library path"
                              ) from None
    return digest.digest()


def _key(args: list[str]) -> str:
    digest = hashlib.sha256(f"{sys.version}\0{sys.prefix}".encode())
    for arg in args:
        is_file = arg.startswith("/") and Path(arg).is_file()
        digest.update(b"\0" + (Path(arg).name if is_file else arg).encode())
        if is_file:
            digest.update(file_digest(Path(arg)))
    return digest.hexdigest()[:16]


def content_key(requirements: list[str]) -> str | None:
    """The key of the environment ``requirements`` need (what the task's fingerprint holds), None when
    a wheel is not built yet or a requirements file is missing."""
    try:
        args = _resolve(requirements)
    except StreamlingError:
        return None
    return _key(args + [Path(args[i + 1]).read_text() for i, arg in enumerate(args[:-1]) if arg == "-r"])


def task_python(requirements: list[str]) -> str | None:
    """The interpreter of the environment holding ``requirements`` over streamling's (built now if
    missing); None when there are none (the task runs on streamling's own interpreter)."""
    if not requirements:
        return None
    from streamling.runtime.jars import cache_dir

    args = _resolve(requirements)
    home = cache_dir() / "task-envs"
    home.mkdir(parents=True, exist_ok=True)
    key = content_key(requirements)  # a requirements file's content is part of it, as a wheel's bytes are
    assert key is not None
    target = home / key
    python = target / "bin" / "python"
    if (target / ".complete").exists():
        return str(python)
    with open(home / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return str(python)
        partial = home / f"{key}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(partial)], check=True,
                       capture_output=True)
        site = Path(sysconfig.get_path("purelib", vars={"base": str(partial), "platbase": str(partial)}))
        base = sysconfig.get_path("purelib")
        # streamling's own packages (and its editable sources' finders) under the task's own
        (site / LAYER_PTH).write_text(f"import site; site.addsitedir({base!r})\n")
        log.info("building the task environment %s: pip install %s", key, " ".join(args))
        done = subprocess.run([sys.executable, "-m", "pip", "--python", str(partial / "bin" / "python"), "install",
                               "--quiet", "--no-input", "--disable-pip-version-check", *args],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            tail = "\n".join(done.stderr.strip().splitlines()[-4:])
            raise StreamlingError(f"cannot install the task's libraries ({' '.join(args)}): {tail}",
                                  code="libraries_failed", hint="check the package names and versions, and that "
                                  "the package index is reachable from this host")
        partial.rename(target)
        (target / ".complete").write_text(" ".join(args) + "\n")
    return str(python)


def on_this_host(requirements: list[str], bundle_root: str, files: Path) -> list[str]:
    """A deployed task's requirements as this host finds them: a wheel or requirements file of the
    bundle's folder on the deploying host is the same file in this host's copy of the bundle files
    (``workspace.file_path``; a root on an object store fetches them)."""
    prefix = bundle_root.rstrip("/") + "/"

    def here(path: str) -> str:
        return str(files / path[len(prefix):]) if path.startswith(prefix) else path

    return [f"-r {here(item[3:].strip())}" if item.startswith("-r ") else here(item) for item in requirements]


def main(argv: list[str] | None = None) -> int:
    """``python -m streamling.bundle.environments REQUIREMENTS_JSON -- PYTHON ARGS…``: build (or find)
    the environment of the requirements on this host, then become its interpreter (in PYTHON's place)
    running ARGS. The runner launches a task this way when the deploying host's environment is not
    here: the build (pip, possibly minutes) runs in the task's own process, never in the runner's
    supervision loop."""
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: python -m streamling.bundle.environments REQUIREMENTS_JSON -- PYTHON ARGS…\n")
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        python = task_python(list(json.loads(args[0]))) or sys.executable
    except StreamlingError as exc:
        log.error("the task's environment cannot be built on this host: %s", exc.headline())
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [python, *args[3:]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
