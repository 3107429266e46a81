"""Fetch one part of a job's Python environment into a worker host's cache, and unpack it there.

Run by the executors' launcher (``streamling-python``) with the worker's own Python (the driver's
minor version) before any of the job's packages are importable: standard library only. Arguments:
the host's cache folder, the part's name (``deps-<key>`` or ``code-<key>``, unique per content) and
the executor's files folder, which holds ``streamling_env.url`` (where the driver serves the parts).
One process per host fetches a part; the others wait on its lock and find it complete. The part
lands under its final name only once whole, so a process killed half-way leaves nothing a later one
would trust, and the next fetch of the part clears what it left.

The launcher runs this each time it starts a Python, which marks the part used (under its lock).
A new part makes room: of each kind, the ``KEEP`` most recently used parts stay, and so does any
part a live process of this user still runs with (it is on that process's ``PYTHONPATH``); the
others are removed, under their lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import sys
import urllib.request
import zipfile

MARKER = "streamling: worker host"
#: parts of each kind (deps, code) a host keeps besides those in use
KEEP = 3


def fetch(cache: str, part: str, files: str) -> None:
    os.makedirs(cache, exist_ok=True)
    dest = os.path.join(cache, part)
    with open(dest + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(dest, ".complete")):
            os.utime(os.path.join(dest, ".complete"))  # used now: the most recent of its kind, kept
            return
        with open(os.path.join(files, "streamling_env.url")) as f:
            url = f.read().strip() + part + ".zip"
        # One name per part, not per process: under the lock only one process works on it, and what
        # a process killed half-way left (up to a part's size) is cleared by the next one.
        tmp = f"{dest}.partial"
        archive = tmp + ".zip"
        for leftover in (dest, tmp):
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as out:
                expected = int(response.headers.get("Content-Length", "-1"))
                shutil.copyfileobj(response, out, 1 << 20)
                got = out.tell()
            if 0 <= expected != got:
                raise OSError(f"the driver sent {got} of {expected} bytes of {url}")
            with zipfile.ZipFile(archive) as packed:
                for info in packed.infolist():
                    path = packed.extract(info, tmp)
                    mode = (info.external_attr >> 16) & 0o777
                    if mode and not info.is_dir():
                        os.chmod(path, mode)
            open(os.path.join(tmp, ".complete"), "w").close()
            os.rename(tmp, dest)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(f"cannot fetch {part} from {url} into {cache}: {exc}") from exc
        finally:
            if os.path.exists(archive):
                os.remove(archive)
    prune(cache, part.split("-", 1)[0])


def prune(cache: str, kind: str, keep: int = KEEP) -> list[str]:
    """Remove the parts of ``kind`` beyond the ``keep`` most recently used that no live process
    runs with; the names removed. Best effort: a part it cannot lock or remove stays."""
    parts = []
    for name in os.listdir(cache):
        marker = os.path.join(cache, name, ".complete")
        if name.startswith(kind + "-") and os.path.isfile(marker):
            parts.append((os.path.getmtime(marker), name))
    parts.sort(reverse=True)
    in_use = _paths_in_use()
    removed = []
    for _, name in parts[keep:]:
        folder = os.path.join(cache, name)
        if folder in in_use:
            continue
        try:
            with open(folder + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a launcher fetching it now: leave it
                os.remove(os.path.join(folder, ".complete"))  # no launcher trusts it from here on
                shutil.rmtree(folder, ignore_errors=True)
            os.remove(folder + ".lock")
            removed.append(name)
        except OSError:
            continue
    return removed


def _paths_in_use() -> set[str]:
    """Every ``PYTHONPATH`` entry of this user's live processes (what their imports may still read)."""
    used: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for entry in environ:
            if entry.startswith(b"PYTHONPATH="):
                used.update(os.fsdecode(entry[len(b"PYTHONPATH="):]).split(os.pathsep))
    return used


def main(argv: list[str]) -> int:
    cache, part, files = argv
    try:
        fetch(cache, part, files)
    except Exception as exc:
        sys.stderr.write(f"{MARKER} {socket.gethostname()} {exc}: check that every worker reaches the driver's "
                         "spark.driver.host on the port of spark.python_environment_port, and has room in "
                         f"{cache} (or point spark.executorEnv.STREAMLING_WORKER_CACHE elsewhere)\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
