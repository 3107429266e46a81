"""The monitor's picture of a run for renderers that cannot run its widget (nbval, nbconvert, job
output pages): a plain-text and an HTML summary of the nodes, the last epochs and the error, drawn
from the state ``Monitor`` keeps.
"""

from __future__ import annotations

import html
import json
from typing import Any


def _fmt_int(n: float | None) -> str:
    return "—" if n is None else f"{n:,.0f}"


def _fmt_rate(r: float | None) -> str:
    if r is None:
        return "—"
    return f"{r:,.0f}/s" if r >= 10 else f"{r:,.1f}/s"


def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms:,.0f} ms" if ms < 10_000 else f"{ms / 1000:,.1f} s"


def _fmt_offsets(offsets: dict[str, Any] | None) -> str:
    return "  ".join(f"{k}={json.dumps(v, separators=(',', ':'), sort_keys=True)}"
                     for k, v in (offsets or {}).items())


def summary_text(title: str, graph: dict[str, Any], s: dict[str, Any], last_epochs: int = 5) -> str:
    """A plain-text picture of the run, for renderers that cannot run the widget. ``s`` is the
    monitor's state: ``status``, per-node ``stats``, ``epochs``, ``error``, several ``flows`` or not."""
    lines = [f"streamling monitor: {title}" if title else "streamling monitor",
             f"status: {s['status']}"]
    nodes = graph.get("nodes") or []
    if nodes:
        lines.append("nodes:")
        width = max(len(n["name"]) for n in nodes)
        kinds = max(len(f"{n['kind']}/{n['type']}") for n in nodes)
        for n in nodes:
            st = s["stats"].get(n["name"], {})
            lines.append(f"  {n['name']:<{width}}  {n['kind'] + '/' + n['type']:<{kinds}}  "
                         f"{_fmt_int(st.get('rows')):>12} rows  {_fmt_rate(st.get('rows_per_sec')):>10}")
            for name, check in (st.get("expectations") or {}).items():
                lines.append(f"    expectation {name} ({check['action']}): {_fmt_int(check['passed'])} passed, "
                             f"{_fmt_int(check['failed'])} failed")
    epochs = s["epochs"][-last_epochs:]
    if epochs:
        lines.append(f"epochs (last {len(epochs)} of {len(s['epochs'])}):")
        for r in reversed(epochs):
            flow = f" {r['flow']}" if s["flows"] else ""
            sinks = " ".join(f"{k}={v:,}" for k, v in r["rows"].items())
            parts = [f"  #{r['epoch']}{flow} {r['state']:<9}",
                     f"input {_fmt_int(r['input_rows'])}",
                     f"sinks {sinks or '—'}",
                     f"transforms {_fmt_ms(r['durations_ms'].get('transforms'))}",
                     f"total {_fmt_ms(r['durations_ms'].get('total'))}"]
            if r["spark_ms"].get("triggerExecution") is not None:
                parts.append(f"spark {_fmt_ms(r['spark_ms']['triggerExecution'])}")
            if r["offsets"]:
                parts.append(f"offsets {_fmt_offsets(r['offsets'])}")
            lines.append("  ".join(parts))
    else:
        lines.append("epochs: none yet")
    if s["error"]:
        e = s["error"]
        where = " ".join(x for x in (e.get("flow"), e.get("node") and f"node {e['node']}") if x)
        retry = ""
        if e.get("retriable"):
            retry = f" ({'recovered' if e.get('resolved') else 'retrying'}, attempt {e['attempt']})"
        lines.append(f"error{' in ' + where if where else ''}{retry}: {e['message']}")
    return "\n".join(lines)


def summary_html(title: str, graph: dict[str, Any], s: dict[str, Any], last_epochs: int = 5) -> str:
    """The same summary as a small HTML table (nbconvert, job output pages)."""
    esc = html.escape
    title = f"streamling monitor: {title}" if title else "streamling monitor"
    out = [f'<div class="sl-summary"><p><strong>{esc(title)}</strong> &middot; status: '
           f'<code>{esc(s["status"])}</code></p>']
    nodes = graph.get("nodes") or []
    if nodes:
        out.append("<table><thead><tr><th>node</th><th>kind</th><th>type</th><th>rows</th><th>rows/s</th>"
                   "</tr></thead><tbody>")
        for n in nodes:
            st = s["stats"].get(n["name"], {})
            out.append(f"<tr><td>{esc(n['name'])}</td><td>{esc(n['kind'])}</td><td>{esc(n['type'])}</td>"
                       f"<td>{_fmt_int(st.get('rows'))}</td><td>{_fmt_rate(st.get('rows_per_sec'))}</td></tr>")
        out.append("</tbody></table>")
    epochs = s["epochs"][-last_epochs:]
    if epochs:
        out.append("<table><thead><tr><th>epoch</th><th>flow</th><th>state</th><th>input rows</th>"
                   "<th>sink rows</th><th>transforms</th><th>total</th><th>offsets</th></tr></thead><tbody>")
        for r in reversed(epochs):
            sinks = ", ".join(f"{k}={v:,}" for k, v in r["rows"].items())
            out.append(f"<tr><td>{r['epoch']}</td><td>{esc(r['flow'])}</td><td>{esc(r['state'])}</td>"
                       f"<td>{_fmt_int(r['input_rows'])}</td><td>{esc(sinks) or '—'}</td>"
                       f"<td>{_fmt_ms(r['durations_ms'].get('transforms'))}</td>"
                       f"<td>{_fmt_ms(r['durations_ms'].get('total'))}</td>"
                       f"<td><code>{esc(_fmt_offsets(r['offsets']))}</code></td></tr>")
        out.append("</tbody></table>")
    if s["error"]:
        e = s["error"]
        where = " ".join(x for x in (e.get("flow"), e.get("node") and f"node {e['node']}") if x)
        out.append(f'<p class="sl-summary-error"><strong>error</strong>{" in " + esc(where) if where else ""}: '
                   f"{esc(e['message'])}</p>")
    out.append("</div>")
    return "".join(out)
