"""Small helpers shared across layers (no Spark)."""

from __future__ import annotations

import datetime as dt
import decimal
import difflib
import math
import os
import re
import socket
from pathlib import Path
from typing import Any

_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration_secs(text: str | float | int) -> float:
    """``"500ms"``, ``"5s"``, ``"2m"``, ``"1h"`` or a bare number of seconds → seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _UNITS | {"": 1.0}:
        raise ValueError(f"cannot read duration {text!r}; write e.g. 500ms, 5s, 2m")
    return float(match.group(1)) * _UNITS.get(match.group(2), 1.0)


def did_you_mean(word: str, choices: list[str], fmt: str = "'{}'", cutoff: float = 0.6) -> str:
    """`` (did you mean 'a', 'b'?)`` for the choices close to ``word``, or nothing."""
    close = difflib.get_close_matches(word, choices, n=3, cutoff=cutoff)
    return f" (did you mean {', '.join(fmt.format(c) for c in close)}?)" if close else ""


def csv_list(value: Any) -> Any:
    """``"a, b"`` → ``["a", "b"]`` (Streamling's id and column lists accept a comma-separated string);
    anything else unchanged, for the model to check."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def process_alive(pid: int | str) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, a process that exited but was not reaped
    yet, does not)."""
    try:
        state = Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, ValueError):
        return False
    return state not in ("Z", "X")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the kernel says is free on ``host`` now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


_MAX_TEXT = 200


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON a browser reads back exactly: datetimes, decimals and bytes become text,
    non-finite floats and integers beyond 2**53 too (JavaScript numbers would round them)."""
    if value is None or isinstance(value, bool | str):
        return value if not isinstance(value, str) or len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + "…"
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        text = "0x" + raw[:32].hex()
        return text + "…" if len(raw) > 32 else text
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, decimal.Decimal | dt.timedelta):
        return str(value)
    if depth < 6 and isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if depth < 6 and isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, depth + 1) for v in value]
    return str(value)[:_MAX_TEXT]


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` readable by its owner only (0600), atomically: a reader sees the
    old file or the new one, never a part (secret scopes, a store's credentials)."""
    import threading

    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    tmp.replace(path)
