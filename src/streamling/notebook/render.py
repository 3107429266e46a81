"""Static pictures for notebook outputs: the DAG as SVG, Arrow tables and debug diffs as HTML.

Each result object carries ``text/plain`` next to its HTML/SVG, so headless runs (nbval, jobs)
keep a readable output.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

KIND_COLOURS = {"source": "#e3f2fd", "transform": "#fff8e1", "sink": "#e8f5e9"}
BOX_W, LINE_H, GAP_X, GAP_Y, PAD = 230, 15, 60, 24, 8


def dag_depths(nodes: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Each node's column in a left-to-right DAG picture: the longest path from a source."""
    depth: dict[str, int] = {}

    def of(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name in depth:
            return depth[name]
        ups = [u for u in nodes[name].get("upstream", []) if u in nodes and u not in seen]
        depth[name] = 0 if not ups else 1 + max(of(u, seen | {name}) for u in ups)
        return depth[name]

    for name in nodes:
        of(name)
    return depth


def dag_svg(description: dict[str, Any], max_schema_lines: int = 8) -> str:
    """Nodes in columns by depth (sources left, sinks right), each with its type and schema."""
    nodes: dict[str, dict[str, Any]] = description["nodes"]
    depth = dag_depths(nodes)
    columns: dict[int, list[str]] = {}
    for name in nodes:
        columns.setdefault(depth[name], []).append(name)
    boxes: dict[str, tuple[float, float, float]] = {}
    height = 0.0
    for col, names in sorted(columns.items()):
        y = 10.0
        for name in names:
            schema = nodes[name].get("schema") or []
            lines = 2 + min(len(schema), max_schema_lines) + (1 if len(schema) > max_schema_lines else 0)
            h = float(lines * LINE_H + 2 * PAD)
            boxes[name] = (10 + col * (BOX_W + GAP_X), y, h)
            y += h + GAP_Y
        height = max(height, y)
    width = float(20 + (max(columns) + 1) * (BOX_W + GAP_X) - GAP_X) if columns else 100.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             f'font-family="monospace" font-size="11">',
             '<defs><marker id="sl-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>']
    for name, info in nodes.items():
        x, y, h = boxes[name]
        for up in info.get("upstream", []):
            if up in boxes:
                ux, uy, uh = boxes[up]
                parts.append(f'<line x1="{ux + BOX_W:.0f}" y1="{uy + uh / 2:.0f}" x2="{x:.0f}" y2="{y + h / 2:.0f}" '
                             'stroke="#555" marker-end="url(#sl-arrow)"/>')
    for name, info in nodes.items():
        x, y, h = boxes[name]
        fill = KIND_COLOURS.get(info.get("kind", ""), "#eee")
        parts.append(f'<g data-node="{html.escape(name)}"><rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" '
                     f'height="{h:.0f}" rx="6" fill="{fill}" stroke="#888"/>')
        ty = y + PAD + LINE_H - 3
        parts.append(f'<text x="{x + PAD:.0f}" y="{ty:.0f}" font-weight="bold">{html.escape(name)}</text>')
        key = ", ".join(info.get("primary_key") or [])
        sub = f"{info.get('type')} {info.get('kind')}" + (f" · key {key}" if key else "")
        parts.append(f'<text x="{x + PAD:.0f}" y="{ty + LINE_H:.0f}" fill="#555">{html.escape(sub)}</text>')
        schema = info.get("schema") or []
        for i, column in enumerate(schema[:max_schema_lines]):
            parts.append(f'<text x="{x + PAD:.0f}" y="{ty + (2 + i) * LINE_H:.0f}">{html.escape(_clip(column))}</text>')
        if len(schema) > max_schema_lines:
            more = len(schema) - max_schema_lines
            parts.append(f'<text x="{x + PAD:.0f}" y="{ty + (2 + max_schema_lines) * LINE_H:.0f}" '
                         f'fill="#777">… {more} more</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _clip(text: str, width: int = 32) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def dag_text(description: dict[str, Any]) -> str:
    lines = []
    for name, info in description["nodes"].items():
        ups = info.get("upstream") or []
        arrow = f" <- {', '.join(ups)}" if ups else ""
        lines.append(f"{info.get('kind')} {name} ({info.get('type')}){arrow}")
        for column in info.get("schema") or []:
            lines.append(f"    {column}")
    return "\n".join(lines)


CELL_STYLE = "white-space:nowrap"
#: Inline styles, so the marks survive a reopened untrusted notebook (its ``<style>`` blocks are
#: stripped; ``style``, ``class`` and ``title`` attributes are kept). Colours set the text too,
#: so they stay readable on a dark theme.
MARK_STYLES = {
    "changed": "background:#fff3bf;color:#3d2e00",
    "added": "background:#dcf5e3;color:#0f3d1e",
    "removed": "background:#fde2e1;color:#7a1712;text-decoration:line-through",
}
TEXT_MARKS = {"added": "+", "removed": "-"}
HTML_CLIP, TEXT_CLIP, TYPE_CLIP = 60, 24, 40


@dataclass
class Marks:
    """How one table panel is marked: rows and columns added or removed, cells changed (with the
    value before). Rows are indexes into the panel's table."""

    rows: dict[int, str] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    cells: dict[tuple[int, str], Any] = field(default_factory=dict)

    def of_cell(self, row: int, column: str) -> str | None:
        """A row's or a column's mark covers its cells; else the cell's own."""
        return self.rows.get(row) or self.columns.get(column) or ("changed" if (row, column) in self.cells else None)


@dataclass
class TableDiff:
    """The output after an edit matched to the output before it, row by row and cell by cell.

    ``matches[i]`` is the row of ``before`` that row ``i`` of ``after`` continues (``None``: added);
    rows are matched by ``key`` when both tables have it, else in order (see ``_match_in_order``).
    """

    key: list[str]
    matches: list[int | None]
    removed_rows: list[int]
    changed: dict[tuple[int, str], Any]
    columns_added: list[str]
    columns_removed: list[str]

    def after_marks(self) -> Marks:
        return Marks(rows={i: "added" for i, m in enumerate(self.matches) if m is None},
                     columns=dict.fromkeys(self.columns_added, "added"), cells=dict(self.changed))

    def before_marks(self) -> Marks:
        return Marks(rows=dict.fromkeys(self.removed_rows, "removed"),
                     columns=dict.fromkeys(self.columns_removed, "removed"))


def diff_tables(before: pa.Table, after: pa.Table, key: Sequence[str] = ()) -> TableDiff:
    """Match ``after``'s rows to ``before``'s and find the cells whose value differs."""
    common = [c for c in after.column_names if c in before.column_names]
    old, new = before.to_pylist(), after.to_pylist()
    usable_key = [k for k in key if k in common]
    matches = _match_by_key(old, new, usable_key) if usable_key else _match_in_order(old, new, common)
    changed = {(i, c): old[m][c] for i, m in enumerate(matches) if m is not None
               for c in common if not _same(new[i][c], old[m][c])}
    matched = {m for m in matches if m is not None}
    return TableDiff(key=usable_key, matches=matches, removed_rows=[j for j in range(len(old)) if j not in matched],
                     changed=changed,
                     columns_added=[c for c in after.column_names if c not in before.column_names],
                     columns_removed=[c for c in before.column_names if c not in after.column_names])


def _match_by_key(old: list[dict[str, Any]], new: list[dict[str, Any]], key: list[str]) -> list[int | None]:
    """Each new row to the old row with its key; repeated keys pair up in order."""
    by_key: dict[tuple[Any, ...], list[int]] = {}
    for j, row in enumerate(old):
        by_key.setdefault(_row_key(row, key), []).append(j)
    return [(rows.pop(0) if (rows := by_key.get(_row_key(row, key))) else None) for row in new]


def _match_in_order(old: list[dict[str, Any]], new: list[dict[str, Any]], common: list[str]) -> list[int | None]:
    """Without a key, rows pair up by position, around the rows that are equal on the shared
    columns: a stricter filter shows the rows it dropped as removed, not every later row as changed."""
    matcher = SequenceMatcher(None, [_row_key(r, common) for r in old], [_row_key(r, common) for r in new],
                              autojunk=False)
    matches: list[int | None] = [None] * len(new)
    for _tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for k in range(min(i2 - i1, j2 - j1)):  # equal and replaced blocks pair by position
            matches[j1 + k] = i1 + k
    return matches


def _row_key(row: dict[str, Any], columns: list[str]) -> tuple[Any, ...]:
    return tuple(repr(row[c]) for c in columns)  # repr: lists and dicts are values too


def _same(a: Any, b: Any) -> bool:
    return bool(a == b) or (a != a and b != b)  # NaN is unchanged when it stays NaN


def _value_text(value: Any) -> str:
    return "null" if value is None else str(value)


def _cell_html(value: Any, mark: str | None = None, before: Any = None) -> str:
    """A ``<td>`` that never wraps; a long value is clipped, the whole of it in the tooltip, and
    a changed cell's tooltip gives the value before the edit."""
    text = _value_text(value)
    tips = [text] if len(text) > HTML_CLIP else []
    if mark == "changed":
        tips.append(f"before the edit: {_value_text(before)}")
    style = CELL_STYLE + (f";{MARK_STYLES[mark]}" if mark else "")
    attrs = f' class="sl-{mark}"' if mark else ""
    attrs += f' title="{html.escape(chr(10).join(tips))}"' if tips else ""
    return f'<td style="{style}"{attrs}>{html.escape(_clip(text, HTML_CLIP))}</td>'


def _head_html(column: str, mark: str | None) -> str:
    style = CELL_STYLE + (f";{MARK_STYLES[mark]}" if mark else "")
    attrs = f' class="sl-{mark}" title="column {mark}"' if mark else ""
    return f'<th style="{style}"{attrs}>{html.escape(TEXT_MARKS.get(mark or "", "") + column)}</th>'


def table_html(table: pa.Table | None, title: str, max_rows: int = 20, marks: Marks | None = None) -> str:
    if table is None:
        return f"<div><b>{html.escape(title)}</b><p><i>no rows</i></p></div>"
    marks = marks or Marks()
    columns = table.column_names
    head = "".join(_head_html(c, marks.columns.get(c)) for c in columns)
    body = []
    for i, row in enumerate(table.slice(0, max_rows).to_pylist()):
        row_mark = marks.rows.get(i)
        cells = "".join(_cell_html(row[c], marks.of_cell(i, c), marks.cells.get((i, c))) for c in columns)
        body.append(f'<tr class="sl-{row_mark}">{cells}</tr>' if row_mark else f"<tr>{cells}</tr>")
    more = f"<p>… {table.num_rows - max_rows} more rows{_hidden_marks(marks, max_rows)}</p>" \
        if table.num_rows > max_rows else ""
    return (f'<div class="sl-table"><b>{html.escape(title)}</b> <small>({table.num_rows} rows)</small>'
            f'<table style="table-layout:auto;margin:0"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>{more}</div>')


def _hidden_marks(marks: Marks, max_rows: int) -> str:
    """What the rows beyond the shown ones hold, so no change goes unmentioned."""
    counts: dict[str, int] = {}
    for i, mark in marks.rows.items():
        if i >= max_rows:
            counts[mark] = counts.get(mark, 0) + 1
    changed = len({i for i, _ in marks.cells if i >= max_rows and i not in marks.rows})
    if changed:
        counts["changed"] = changed
    return f" ({', '.join(f'{n} {mark}' for mark, n in counts.items())})" if counts else ""


def table_text(table: pa.Table | None, title: str, max_rows: int = 20, marks: Marks | None = None) -> str:
    """A plain table; with ``marks``, ``+``/``-`` before added/removed rows and columns and ``*``
    after changed values."""
    if table is None:
        return f"{title}: no rows"
    marks = marks or Marks()
    cols = table.column_names
    heads = [TEXT_MARKS.get(marks.columns.get(c, ""), "") + c for c in cols]
    rows = [[_clip(_value_text(r[c]), TEXT_CLIP) + ("*" if (i, c) in marks.cells else "") for c in cols]
            for i, r in enumerate(table.slice(0, max_rows).to_pylist())]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    gutter = bool(marks.rows)  # a column for the row marks, only when a row has one

    def line(values: list[str], mark: str = "") -> str:
        text = "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True))
        return f"{TEXT_MARKS.get(mark, ' ')} {text}" if gutter else text

    out = [f"{title} ({table.num_rows} rows)", line(heads)]
    out += [line(r, marks.rows.get(i, "")) for i, r in enumerate(rows)]
    if table.num_rows > max_rows:
        out.append(f"… {table.num_rows - max_rows} more rows{_hidden_marks(marks, max_rows)}")
    return "\n".join(out)


def changed_cells_text(diff: TableDiff, after: pa.Table, limit: int = 10) -> str:
    """The changed cells as ``row: column old → new`` lines (rows named by key when there is one)."""
    new = after.to_pylist()
    lines = []
    for (i, column), old in list(diff.changed.items())[:limit]:
        where = (", ".join(f"{k}={_value_text(new[i][k])}" for k in diff.key) if diff.key else f"row {i + 1}")
        lines.append(f"  {where}: {column} {_clip(repr(old), TEXT_CLIP)} → {_clip(repr(new[i][column]), TEXT_CLIP)}")
    if len(diff.changed) > limit:
        lines.append(f"  … {len(diff.changed) - limit} more changed cells")
    return "changed cells:\n" + "\n".join(lines) if lines else "no cell changed"


def side_by_side(panels: list[tuple[str, pa.Table | None]], max_rows: int = 20,
                 marks: Mapping[str, Marks] | None = None) -> str:
    """Panels next to each other while they fit, wrapped below each other when they do not; a
    panel wider than the output scrolls on its own instead of clipping columns."""
    marks = marks or {}
    cells = "".join('<div style="flex:0 1 auto;min-width:0;max-width:100%;overflow-x:auto">'
                    f"{table_html(t, title, max_rows, marks.get(title))}</div>" for title, t in panels)
    return f'<div style="display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start">{cells}</div>'


BEFORE, AFTER = "output before the edit", "output now"


#: rows of each panel a debug view lists: every row of a sampled batch (20 by default), and of
#: a preview's capture as many as a notebook output reasonably holds
DEBUG_ROWS = 200


def debug_view(summary: str, inputs: Mapping[str, pa.Table], before: pa.Table | None, after: pa.Table,
               key: Sequence[str] = (), max_rows: int = DEBUG_ROWS) -> Rendered:
    """A transform's captured inputs, its output before the edit and now, the changes marked."""
    panels: list[tuple[str, pa.Table | None]] = [(f"input: {name}", table) for name, table in inputs.items()]
    marks: dict[str, Marks] = {}
    notes = ""
    if before is not None and before is not after:
        diff = diff_tables(before, after, key)
        marks = {BEFORE: diff.before_marks(), AFTER: diff.after_marks()}
        panels.append((BEFORE, before))
        notes = "\n\n" + changed_cells_text(diff, after, max_rows)
    panels.append((AFTER, after))
    text = summary + "\n\n" + "\n\n".join(table_text(t, title, max_rows, marks.get(title)) for title, t in panels)
    legend = (f'<p><small>in “{AFTER}”: <span style="{MARK_STYLES["changed"]}">changed</span> (hover for the value '
              f'before) · <span style="{MARK_STYLES["added"]}">added</span> · in “{BEFORE}”: '
              f'<span style="{MARK_STYLES["removed"]}">removed</span></small></p>') if marks else ""
    return Rendered(text + notes, html_text=f"<p>{html.escape(summary)}</p>{legend}"
                                            f"{side_by_side(panels, max_rows, marks)}")


def schema_view(node: str, columns: Sequence[tuple[str, str]], key: Sequence[str] = ()) -> Rendered:
    """A node's resolved columns on a line or two: what a definition cell shows on a warm session."""
    keyed = f" · key: {', '.join(key)}" if key else ""
    text = _wrap([f"{name}: {kind}" for name, kind in columns], f"{node} → ", keyed)
    items = ", ".join(_schema_item_html(name, kind, name in key) for name, kind in columns)
    return Rendered(text, html_text=f'<div class="sl-schema" style="font-family:monospace;font-size:12px">'
                                    f"<b>{html.escape(node)}</b> → {items}{html.escape(keyed)}</div>")


def _wrap(items: list[str], head: str, tail: str, width: int = 120) -> str:
    """``head``, then ``items`` comma-separated, then ``tail``; lines break between items only."""
    lines = [head.rstrip()]
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else tail)
        if len(lines[-1]) + 1 + len(piece) > width and lines[-1].strip() not in ("", head.strip()):
            lines.append("   ")
        lines[-1] += " " + piece
    return "\n".join(lines)


def _schema_item_html(name: str, kind: str, is_key: bool) -> str:
    """``name: type`` kept on one line; a long type (a struct) clipped, whole in its tooltip."""
    title = f' title="{html.escape(kind)}"' if len(kind) > TYPE_CLIP else ""
    shown = html.escape(name) if not is_key else f"<u>{html.escape(name)}</u>"
    return (f'<span style="white-space:nowrap">{shown}: <span style="color:#777"{title}>'
            f"{html.escape(_clip(kind, TYPE_CLIP))}</span></span>")


class Rendered:
    """A notebook output with HTML (or SVG) and a plain-text fallback."""

    def __init__(self, text: str, html_text: str | None = None, svg: str | None = None) -> None:
        self.text = text
        self.html = html_text
        self.svg = svg

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        bundle = {"text/plain": self.text}
        if self.html is not None:
            bundle["text/html"] = self.html
        if self.svg is not None:
            bundle["image/svg+xml"] = self.svg
        return bundle

    def __repr__(self) -> str:
        return self.text
