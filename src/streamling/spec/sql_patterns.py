r"""DataFusion's text patterns in Java's syntax, which Spark's functions take: chrono (strftime)
datetime formats become Spark datetime patterns, and regular expression replacements (``\1``,
``$1``, ``${1}``) become Java's ``$1``.
"""

from __future__ import annotations

import re

from streamling.spec.sql_calls import Unfaithful

_CHRONO: dict[str, str] = {
    "Y": "yyyy", "y": "yy", "m": "MM", "d": "dd", "H": "HH", "I": "hh", "M": "mm", "S": "ss",
    "p": "a", "b": "MMM", "h": "MMM", "B": "MMMM", "a": "EEE", "A": "EEEE", "j": "DDD",
    "f": "SSSSSSSSS", "3f": "SSS", "6f": "SSSSSS", "9f": "SSSSSSSSS", ".3f": ".SSS", ".6f": ".SSSSSS",
    ".9f": ".SSSSSSSSS", "z": "xx", ":z": "xxx", "T": "HH:mm:ss", "D": "MM/dd/yy", "F": "yyyy-MM-dd",
    "R": "HH:mm", "%": "%",
}


def java_datetime_pattern(chrono: str) -> str:
    """A strftime-style format (what DataFusion's to_char/to_timestamp take) as a Spark pattern."""
    out: list[str] = []
    literal: list[str] = []

    def flush() -> None:
        if literal:
            text = "".join(literal).replace("'", "''")
            out.append(f"'{text}'" if re.search(r"[A-Za-z']", text) else text)
            literal.clear()

    i = 0
    while i < len(chrono):
        if chrono[i] != "%":
            literal.append(chrono[i])
            i += 1
            continue
        spec = next((s for s in sorted(_CHRONO, key=len, reverse=True) if chrono.startswith(s, i + 1)), None)
        if spec is None:
            raise Unfaithful(f"format specifier '{chrono[i:i + 2]}' has no Spark equivalent; "
                             f"use %Y %m %d %H %M %S %.3f %z and literal text")
        flush()
        out.append(_CHRONO[spec] if spec != "%" else "%")
        i += 1 + len(spec)
    flush()
    return "".join(out)


def java_replacement(text: str, shift: int) -> str:
    r"""DataFusion replacement (``\1`` or ``$1``/``${1}`` for groups) → Java's (``$1``), group numbers
    shifted by ``shift``; other backslashes and dollars become literal."""
    out: list[str] = []
    i = 0
    while i < len(text):
        m = re.match(r"\\(\d)|\$(\d+)|\$\{(\d+)\}", text[i:])
        if m:
            group = int(next(g for g in m.groups() if g is not None))
            out.append(f"${{{group + shift}}}" if group or shift else "$0")
            i += m.end()
            continue
        ch = text[i]
        out.append("\\" + ch if ch in "\\$" else ch)
        i += 1
    return "".join(out)
