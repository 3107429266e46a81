"""The driver JVM's stderr, filtered: its start-up chatter never reaches a user.

PySpark starts the JVM as a child that inherits file descriptor 2. On every start it prints
"WARNING: Using incubator modules…" and "Setting default log level…": noise on a terminal, and a
red box that looks like an error in a notebook cell. While the JVM launches, fd 2 points at a pipe;
a daemon thread forwards what comes through it to the real stderr, minus that chatter, and keeps
the last lines so a JVM that dies (e.g. ``OutOfMemoryError``) can be explained in one line. A side
effect wanted after a SIGKILL of the driver: the orphaned JVM's shutdown traces go nowhere.

One JVM trace is dropped too: Spark's stream execution thread sometimes dies of a
``StackOverflowError`` in ``java.util.regex`` while it unwinds a query that a node's failure already
stopped; the JVM prints ~1,000 ``at Pattern…`` lines for it after streamling's one-line error, which
names the real cause. Its first line is kept in ``recent_lines`` for diagnosis.
"""

from __future__ import annotations

import collections
import os
import re
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CHATTER = re.compile(r"^(WARNING: Using incubator modules: |Setting default log level to |To adjust logging level "
                     r"use sc\.setLogLevel)")
_recent: collections.deque[str] = collections.deque(maxlen=200)
#: the header of an uncaught ``StackOverflowError`` in one of Spark's stream execution threads
STREAM_THREAD_OVERFLOW = re.compile(r'^Exception in thread "stream execution thread for .*" '
                                    r'java\.lang\.StackOverflowError\s*$')


def visible(lines: list[str], dropping: bool) -> tuple[list[str], bool]:
    """The lines to show (chatter and a stream thread's overflow trace left out) and whether the next
    chunk still continues that trace."""
    out = []
    for line in lines:
        if dropping and (line.startswith(("\t", " ")) or not line.strip()):
            continue
        dropping = bool(STREAM_THREAD_OVERFLOW.match(line))
        if not dropping and not CHATTER.match(line):
            out.append(line)
    return out, dropping


def launch_with_filtered_stderr(launch: Callable[[], T]) -> T:
    """Call ``launch`` (which starts the JVM) with fd 2 on a filtering pipe the JVM inherits."""
    try:
        real = os.dup(2)
    except OSError:  # no stderr at all: nothing to filter
        return launch()
    read_end, write_end = os.pipe()
    threading.Thread(target=_forward, args=(read_end, real), name="streamling-jvm-stderr", daemon=True).start()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    try:
        return launch()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write_end)  # the JVM holds its own copy; EOF comes when it exits


def recent_lines() -> list[str]:
    """The JVM's last stderr lines (chatter excluded), oldest first."""
    return list(_recent)


def _forward(read_end: int, real: int) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        dropping = False
        while chunk := pipe.read(65536):
            pending += chunk
            *raw, pending = pending.split(b"\n")
            lines = [line.decode(errors="replace") for line in raw]
            out, dropping = visible(lines, dropping)
            _recent.extend(line for line in lines if STREAM_THREAD_OVERFLOW.match(line))
            _recent.extend(out)
            if out:
                _write(real, "".join(line + "\n" for line in out).encode())
        tail, _ = visible([pending.decode(errors="replace")], dropping) if pending else ([], False)
        if tail:
            _write(real, tail[0].encode())


def _write(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the reader went away: drop, never block the JVM
        pass
