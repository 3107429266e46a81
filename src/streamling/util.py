"""Small helpers shared across layers (no Spark)."""

from __future__ import annotations

import difflib
import re

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
