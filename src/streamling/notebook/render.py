"""Static pictures for notebook outputs: the DAG as SVG, Arrow tables and debug diffs as HTML.

Each result object carries ``text/plain`` next to its HTML/SVG, so headless runs (nbval, jobs)
keep a readable output.
"""

from __future__ import annotations

import html
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


def _cell(value: Any) -> str:
    text = "null" if value is None else str(value)
    return html.escape(_clip(text, 60))


def table_html(table: pa.Table | None, title: str, max_rows: int = 20) -> str:
    if table is None:
        return f"<div><b>{html.escape(title)}</b><p><i>no rows</i></p></div>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.column_names)
    rows = table.slice(0, max_rows).to_pylist()
    body = "".join("<tr>" + "".join(f"<td>{_cell(r[c])}</td>" for c in table.column_names) + "</tr>" for r in rows)
    more = f"<p>… {table.num_rows - max_rows} more rows</p>" if table.num_rows > max_rows else ""
    return (f'<div class="sl-table"><b>{html.escape(title)}</b> <small>({table.num_rows} rows)</small>'
            f'<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}</div>')


def table_text(table: pa.Table | None, title: str, max_rows: int = 20) -> str:
    if table is None:
        return f"{title}: no rows"
    cols = table.column_names
    rows = [[("null" if v is None else _clip(str(v), 24)) for v in r.values()]
            for r in table.slice(0, max_rows).to_pylist()]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    out = [f"{title} ({table.num_rows} rows)", "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    if table.num_rows > max_rows:
        out.append(f"… {table.num_rows - max_rows} more rows")
    return "\n".join(out)


def side_by_side(panels: list[tuple[str, pa.Table | None]], max_rows: int = 20) -> str:
    cells = "".join(f'<div style="flex:1;min-width:0;overflow-x:auto">{table_html(t, title, max_rows)}</div>'
                    for title, t in panels)
    return f'<div style="display:flex;gap:16px;align-items:flex-start">{cells}</div>'


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
