"""The statements of a ``%sql`` cell, and Databricks' parameters bound into them.

A notebook job's driver runs a SQL cell one statement at a time (``split_sql``) with the task's
parameters filled in (``bind_parameters``); both read the text as Spark does, so a ``;`` or ``:name``
inside a string, a quoted identifier or a comment is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping


def _scan(text: str) -> Iterator[tuple[int, int, str]]:
    """``text`` as pieces ``(start, end, kind)``: ``code``, ``quoted`` (a string or a quoted
    identifier, quotes included) or ``comment``; a backslash escapes in strings as Spark reads them."""
    i, start, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`" or text.startswith(("--", "/*"), i):
            if start < i:
                yield start, i, "code"
            if ch in "'\"`":
                j = i + 1
                while j < n and text[j] != ch:
                    j += 2 if text[j] == "\\" and ch != "`" else 1
                yield i, min(j + 1, n), "quoted"
                i = start = min(j + 1, n)
            else:
                end = text.find("\n", i) if ch == "-" else text.find("*/", i + 2)
                end = n if end < 0 else end + (0 if ch == "-" else 2)
                yield i, end, "comment"
                i = start = end
            continue
        i += 1
    if start < n:
        yield start, n, "code"


def split_sql(text: str) -> list[str]:
    """The statements of a SQL cell: split at ``;`` outside quotes, identifiers and comments
    (comments are dropped)."""
    statements, current = [], []
    for start, end, kind in _scan(text):
        if kind == "comment":
            current.append(" ")
            continue
        piece = text[start:end]
        if kind == "quoted":
            current.append(piece)
            continue
        parts = piece.split(";")
        current.append(parts[0])
        for part in parts[1:]:
            statements.append("".join(current))
            current = [part]
    statements.append("".join(current))
    return [s.strip() for s in statements if s.strip()]


def bind_parameters(statement: str, values: Mapping[str, str]) -> str:
    """Databricks' parameters in a SQL statement: ``${name}`` is replaced by the value as text (its
    legacy form, anywhere), and a ``:name`` marker outside strings by the value as a string literal.
    Spark would bind markers itself, but Delta's session extension breaks ``spark.sql(args=…)``."""
    text = _LEGACY_PARAMETER.sub(lambda m: values.get(m.group(1), m.group(0)), statement)
    out = []
    for start, end, kind in _scan(text):
        piece = text[start:end]
        if kind == "code":
            piece = _PARAMETER_MARKER.sub(lambda m: _literal(values[m.group(1)]) if m.group(1) in values
                                          else m.group(0), piece)
        out.append(piece)
    return "".join(out)


def _literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


_LEGACY_PARAMETER = re.compile(r"\$\{(\w+)\}")
_PARAMETER_MARKER = re.compile(r"(?<![:\w]):(\w+)")
