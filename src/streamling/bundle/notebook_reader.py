"""Reading a notebook file into its cells, and finding the notebooks its ``%run`` cells include.

Notebooks: Jupyter ``.ipynb`` (nbformat 4) and Databricks source notebooks (``.py`` whose first line is
``# Databricks notebook source``; cells separated by ``# COMMAND ----------``; ``# MAGIC `` prefixes
stripped, ``# MAGIC`` alone is an empty line; ``# MAGIC %md`` cells are markdown; ``# DBTITLE``
lines ignored). Cells are numbered from 1 in notebook order, markdown cells included, as a person
counts them; an error's location is ``<notebook>: cell N`` plus a line — in an ``.ipynb`` the line
within the cell, in a ``.py`` source notebook the line of the file.

Both the deploy-time compiler (``streamling.bundle.compile``) and a job's driver that runs the
notebook (``streamling.bundle.notebook_job``) read cells here, so they see the same cells, numbered
and located the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from streamling.errors import Location, StreamlingError

DATABRICKS_HEADER = "# Databricks notebook source"
DATABRICKS_SEPARATOR = "# COMMAND ----------"
#: a Databricks SQL source notebook: the same layout with SQL comments
DATABRICKS_SQL_HEADER = "-- Databricks notebook source"
INTERACTIVE = "interactive"
RAISES = "raises-exception"
_TAG_LINE = re.compile(r"^(?:#|--)\s*streamling:\s*(?P<tags>[\w\-, ]+?)\s*$")
#: what a cell's first line says it is (Databricks' language magics); ``None`` for Python and IPython
LANGUAGE_MAGICS = {"%python": "python", "%sql": "sql", "%%sql": "sql", "%sh": "shell", "%run": "run",
                   "%md": "markdown", "%md-sandbox": "markdown", "%pip": "pip", "%scala": "foreign",
                   "%r": "foreign", "%fs": "foreign"}
Language = Literal["python", "sql", "shell", "run", "markdown", "pip", "foreign"]


@dataclass
class Cell:
    """One notebook cell. ``lines`` maps each line of ``source`` to its line in the file (Databricks
    source notebooks; ``None`` for ``.ipynb``, where a location gives the line within the cell)."""

    index: int
    kind: Literal["code", "markdown", "raw"]
    source: str
    tags: list[str] = field(default_factory=list)
    lines: list[int] | None = field(default=None, repr=False, compare=False)
    #: what a code cell without a language magic holds: Python, or SQL in a ``.sql`` source notebook
    default_language: Literal["python", "sql"] = field(default="python", repr=False, compare=False)

    def language(self) -> tuple[Language, str, int]:
        """What the cell runs as, its body without the language magic, and the offset of the body's
        first line in ``source`` (a ``%run`` cell's body is its argument)."""
        lines = self.source.splitlines()
        start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
        if start == len(lines):
            return self.default_language, "", 0
        magic, _, rest = lines[start].strip().partition(" ")
        language = LANGUAGE_MAGICS.get(magic)
        if language is None:
            return self.default_language, self.source, 0
        if language == "run":
            return "run", rest.strip(), start
        body = "\n".join([rest] + lines[start + 1:]) if rest.strip() else "\n".join(lines[start + 1:])
        return cast(Language, language), body + "\n", start if rest.strip() else start + 1

    def line(self, offset: int) -> int:
        """The notebook line of the source's line ``offset`` (0-based)."""
        if self.lines is not None and self.lines:
            return self.lines[min(offset, len(self.lines) - 1)]
        return offset + 1


# --- reading notebooks ----------------------------------------------------------------------------


def read_notebook(path: Path) -> list[Cell]:
    """The cells of an ``.ipynb`` or of a Databricks source notebook (``.py``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise StreamlingError(f"cannot read the notebook: {exc.strerror or exc}", location=Location(str(path)),
                              hint="check the notebook_path") from exc
    if path.suffix == ".ipynb":
        return _read_ipynb(text, path)
    if text.lstrip("\ufeff").startswith(DATABRICKS_HEADER):
        return _read_databricks(text)
    if text.lstrip("\ufeff").startswith(DATABRICKS_SQL_HEADER):
        return _read_databricks(text, comment="--")
    raise StreamlingError("not a notebook: expected a Jupyter .ipynb or a Databricks source notebook "
                          f"(a .py file starting with '{DATABRICKS_HEADER}', or a .sql file starting with "
                          f"'{DATABRICKS_SQL_HEADER}')", location=Location(path.name),
                          hint="export the notebook as .ipynb or as a Databricks source file")


def _tags_from_marker(lines: list[str]) -> tuple[list[str], int]:
    """Tags given by a first line ``# streamling: interactive`` and how many lines to drop."""
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        match = _TAG_LINE.match(line.strip())
        if match:
            return [t.strip() for t in match.group("tags").split(",") if t.strip()], i + 1
        break
    return [], 0


def _read_ipynb(text: str, path: Path) -> list[Cell]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StreamlingError(f"the notebook is not valid JSON: {exc}", location=Location(path.name, exc.lineno),
                              hint="open and save it in Jupyter") from exc
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise StreamlingError("the notebook has no 'cells' list (nbformat 4 expected)", location=Location(path.name))
    if int(data.get("nbformat", 4)) < 4:
        raise StreamlingError(f"nbformat {data.get('nbformat')} notebooks are not supported (4 expected)",
                              location=Location(path.name), hint="save the notebook with a current Jupyter")
    cells: list[Cell] = []
    for index, raw in enumerate(data["cells"], start=1):
        source = raw.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        kind = raw.get("cell_type")
        tags = [str(t) for t in (raw.get("metadata") or {}).get("tags", []) or []]
        if kind == "code":
            marker, _ = _tags_from_marker(source.splitlines())
            tags += [t for t in marker if t not in tags]
        cell_kind = cast(Literal["code", "markdown", "raw"], kind if kind in ("code", "markdown") else "raw")
        cells.append(Cell(index, cell_kind, source, tags))
    return cells


def _read_databricks(text: str, comment: str = "#") -> list[Cell]:
    """A Databricks source notebook; ``comment`` is its language's comment marker (``--`` for SQL)."""
    separator = f"{comment} COMMAND ----------"
    chunks: list[list[tuple[int, str]]] = [[]]
    for number, line in enumerate(text.splitlines()[1:], start=2):
        if line.strip() == separator:
            chunks.append([])
        elif not line.startswith(f"{comment} DBTITLE"):
            chunks[-1].append((number, line))
    cells: list[Cell] = []
    language: Literal["python", "sql"] = "sql" if comment == "--" else "python"
    for chunk in chunks:
        lines = [(n, _unmagic(line, comment)) for n, line in chunk]
        while lines and not lines[0][1].strip():
            lines.pop(0)
        while lines and not lines[-1][1].strip():
            lines.pop()
        if not lines:
            continue
        tags, drop = _tags_from_marker([line for _, line in lines])
        lines = lines[drop:]
        while lines and not lines[0][1].strip():
            lines.pop(0)
        first = lines[0][1].strip() if lines else ""
        if first.split(" ", 1)[0] in ("%md", "%md-sandbox"):
            kind: Literal["code", "markdown", "raw"] = "markdown"
            lines = lines[1:]
        else:
            kind = "code"
        cells.append(Cell(len(cells) + 1, kind, "\n".join(line for _, line in lines) + "\n", tags,
                          [n for n, _ in lines], language))
    return cells


def _unmagic(line: str, comment: str = "#") -> str:
    if line.startswith(f"{comment} MAGIC "):
        return line[len(f"{comment} MAGIC "):]
    return "" if line.rstrip() == f"{comment} MAGIC" else line


def run_arguments(argument: str) -> tuple[str, dict[str, str]]:
    """A ``%run`` line's notebook and its ``$name=value`` arguments (the included notebook's widget
    values, as Databricks passes them)."""
    import shlex

    try:
        words = shlex.split(argument)
    except ValueError as exc:
        raise StreamlingError(f"`%run {clip(argument)}`: {exc}", hint='e.g. %run ./helpers $day="2026-01-01"',
                              code="notebook_not_a_job") from None
    if not words:
        raise StreamlingError("`%run` needs the notebook to include", hint="e.g. %run ./helpers",
                              code="notebook_not_a_job")
    values = {}
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if not name.startswith("$") or not sep or len(name) < 2:
            raise StreamlingError(f"`%run {clip(argument)}`: {word!r} is not an argument",
                                  hint='arguments are $name=value, e.g. %run ./helpers $day="2026-01-01"',
                                  code="notebook_not_a_job")
        values[name[1:]] = value
    return words[0], values


def run_target(folder: Path, argument: str) -> Path:
    """The notebook a ``%run <path> [$name=value …]`` cell includes, relative to ``folder`` (the
    including notebook's); Databricks leaves the extension out, so ``.py``, ``.ipynb`` and ``.sql``
    are tried."""
    target, _ = run_arguments(argument)
    if target.startswith("/"):
        raise StreamlingError(f"`%run {target}` names a workspace path; here a notebook includes files of its bundle "
                              "by relative path", hint="e.g. %run ./helpers", code="notebook_not_a_job")
    base = (folder / target).resolve()
    candidates = [base] if base.suffix in (".py", ".ipynb", ".sql") else [
        base.with_name(base.name + ext) for ext in (".py", ".ipynb", ".sql")]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise StreamlingError(f"`%run {target}`: no notebook {target} next to this one (tried "
                              f"{', '.join(c.name for c in candidates)})", hint="check the path, relative to this "
                              "notebook", code="bundle_missing_file")
    return found


def clip(text: str, limit: int = 60) -> str:
    """``text`` shortened to ``limit`` characters for a message that quotes a cell."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
