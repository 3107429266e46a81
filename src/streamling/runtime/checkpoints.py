"""Which checkpoint a flow uses: the state backend decides what a restart reads.

Streamling's state backend holds the sources' positions. ``Sqlite`` and ``Postgres`` keep them, so
a new run resumes where the last finalized epoch ended; ``InMemory`` keeps nothing past the process,
so every run reads its sources again from ``starting_offsets``. Here the positions live in Spark's
checkpoint, so the backend chooses the checkpoint:

- a durable backend: ``<state_dir>/<application_id>/<flow>/``, the same folder on every run;
- ``InMemory``: ``<state_dir>/<application_id>/<flow>/process-<id>/``, one per process. Its name is
  kept in the in-memory backend, so runs in one process (a notebook's stop and run, a warm driver's
  redeploy, a query restarted after an outage) resume it, and the next process starts over with
  fresh sink tokens (a new run's epoch 0 is never mistaken for an epoch already written). The folder
  is removed when the process exits; one left by a killed process is removed by the next process of
  the same host that starts the flow.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamling import storage

if TYPE_CHECKING:
    from streamling.state.base import StateBackend

log = logging.getLogger(__name__)

PROCESS_PREFIX = "process-"
OWNER_FILE = "owner.json"
_KEY = "streamling:checkpoint:"
_mine: set[str] = set()
_lock = threading.Lock()


@dataclass(frozen=True)
class Placement:
    """Where a flow's checkpoint folder is and whether a later run may resume it."""

    root: str
    #: the backend keeps positions between runs (``Sqlite``, ``Postgres``)
    durable: bool
    backend: str


def place(base: str, state: StateBackend | None, store: storage.Storage) -> Placement:
    """The folder of a flow's checkpoint under ``base`` (``<state_dir>/<application_id>/<flow>``)."""
    backend = type(state).__name__.removesuffix("StateBackend") if state is not None else "none"
    if state is None or state.durable:
        return Placement(base, True, backend)
    key = _KEY + base  # per folder: a process may run the application under several state_dirs
    recorded = state.get(key)
    if recorded is not None and isinstance(recorded.get("folder"), str):
        return Placement(storage.join(base, recorded["folder"]), False, backend)
    folder = f"{PROCESS_PREFIX}{uuid.uuid4().hex[:12]}"
    root = storage.join(base, folder)
    _remove_abandoned(base, store)
    store.mkdirs(root)
    store.write_text(storage.join(root, OWNER_FILE), json.dumps(_owner()))
    state.put(key, {"folder": folder})
    if storage.is_local(root):
        with _lock:
            if not _mine:
                atexit.register(_remove_mine)
            _mine.add(str(storage.local_path(root)))
    return Placement(root, False, backend)


def _owner() -> dict[str, object]:
    return {"host": _host(), "pid": os.getpid(), "started": _start_ticks(os.getpid())}


def _host() -> str:
    """This host as far as process ids go: its name and its pid namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}|{namespace}"


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), so a reused pid is not taken for it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(owner: dict[str, object]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return True  # cannot tell: keep it
    started = _start_ticks(pid)
    return started is not None and started == owner.get("started", started)


def _remove_abandoned(base: str, store: storage.Storage) -> None:
    """Folders of processes of this host that ended without removing theirs (killed, crashed)."""
    try:
        names = [n for n in store.list_names(base) if n.startswith(PROCESS_PREFIX)]
    except FileNotFoundError:
        return
    host = _host()
    for name in names:
        folder = storage.join(base, name)
        try:
            owner = json.loads(store.read_text(storage.join(folder, OWNER_FILE)))
        except (FileNotFoundError, ValueError):
            continue  # being created by another process, or not ours to judge
        if isinstance(owner, dict) and owner.get("host") == host and not _alive(owner):
            log.info("removing %s, the in-memory checkpoint of a process that has ended", folder)
            store.delete(folder)


def _remove_mine() -> None:
    """At exit: this process's in-memory checkpoints can never be resumed."""
    with _lock:
        folders = sorted(_mine)
        _mine.clear()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
