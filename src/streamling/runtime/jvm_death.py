"""A JVM that ran out of memory, or died, told in one line with its likely cause.

An ``OutOfMemoryError`` reaches Python as a py4j error carrying dozens of Java frames; a JVM that
died (the heap exhausted in a thread Spark does not survive, or the kernel's OOM killer) leaves py4j
saying only that the gateway stopped answering. Neither names a cause a user can act on, so this
module reads the error chain and, for a dead JVM, the last lines the JVM wrote to stderr
(``jvm_output.recent_lines``), and answers with what happened and what to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamling.errors import chain_text
from streamling.runtime.jvm_output import recent_lines

OOM = "java.lang.OutOfMemoryError"
MEMORY_HINT = ("likely a record or field too large for the JVM's heap: raise spark.driver.memory (spark.conf in the "
               "config), or lower the batch size (rows_per_batch, max_offsets_per_trigger) or "
               "file_source.max_field_chars so the culprit is reported by name")
KILLED_HINT = ("it wrote no error, so it was likely killed from outside (the kernel's OOM killer or a container "
               "memory limit): give the process more memory or lower spark.driver.memory")
# How py4j words a gateway whose JVM is gone.
_GONE = ("Answer from Java side is empty", "Error while sending or receiving", "Error while receiving",
         "Connection refused", "Java side closed the connection", "gateway_client is None")
_CAUSE = re.compile(r"(java\.lang\.\w+Error(?::[^\n]*)?|There is insufficient memory[^\n]*|"
                    r"A fatal error has been detected[^\n]*|SIGSEGV[^\n]*)")


@dataclass(frozen=True)
class JvmFailure:
    what: str
    hint: str


def jvm_failure(exc: BaseException) -> JvmFailure | None:
    """What ``exc`` says about the JVM: out of memory, dead, or nothing (``None``)."""
    text = chain_text(exc)
    found = _CAUSE.search(text)
    if found is not None and OOM in found.group(1):
        return JvmFailure(f"the Spark JVM ran out of memory ({found.group(1).strip()})", MEMORY_HINT)
    if not _gateway_gone(exc):
        return None
    cause = last_cause(recent_lines())
    if cause is None:
        return JvmFailure("the Spark driver JVM died", KILLED_HINT)
    hint = MEMORY_HINT if OOM in cause or "insufficient memory" in cause else \
        "run with --debug for the JVM's last lines"
    return JvmFailure(f"the Spark driver JVM died ({cause})", hint)


def last_cause(lines: list[str]) -> str | None:
    """The most recent fatal error among the JVM's stderr lines."""
    for line in reversed(lines):
        found = _CAUSE.search(line)
        if found is not None:
            return found.group(1).strip()
    return None


def _gateway_gone(exc: BaseException) -> bool:
    """A py4j error saying the JVM no longer answers (never a connector's own "connection refused")."""
    try:
        from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError
    except ImportError:  # no PySpark installed: no JVM either
        return False
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, Py4JNetworkError):
            return True
        # A Java exception is an answer: only a bare py4j error may mean that nobody answers.
        if isinstance(current, Py4JError) and not isinstance(current, Py4JJavaError) and \
                (any(m in str(current) for m in _GONE) or jvm_exited()):
            return True
        todo.extend([current.__cause__, current.__context__])
    return False


def jvm_exited(wait_secs: float = 2.0) -> bool:
    """Whether the JVM PySpark launched for this process has exited. Its socket closes a moment
    before the process can be reaped, so a lost connection waits briefly for the exit."""
    import subprocess

    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return False
    try:
        proc.wait(timeout=wait_secs)
    except subprocess.TimeoutExpired:
        return False
    return True
