"""One error type for everything a user can see.

A ``StreamlingError`` says what was being attempted, on which node, and what to do. Two flags
drive behaviour elsewhere: ``user`` (a problem in the pipeline, config or data: ``--validate``
reports it as ``is_valid: false``, and no Java stack trace is shown) and ``retriable`` (a
transient failure such as a refused connection: the flow retries the step with backoff; nodes only classify).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Location:
    """Where in the pipeline file a problem sits (``sources.orders.topic``, line 7)."""

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path} (line {self.line})" if self.line else self.path


class StreamlingError(Exception):
    """A failure with a human message, a node, flags and a context chain."""

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        node_kind: str | None = None,
        user: bool = True,
        retriable: bool = False,
        code: str = "error",
        hint: str | None = None,
        location: Location | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.node = node
        self.node_kind = node_kind
        self.user = user
        self.retriable = retriable
        self.code = code
        self.hint = hint
        self.location = location
        self.context: list[str] = []
        if cause is not None:
            self.__cause__ = cause

    @property
    def internal(self) -> bool:
        return not self.user

    def add_context(self, what: str) -> StreamlingError:
        """Record what the caller was doing; printed as a ``while …`` chain."""
        self.context.append(what)
        return self

    def headline(self) -> str:
        """One line: ``postgres sink 'out': cannot connect … — start Postgres or fix host``."""
        prefix = ""
        if self.node:
            prefix = f"{self.node_kind + ' ' if self.node_kind else ''}'{self.node}': "
        where = f" [{self.location}]" if self.location else ""
        hint = f" — {self.hint}" if self.hint else ""
        return f"{prefix}{self.message}{where}{hint}"

    def __str__(self) -> str:
        lines = [self.headline()]
        lines.extend(f"  while {c}" for c in self.context)
        return "\n".join(lines)

    def describe(self, debug: bool = False) -> str:
        """One line: what failed, where, and what to do. With ``debug`` the cause chain follows
        (``Caused by:``, Java traces included): the chain's intermediate links name the nodes the
        failure passed through (a sink collecting a transform's rows), which misleads without the
        whole picture."""
        out = [str(self)]
        cause = self.__cause__ if debug else None
        while cause is not None:
            out.append(f"Caused by: {type(cause).__name__}: {cause}")
            cause = cause.__cause__
        return "\n".join(out)


class ValidationError(StreamlingError):
    """Every problem found in a pipeline at once, each with its YAML path and line."""

    def __init__(self, problems: Sequence[StreamlingError]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        body = "\n".join(f"  - {p.headline()}" for p in self.problems)
        super().__init__(f"pipeline is invalid ({count} problem{'s' if count != 1 else ''}):\n{body}",
                         code="invalid_pipeline")

    def headline(self) -> str:
        return self.message


def first_line(value: BaseException | str) -> str:
    """The first non-empty line, stripped: what a person reads of an error whose later lines are
    Java stack frames, libpq's hints or a worker's traceback. An exception without a message gives
    its type's name; empty text gives ""."""
    for line in str(value).splitlines():
        if line.strip():
            return line.strip()
    return type(value).__name__ if isinstance(value, BaseException) else ""


_RETRIABLE_ERRNOS = {
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ENOTCONN,
    errno.ETIMEDOUT, errno.EINTR, errno.EPIPE, errno.EHOSTUNREACH,
}


def is_retriable(exc: BaseException) -> bool:
    """Transient by nature: connection refused/reset/aborted, timeouts, interrupted calls."""
    if isinstance(exc, StreamlingError):
        return exc.retriable
    if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
        return True
    if isinstance(exc, OSError) and exc.errno in _RETRIABLE_ERRNOS:
        return True
    failure = node_failure_from_text(chain_text(exc))  # classified by a node on an executor
    return failure is not None and failure.retriable


def chain_text(exc: BaseException | None) -> str:
    """Every message in an exception chain, Spark's JVM causes and stack text included: the failing
    record or node is often named only deep inside (a worker's ``NodeFailure``, a poison marker)."""
    parts: list[str] = []
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        current = todo.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        parts.append(_text(current))
        trace = getattr(current, "_stackTrace", None)
        if isinstance(trace, str):
            parts.append(trace)
        todo.extend([current.__cause__, current.__context__, getattr(current, "_cause", None)])
    return "\n".join(parts)


def _text(exc: BaseException) -> str:
    """``str(exc)``, which for a py4j error asks the JVM: once the gateway is gone (a stop, a dead
    JVM) that raises, and the error path must not crash on top of the error it reports."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - any failure to render is replaced by the type and args
        return f"{type(exc).__name__}{exc.args!r}"


def java_message(exc: BaseException) -> str:
    """A readable one-liner for an exception that may come from the JVM through py4j."""
    getter = getattr(exc, "getMessage", None)
    if callable(getter):
        try:
            msg = getter()
            if msg:
                return first_line(str(msg))
        except Exception:  # noqa: BLE001 - the message is best effort
            pass
    return first_line(exc)


def _unquote(name: str) -> str:
    return ".".join(part.strip("`") for part in name.split("`.`")).strip("`")


def spark_sql_message(exc: BaseException, columns: Sequence[str] | None = None) -> str:
    """An analysis or parse error of Spark SQL in the user's terms: ``column 'versoin' does not
    exist (did you mean 'version'?)`` instead of ``[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column …
    with name `versoin` cannot be resolved. Did you mean one of the following? […]. SQLSTATE: 42703;
    line 1 pos 11``. ``columns``: the names the query can use, suggested instead of Spark's guesses."""
    import re

    from streamling.util import did_you_mean

    condition = str(getattr(exc, "getCondition", getattr(exc, "getErrorClass", lambda: ""))() or "")
    params = getattr(exc, "getMessageParameters", lambda: None)() or {}
    if condition.startswith("UNRESOLVED_COLUMN") and params.get("objectName"):
        name = _unquote(str(params["objectName"])).split(".")[-1]
        proposal = [_unquote(p.strip()).split(".")[-1] for p in str(params.get("proposal") or "").split(",")
                    if p.strip()]
        return f"column '{name}' does not exist{did_you_mean(name, list(columns) if columns is not None else proposal)}"
    if condition.startswith("UNRESOLVED_ROUTINE") and params.get("routineName"):
        return f"function '{_unquote(str(params['routineName']))}' does not exist"
    if condition.startswith("TABLE_OR_VIEW_NOT_FOUND") and params.get("relationName"):
        return f"table '{_unquote(str(params['relationName']))}' does not exist: name an upstream node in FROM"
    text = first_line(exc)
    text = re.sub(r"^\[[A-Z_.]+\]\s*", "", text)
    text = re.sub(r"\s*SQLSTATE: \w+\.?", "", text)
    text = re.sub(r";?\s*\(?line \d+,? pos \d+\)?", "", first_line(text))
    return text.strip().rstrip(".;")


# Errors raised inside Spark's Python workers (mapInArrow operators, data sources) reach the
# driver only as text inside a JVM exception. A marked line carries the node and the message
# through, so the runtime can report "script transform 'x': …" instead of a worker traceback.
_NODE_ERROR = "streamling-node-error"
_END = "\x1e]"  # a control character no message contains, so "]" inside messages is kept


class NodeFailure(RuntimeError):
    """Raise from executor-side code; the driver turns it back into a ``StreamlingError``, still
    classified: a transient failure (a source's server briefly gone) is retried by the flow."""

    def __init__(self, node: str, node_kind: str, message: str, hint: str | None = None,
                 retriable: bool = False) -> None:
        fields = [node, node_kind, message.replace("\n", " "), hint or "", "retriable" if retriable else ""]
        payload = "\x1f".join(fields)
        super().__init__(f"{_NODE_ERROR}[{payload}{_END}")

    @classmethod
    def of(cls, err: StreamlingError) -> NodeFailure:
        """``err`` as raised on an executor: node, message, hint and classification kept."""
        return cls(err.node or "", err.node_kind or "", err.message, err.hint, err.retriable)


def node_failure_from_text(text: str) -> StreamlingError | None:
    """Find a ``NodeFailure`` in an exception's text (e.g. a PythonException from a worker)."""
    start = text.find(f"{_NODE_ERROR}[")
    if start < 0:
        return None
    end = text.find(_END, start)
    body = text[start + len(_NODE_ERROR) + 1:end if end > 0 else None]
    parts = body.split("\x1f")
    if len(parts) != 5:
        return None
    node, node_kind, message, hint, retriable = parts
    return StreamlingError(message, node=node or None, node_kind=node_kind or None, hint=hint or None,
                           code="node_transient" if retriable else "node_failed", retriable=bool(retriable))
