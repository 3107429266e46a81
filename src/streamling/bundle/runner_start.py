"""Whether a job runner supervises a target root, and starting one: what every ``bundle`` command
that files a request calls first.

With the SQLite store (one host) a runner holds an OS lock on the root's ``runner.lock`` for its whole
life (``runner_lock``), so there is never a second one and a dead runner's lock is free at once; with
a shared store, the runner holding the store's lease (on any host) supervises.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from streamling.bundle.store import Store
from streamling.bundle.workspace import Workspace


def runner_running(ws: Workspace, store: Store | None = None) -> bool:
    """True when a runner supervises this root: it holds the shared store's lease (on any host) or,
    with the SQLite store, this root's lock."""
    if ws.store_settings().store != "sqlite":
        if store is not None:
            return store.lease().held
        own = ws.open_store()
        try:
            return own.lease().held
        finally:
            own.close()
    if not ws.runner_lock.exists():
        return False
    with open(ws.runner_lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def ensure_runner(ws: Workspace, timeout_secs: float = 15, store: Store | None = None) -> None:
    """Start this root's runner in the background unless one runs; it outlives the calling command.

    With a shared store, a runner on any host holding the lease counts: none is started here."""
    if runner_running(ws, store):
        return
    ws.root.mkdir(parents=True, exist_ok=True)
    with open(ws.runner_log, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "streamling.bundle.runner", str(ws.root)], stdout=out,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        if runner_running(ws, store):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the job runner did not start; see {ws.runner_log}")


@contextmanager
def runner_lock(ws: Workspace) -> Iterator[bool]:
    """Hold this root's runner lock (SQLite store) while the block runs, with this process's pid in
    the lock file; False, and nothing held, when another runner holds it."""
    with open(ws.runner_lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield True
