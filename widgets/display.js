// streamling result view: the front end of streamling.notebook.display.ResultView (anywidget ESM).
// A node's latest rows as a sortable table, a quick line/bar chart and CSV/Parquet downloads.
// No build step and no imports (common.js, with h/s, is prepended): plain DOM and inline SVG.

const NUMERIC = /^(nullable\()?(u?int\d*|integer|smallint|bigint|float\d*|double|halffloat|decimal|numeric|real)\b/i;
const TEMPORAL = /^(nullable\()?(timestamp|date|datetime|time)/i;
const CHART_W = 640;
const CHART_H = 220;
const PAD = { left: 56, right: 12, top: 10, bottom: 34 };
const MAX_BARS = 100;
const MAX_DOTS = 200;

const isNumeric = (type) => NUMERIC.test(type || "");
const isTemporal = (type) => TEMPORAL.test(type || "");

function text(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function fmtNumber(n) {
  const a = Math.abs(n);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return n.toExponential(2);
  return Number.isInteger(n) ? n.toLocaleString("en-US") : n.toLocaleString("en-US", { maximumFractionDigits: 3 });
}

// An axis label that fits under a bar: a timestamp's time of day, other text cut short.
function shortLabel(label, temporal) {
  if (label.length <= 12) return label;
  return temporal ? label.slice(11, 19) : label.slice(0, 11) + "…";
}

// A value as a number for sorting or charting: numbers (and decimals sent as text) as they are,
// timestamps and dates as milliseconds; NaN when there is none.
function numberOf(v, temporal) {
  if (v === null || v === undefined || v === "") return NaN;
  if (temporal) return Date.parse(String(v).replace(" ", "T"));
  return typeof v === "number" ? v : Number(v);
}

function compare(a, b, numeric, temporal) {
  if (numeric || temporal) {
    const x = numberOf(a, temporal);
    const y = numberOf(b, temporal);
    if (!Number.isNaN(x) && !Number.isNaN(y)) return x - y;
  }
  const x = text(a);
  const y = text(b);
  return x < y ? -1 : x > y ? 1 : 0;
}

function csvOf(columns, rows) {
  const cell = (v) => {
    const t = text(v);
    return /[",\r\n]/.test(t) ? `"${t.replace(/"/g, '""')}"` : t;
  };
  return [columns.map(cell).join(","), ...rows.map((r) => r.map(cell).join(","))].join("\r\n") + "\r\n";
}

function download(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: filename, style: "display:none" });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function render({ model, el }) {
  let sort = { column: null, dir: 1 }; // column index, 1 ascending / -1 descending
  const title = h("span", { class: "sl-display-title" });
  const status = h("span", { class: "sl-display-status", "data-testid": "sl-display-status" });
  const headline = h("span", { class: "sl-display-headline", "data-testid": "sl-display-headline" });
  const caption = h("div", { class: "sl-display-caption", "data-testid": "sl-display-caption" });
  const error = h("div", { class: "sl-display-error", "data-testid": "sl-display-error", role: "alert" });
  const note = h("span", { class: "sl-display-note", "data-testid": "sl-display-note" });
  const csvButton = h("button", { class: "sl-display-button", "data-testid": "sl-display-csv", title: "the rows shown, in the order shown", text: "CSV" });
  const parquetButton = h("button", { class: "sl-display-button", "data-testid": "sl-display-parquet", title: "the rows shown, with their exact types", text: "Parquet" });
  const xSelect = h("select", { class: "sl-display-select", "data-testid": "sl-display-chart-x", "aria-label": "chart x column" });
  const ySelect = h("select", { class: "sl-display-select", "data-testid": "sl-display-chart-y", "aria-label": "chart y column" });
  const kindSelect = h(
    "select",
    { class: "sl-display-select", "data-testid": "sl-display-chart-kind", "aria-label": "chart kind" },
    h("option", { value: "line", text: "line" }),
    h("option", { value: "bar", text: "bar" }),
  );
  const tableBox = h("div", { class: "sl-display-table" });
  const chart = h("div", { class: "sl-display-chart", "data-testid": "sl-display-chart" });
  const root = h(
    "div",
    { class: "sl-display", "data-testid": "sl-display" },
    h("header", { class: "sl-display-head" }, title, status, headline),
    caption,
    error,
    h(
      "div",
      { class: "sl-display-tools" },
      h("span", { class: "sl-display-label", text: "Download" }),
      csvButton,
      parquetButton,
      note,
      h("span", { class: "sl-display-spacer" }),
      h("span", { class: "sl-display-label", text: "Chart" }),
      h("label", { class: "sl-display-label" }, "x ", xSelect),
      h("label", { class: "sl-display-label" }, "y ", ySelect),
      kindSelect,
    ),
    tableBox,
    chart,
  );
  el.replaceChildren(root);

  const columns = () => model.get("columns") || [];
  const types = () => model.get("types") || [];

  function sortedRows() {
    const rows = (model.get("rows") || []).slice();
    if (sort.column === null || sort.column >= columns().length) return rows;
    const i = sort.column;
    const type = types()[i];
    const numeric = isNumeric(type);
    const temporal = isTemporal(type);
    return rows.sort((a, b) => {
      const nullA = a[i] === null || a[i] === undefined;
      const nullB = b[i] === null || b[i] === undefined;
      if (nullA || nullB) return nullA === nullB ? 0 : nullA ? 1 : -1; // nulls last either way
      return sort.dir * compare(a[i], b[i], numeric, temporal);
    });
  }

  // No kernel answers the ping of a display reopened from a saved notebook: its rows are a snapshot.
  let live = null;
  function renderHead() {
    title.textContent = `${model.get("kind")} ${model.get("node")}`;
    let state = model.get("status") || "";
    if (live === false && /^(running|waiting)/.test(state)) {
      const at = fmtWhen(model.get("updated_at"));
      state = `saved snapshot${at ? ` from ${at}` : ""} · not live`;
    }
    parquetButton.hidden = live === false;
    status.dataset.live = live === false ? "false" : "true";
    status.textContent = state;
    status.dataset.state = state.split(/[:\s(]/)[0];
    caption.textContent = model.get("caption") || "";
    const message = model.get("error") || "";
    error.textContent = message;
    error.hidden = !message;
    const rows = (model.get("rows") || []).length;
    const epoch = model.get("epoch");
    const first = model.get("first_epoch");
    const latest = model.get("latest_epoch");
    const count = model.get("count");
    const parts = [`${rows.toLocaleString("en-US")} row${rows === 1 ? "" : "s"}`];
    if (epoch !== null && epoch !== undefined) {
      parts.push(first !== null && first !== undefined && first !== epoch ? `epochs ${first}–${epoch}` : `epoch ${epoch}`);
      if (count !== null && count !== undefined) parts.push(`${count.toLocaleString("en-US")} rows in epoch ${epoch}`);
      if (latest !== null && latest !== undefined && latest > epoch) parts.push(`no rows since (epoch ${latest})`);
    }
    const at = fmtClock(model.get("updated_at"));
    if (at) parts.push(at);
    headline.textContent = parts.join(" · ");
  }

  function renderTable() {
    const cols = columns();
    const tys = types();
    if (!cols.length) {
      tableBox.replaceChildren(h("div", { class: "sl-display-empty", text: "no rows yet" }));
      return;
    }
    const head = h(
      "tr",
      {},
      cols.map((name, i) => {
        const active = sort.column === i;
        const th = h(
          "th",
          {
            "data-testid": "sl-display-header",
            "data-column": name,
            "data-sort": active ? (sort.dir > 0 ? "asc" : "desc") : null,
            "aria-sort": active ? (sort.dir > 0 ? "ascending" : "descending") : "none",
            title: `sort by ${name}`,
            onclick: () => {
              sort = active ? { column: i, dir: -sort.dir } : { column: i, dir: 1 };
              renderTable();
              renderChart(); // bars follow the table's order
            },
          },
          h(
            "div",
            { class: "sl-display-name" },
            h("span", { text: name }),
            h("span", { class: "sl-display-arrow", text: active ? (sort.dir > 0 ? "▲" : "▼") : "" }),
          ),
          h("div", { class: "sl-display-type", text: tys[i] || "" }),
        );
        if (isNumeric(tys[i])) th.classList.add("sl-display-num");
        return th;
      }),
    );
    const numeric = tys.map(isNumeric);
    const body = h(
      "tbody",
      {},
      sortedRows().map((row) =>
        h(
          "tr",
          { "data-testid": "sl-display-row" },
          row.map((v, i) =>
            v === null || v === undefined
              ? h("td", { class: numeric[i] ? "sl-display-null sl-display-num" : "sl-display-null", text: "null" })
              : h("td", { class: numeric[i] ? "sl-display-num" : null, text: text(v) }),
          ),
        ),
      ),
    );
    tableBox.replaceChildren(h("table", {}, h("thead", {}, head), body));
  }

  // --- chart ---

  function fillSelect(select, names, preferred) {
    const current = select.value;
    select.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
    if (names.includes(current)) select.value = current;
    else if (preferred !== undefined && names.includes(preferred)) select.value = preferred;
  }

  function renderSelectors() {
    const cols = columns();
    const tys = types();
    const numericCols = cols.filter((_, i) => isNumeric(tys[i]));
    const temporal = cols.find((_, i) => isTemporal(tys[i]));
    fillSelect(xSelect, cols, temporal ?? cols[0]);
    const measures = numericCols.filter((c) => c !== xSelect.value);
    fillSelect(ySelect, numericCols, measures.find((c) => !/(^|_)id$/i.test(c)) ?? measures[0] ?? numericCols[0]);
  }

  function renderChart() {
    const cols = columns();
    const tys = types();
    const xi = cols.indexOf(xSelect.value);
    const yi = cols.indexOf(ySelect.value);
    if (xi < 0 || yi < 0) {
      chart.replaceChildren(h("div", { class: "sl-display-empty", text: cols.length ? "no numeric column to chart" : "" }));
      return;
    }
    const xNumeric = isNumeric(tys[xi]) || isTemporal(tys[xi]);
    const rows = sortedRows();
    let points = rows
      .map((r, i) => ({ x: xNumeric ? numberOf(r[xi], isTemporal(tys[xi])) : i, y: numberOf(r[yi], false), label: text(r[xi]) }))
      .filter((p) => !Number.isNaN(p.x) && !Number.isNaN(p.y));
    const bars = kindSelect.value === "bar";
    if (bars) points = points.slice(0, MAX_BARS);
    else if (xNumeric) points.sort((a, b) => a.x - b.x);
    if (!points.length) {
      chart.replaceChildren(h("div", { class: "sl-display-empty", text: "no values to chart" }));
      return;
    }
    const ys = points.map((p) => p.y);
    let lo = Math.min(...ys, bars ? 0 : Infinity);
    let hi = Math.max(...ys, bars ? 0 : -Infinity);
    if (lo === hi) [lo, hi] = [lo - 1, hi + 1];
    const w = CHART_W - PAD.left - PAD.right;
    const ht = CHART_H - PAD.top - PAD.bottom;
    const yAt = (v) => PAD.top + ht - ((v - lo) / (hi - lo)) * ht;
    const svg = s("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, class: "sl-display-svg", role: "img", "aria-label": `${cols[yi]} by ${cols[xi]}` });
    for (const v of [lo, (lo + hi) / 2, hi]) {
      svg.append(s("line", { x1: PAD.left, x2: CHART_W - PAD.right, y1: yAt(v), y2: yAt(v), class: "sl-display-grid" }));
      svg.append(s("text", { x: PAD.left - 4, y: yAt(v) + 4, "text-anchor": "end", class: "sl-display-tick", text: fmtNumber(v) }));
    }
    if (bars) {
      const step = w / points.length;
      const zero = yAt(Math.max(lo, Math.min(0, hi)));
      points.forEach((p, i) => {
        const y = yAt(p.y);
        svg.append(
          s(
            "rect",
            { x: PAD.left + i * step + step * 0.1, width: Math.max(1, step * 0.8), y: Math.min(y, zero), height: Math.max(1, Math.abs(zero - y)), class: "sl-display-bar" },
            s("title", { text: `${p.label}: ${p.y}` }),
          ),
        );
      });
      const labelEvery = Math.ceil(points.length / 8);
      points.forEach((p, i) => {
        if (i % labelEvery) return;
        const label = shortLabel(p.label, isTemporal(tys[xi]));
        svg.append(s("text", { x: PAD.left + (i + 0.5) * step, y: CHART_H - PAD.bottom + 14, "text-anchor": "middle", class: "sl-display-tick", text: label }));
      });
    } else {
      const xs = points.map((p) => p.x);
      let x0 = Math.min(...xs);
      let x1 = Math.max(...xs);
      if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
      const xAt = (v) => PAD.left + ((v - x0) / (x1 - x0)) * w;
      svg.append(s("polyline", { points: points.map((p) => `${xAt(p.x).toFixed(1)},${yAt(p.y).toFixed(1)}`).join(" "), class: "sl-display-line" }));
      if (points.length <= MAX_DOTS) {
        for (const p of points) svg.append(s("circle", { cx: xAt(p.x), cy: yAt(p.y), r: 2.5, class: "sl-display-dot" }, s("title", { text: `${p.label}: ${p.y}` })));
      }
      const first = points.reduce((a, b) => (b.x < a.x ? b : a));
      const last = points.reduce((a, b) => (b.x > a.x ? b : a));
      svg.append(s("text", { x: PAD.left, y: CHART_H - PAD.bottom + 14, "text-anchor": "start", class: "sl-display-tick", text: first.label }));
      svg.append(s("text", { x: CHART_W - PAD.right, y: CHART_H - PAD.bottom + 14, "text-anchor": "end", class: "sl-display-tick", text: last.label }));
    }
    svg.append(s("text", { x: PAD.left + w / 2, y: CHART_H - 4, "text-anchor": "middle", class: "sl-display-axis", text: cols[xi] }));
    chart.replaceChildren(svg);
  }

  // --- downloads ---

  csvButton.addEventListener("click", () => {
    const blob = new Blob([csvOf(columns(), sortedRows())], { type: "text/csv;charset=utf-8" });
    download(blob, `${model.get("node") || "rows"}.csv`);
  });
  parquetButton.addEventListener("click", () => {
    note.textContent = "preparing Parquet…";
    try {
      sendToKernel(model, { type: "parquet" });
    } catch (err) {
      note.textContent = "no kernel is running this notebook: the Parquet file cannot be made";
    }
  });
  model.on("msg:custom", (msg, buffers) => {
    if (msg && msg.type === "pong") {
      live = true;
      renderHead();
      return;
    }
    if (!msg || msg.type !== "parquet") return;
    if (msg.error || !buffers || !buffers.length) {
      note.textContent = msg.error || "the kernel sent no file";
      return;
    }
    note.textContent = "";
    download(new Blob(buffers, { type: "application/vnd.apache.parquet" }), msg.filename || "rows.parquet");
  });

  function renderRows() {
    renderHead();
    renderTable();
    renderChart();
  }
  function renderColumns() {
    if (sort.column !== null && sort.column >= columns().length) sort = { column: null, dir: 1 };
    renderSelectors();
    renderRows();
  }
  for (const select of [xSelect, ySelect, kindSelect]) select.addEventListener("change", renderChart);
  model.on("change:columns", renderColumns);
  model.on("change:types", renderColumns);
  model.on("change:rows", renderRows);
  for (const name of ["status", "caption", "error", "epoch", "first_epoch", "latest_epoch", "count", "updated_at"]) {
    model.on(`change:${name}`, renderHead);
  }
  renderColumns();
  // The kernel's heartbeat while a run feeds this view: live even when the kernel is too busy to
  // answer the ping.
  model.on("change:beat", () => {
    if (live !== true) {
      live = true;
      renderHead();
    }
  });
  try {
    sendToKernel(model, { type: "ping" });
  } catch (err) {
    live = false;
  }
  const pingTimer = setTimeout(() => {
    if (live === null) {
      live = false;
      renderHead();
    }
  }, 5000);
  return () => clearTimeout(pingTimer);
}

export default { render };
