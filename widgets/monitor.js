// streamling pipeline monitor: the front end of streamling.notebook.monitor.Monitor (anywidget ESM).
// No build step and no imports (common.js, with h/s, is prepended): plain DOM and inline SVG.

const STATES = ["planned", "flushed", "finalized"];
const NODE_W = 156;
const NODE_H = 56;
const GAP_X = 40;
const GAP_Y = 18;
const PAD = 10;

const fmtInt = (n) => (n === null || n === undefined ? "—" : Math.round(n).toLocaleString("en-US"));
function fmtCompact(n) {
  if (n === null || n === undefined) return "—";
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(a >= 1e10 ? 0 : 1) + "G";
  if (a >= 1e6) return (n / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
  if (a >= 1e3) return (n / 1e3).toFixed(a >= 1e4 ? 0 : 1) + "k";
  // Counts are integers and print as such ("9 rows"); only a fractional rate gets a decimal.
  return a >= 10 || Number.isInteger(n) ? Math.round(n).toString() : n.toFixed(1);
}
const fmtRate = (r) => (r === null || r === undefined ? "— rows/s" : fmtCompact(r) + " rows/s");
function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  return ms < 10000 ? Math.round(ms).toLocaleString("en-US") + " ms" : (ms / 1000).toFixed(1) + " s";
}
function fmtValue(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
function fmtOffset(v) {
  return typeof v === "string" ? v : JSON.stringify(v);
}
function truncate(text, n) {
  return text.length > n ? text.slice(0, n - 1) + "…" : text;
}

// Where an epoch's time went, named: Spark's own phases (from its progress report, once the epoch
// is finalized) around the foreachBatch work streamling measures (transforms, each sink, and the
// sampling and row counting it does after the writes).
const SEGMENTS = {
  read: "source offsets & read",
  plan: "Spark planning",
  wal: "offset log write",
  transforms: "transforms",
  sink: "sink",
  bookkeeping: "sampling & row counts",
  spark: "Spark batch overhead",
  commit: "commit",
  other: "Spark other",
};
function breakdown(e) {
  const d = e.durations_ms || {};
  const sp = e.spark_ms || {};
  const sinks = Object.keys(e.rows || {});
  const parts = [];
  const add = (key, label, ms) => {
    if (typeof ms === "number" && ms >= 0.5) parts.push({ key, label, ms });
  };
  const spark = typeof sp.triggerExecution === "number";
  if (spark) {
    add("read", SEGMENTS.read, (sp.latestOffset || 0) + (sp.getBatch || 0));
    add("plan", SEGMENTS.plan, sp.queryPlanning);
    add("wal", SEGMENTS.wal, sp.walCommit);
  }
  add("transforms", SEGMENTS.transforms, d.transforms);
  for (const k of sinks) add("sink", `sink ${k}`, d[k]);
  if (typeof d.total === "number")
    add("bookkeeping", SEGMENTS.bookkeeping, d.total - (d.transforms || 0) - sinks.reduce((a, k) => a + (d[k] || 0), 0));
  if (spark) {
    if (typeof sp.addBatch === "number" && typeof d.total === "number") add("spark", SEGMENTS.spark, sp.addBatch - d.total);
    add("commit", SEGMENTS.commit, sp.commitOffsets);
    add("other", SEGMENTS.other, sp.triggerExecution - parts.reduce((a, p) => a + p.ms, 0));
  }
  return parts;
}
const epochTotal = (e) =>
  e.spark_ms && typeof e.spark_ms.triggerExecution === "number" ? e.spark_ms.triggerExecution : (e.durations_ms || {}).total || 0;

// --- DAG ------------------------------------------------------------------------------------------

function layout(graph) {
  const nodes = graph.nodes || [];
  const layers = [];
  for (const n of nodes) {
    const d = Math.max(0, n.depth || 0);
    (layers[d] = layers[d] || []).push(n);
  }
  const tallest = Math.max(1, ...layers.map((l) => (l ? l.length : 0)));
  const height = tallest * NODE_H + (tallest - 1) * GAP_Y + 2 * PAD;
  const pos = {};
  layers.forEach((layer, d) => {
    if (!layer) return;
    const used = layer.length * NODE_H + (layer.length - 1) * GAP_Y;
    const top = (height - used) / 2;
    layer.forEach((n, i) => {
      pos[n.name] = { x: PAD + d * (NODE_W + GAP_X), y: top + i * (NODE_H + GAP_Y) };
    });
  });
  const width = 2 * PAD + layers.length * NODE_W + Math.max(0, layers.length - 1) * GAP_X;
  return { pos, width: Math.max(width, NODE_W + 2 * PAD), height };
}

function nodeTooltip(n) {
  const lines = [`${n.name} (${n.kind} · ${n.type})`];
  if (n.flow) lines.push(`flow: ${n.flow}`);
  if (n.primary_key && n.primary_key.length) lines.push(`primary key: ${n.primary_key.join(", ")}`);
  if (n.schema) lines.push("", ...n.schema);
  return lines.join("\n");
}

// --- the view -------------------------------------------------------------------------------------

function render({ model, el }) {
  const uid = Math.random().toString(36).slice(2, 9);
  const title = h("span", { class: "sl-title" });
  const status = h("span", { class: "sl-status", "data-testid": "sl-status" });
  const headline = h("span", { class: "sl-headline" });
  const stopButton = h("button", { class: "sl-button", "data-testid": "sl-stop", type: "button", text: "Stop", title: "stop after the epoch in flight" });
  const restartButton = h("button", {
    class: "sl-button", "data-testid": "sl-restart", type: "button", text: "Restart",
    title: "stop, then run the cells' current definitions from the last finalized epoch",
  });
  const liveBadge = h("span", { class: "sl-live", "data-testid": "sl-live" });
  const controls = h("span", { class: "sl-controls" }, liveBadge, stopButton, restartButton);
  const errorBox = h("div", { class: "sl-error", "data-testid": "sl-error", role: "alert" });
  const dag = h("div", { class: "sl-dag" });
  const rates = h("div", { class: "sl-rates", "data-testid": "sl-rate-chart" });
  const rateLegend = h("div", { class: "sl-legend" });
  let chart = "rates"; // or "durations"
  const ratesTab = h("button", { class: "sl-tab", type: "button", "data-testid": "sl-tab-rates", text: "Input vs processing rate" });
  const durationsTab = h("button", { class: "sl-tab", type: "button", "data-testid": "sl-tab-durations", text: "Batch duration" });
  const chartTabs = h("div", { class: "sl-tabs", role: "tablist" }, ratesTab, durationsTab);
  const timeline = h("div", { class: "sl-timeline" });
  const select = h("select", { class: "sl-select", "data-testid": "sl-node-select", "aria-label": "node" });
  const sampleMeta = h("span", { class: "sl-muted", "data-testid": "sl-sample-meta" });
  const sample = h("div", { class: "sl-sample" });
  const root = h(
    "div",
    { class: "sl-monitor", "data-testid": "sl-monitor" },
    h("header", { class: "sl-head" }, title, status, headline, controls),
    errorBox,
    h(
      "div",
      { class: "sl-grid" },
      h("section", { class: "sl-panel sl-panel-dag" }, h("h4", { text: "Pipeline" }), dag),
      h(
        "section",
        { class: "sl-panel sl-panel-rates" },
        h("div", { class: "sl-panel-head" }, chartTabs, rateLegend),
        rates,
      ),
      h(
        "section",
        { class: "sl-panel sl-panel-epochs" },
        h("h4", { text: "Epochs (planned → flushed → finalized)" }),
        timeline,
      ),
      h(
        "section",
        { class: "sl-panel sl-panel-sample" },
        h("div", { class: "sl-panel-head" }, h("h4", { text: "In-flight batch" }), select, sampleMeta),
        sample,
      ),
    ),
  );
  el.replaceChildren(root);

  // Node boxes keep references to their text, so stats updates do not rebuild the SVG.
  let boxes = {};

  // A kernel answers the ping; a notebook reopened from its saved widget state has none, and then
  // shows what was saved as a snapshot instead of a frozen "running" badge.
  let live = null; // null: not known yet
  function renderControls() {
    const allowed = model.get("controls") || [];
    const st = model.get("status") || "";
    const running = st.startsWith("running") || st.startsWith("starting") || st.startsWith("restarting");
    stopButton.hidden = live === false || !allowed.includes("stop");
    restartButton.hidden = live === false || !allowed.includes("restart");
    stopButton.disabled = !running || st.startsWith("stopping") || st.startsWith("restarting");
    restartButton.disabled = st.startsWith("restarting") || st.startsWith("stopping");
    liveBadge.hidden = live !== false;
    liveBadge.dataset.live = live === false ? "false" : "true";
    const run = fmtWhen(model.get("started_at"));
    liveBadge.textContent = live !== false ? "" : `saved snapshot${run ? ` of the run of ${run}` : ""} · not live`;
  }

  function renderHead() {
    title.textContent = model.get("title") || "streamling";
    let st = model.get("status") || "";
    if (live === false && /^(running|starting|restarting)/.test(st)) st = "not running (saved while running)";
    status.textContent = st;
    status.dataset.state = live === false && st.startsWith("not running")
      ? "done"
      : st.startsWith("fail")
      ? "failed"
      : st.startsWith("running")
        ? "running"
        : st.startsWith("starting")
          ? "starting"
          : "done";
    const epochs = model.get("epochs") || [];
    const done = epochs.filter((e) => e.state === "finalized");
    const last = done[done.length - 1];
    headline.textContent = last
      ? `${done.length} finalized epoch${done.length === 1 ? "" : "s"} shown · last #${last.epoch} at ${fmtClock(last.finalized_at)}`
      : "no finalized epoch yet";
    renderControls();
    const err = model.get("error");
    errorBox.hidden = !err;
    errorBox.replaceChildren();
    if (err) {
      errorBox.classList.toggle("sl-error-retry", !!err.retriable && !err.resolved);
      errorBox.classList.toggle("sl-error-resolved", !!err.resolved);
      const where = [err.flow && `flow ${err.flow}`, err.node && `node ${err.node}`].filter(Boolean).join(", ");
      const head = err.resolved
        ? `Recovered after retry (attempt ${err.attempt})`
        : err.retriable
          ? `Retrying (attempt ${err.attempt})`
          : "Error";
      errorBox.append(
        h("strong", { text: head }),
        where ? h("span", { class: "sl-muted", text: ` ${where} · ${fmtClock(err.at)}` }) : null,
        h("div", { class: "sl-error-msg", text: err.message }),
      );
    }
  }

  function renderDag() {
    const graph = model.get("graph") || { nodes: [], edges: [] };
    const { pos, width, height } = layout(graph);
    const marker = `sl-arrow-${uid}`;
    const svg = s("svg", {
      class: "sl-dag-svg",
      viewBox: `0 0 ${width} ${height}`,
      // Scale down to the panel (never up): a wide DAG stays whole instead of scrolling.
      style: `width:100%;max-width:${width}px;height:auto`,
      role: "img",
      "aria-label": "pipeline graph",
    });
    svg.append(
      s(
        "defs",
        {},
        s(
          "marker",
          { id: marker, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
          s("path", { d: "M0,0 L10,5 L0,10 z", class: "sl-arrow" }),
        ),
      ),
    );
    for (const [from, to] of graph.edges || []) {
      const a = pos[from];
      const b = pos[to];
      if (!a || !b) continue;
      const x1 = a.x + NODE_W;
      const y1 = a.y + NODE_H / 2;
      const x2 = b.x - 2;
      const y2 = b.y + NODE_H / 2;
      const mx = (x1 + x2) / 2;
      svg.append(
        s("path", { class: "sl-edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, "marker-end": `url(#${marker})` }),
      );
    }
    boxes = {};
    const selected = model.get("selected_node");
    for (const n of graph.nodes || []) {
      const p = pos[n.name];
      const rows = s("text", { x: 12, y: 47, class: "sl-node-rows" });
      const rate = s("text", { x: NODE_W - 8, y: 47, class: "sl-node-rate", "text-anchor": "end" });
      const g = s(
        "g",
        {
          class: `sl-node sl-kind-${n.kind}${n.name === selected ? " sl-selected" : ""}${n.kind !== "sink" ? " sl-clickable" : ""}`,
          transform: `translate(${p.x},${p.y})`,
          "data-testid": "sl-node",
          "data-node": n.name,
          "data-kind": n.kind,
          onclick: () => {
            if (n.kind !== "sink") choose(n.name);
          },
        },
        s("title", { text: nodeTooltip(n) }),
        s("rect", { class: "sl-node-box", width: NODE_W, height: NODE_H, rx: 6 }),
        s("rect", { class: "sl-node-bar", width: 4, height: NODE_H - 12, x: 0, y: 6, rx: 2 }),
        s("text", { x: 12, y: 18, class: "sl-node-name", text: truncate(n.name, 19) }),
        s("text", { x: 12, y: 32, class: "sl-node-type", text: truncate(`${n.kind} · ${n.type}`, 25) }),
        rows,
        rate,
      );
      boxes[n.name] = { g, rows, rate };
      svg.append(g);
    }
    dag.replaceChildren(svg);
    renderStats();
  }

  function renderStats() {
    const stats = model.get("node_stats") || {};
    for (const [name, box] of Object.entries(boxes)) {
      const st = stats[name] || {};
      box.rows.textContent = st.rows === undefined ? "" : `${fmtCompact(st.rows)} rows`;
      const checks = Object.entries(st.expectations || {});
      const failed = checks.reduce((sum, [, c]) => sum + (c.failed || 0), 0);
      box.rate.textContent = fmtRate(st.rows_per_sec) + (failed ? ` · ${fmtCompact(failed)} failed checks` : "");
      box.g.classList.toggle("sl-checks-failed", failed > 0);
      box.g.dataset.checks = checks.map(([name, c]) => `${name} (${c.action}): ${c.passed} passed, ${c.failed} failed`)
        .join("; ");
      box.g.dataset.rows = st.rows === undefined ? "" : String(st.rows);
    }
  }

  function renderSelection() {
    const selected = model.get("selected_node");
    for (const [name, box] of Object.entries(boxes)) box.g.classList.toggle("sl-selected", name === selected);
  }

  // Epoch rows open a detail row (its time breakdown, full offsets and Spark's progress report);
  // kept open across re-renders. Progress reports are fetched from the kernel on demand.
  const expanded = new Set();
  const progressJson = {};
  const epochKey = (e) => `${e.flow}\u0000${e.epoch}`;

  function segmentBar(parts, longest) {
    const bar = h("div", { class: "sl-bar", title: parts.map((p) => `${p.label}: ${fmtMs(p.ms)}`).join("\n") });
    for (const p of parts)
      bar.append(h("span", { class: `sl-seg sl-seg-${p.key}`, style: `width:${Math.max(0, (100 * p.ms) / longest)}%` }));
    return bar;
  }

  function epochDetail(e, parts, columns) {
    const key = epochKey(e);
    const rows = parts.map((p) =>
      h("tr", {}, h("td", {}, h("span", { class: `sl-swatch sl-seg-${p.key}` }), p.label), h("td", { class: "sl-num", text: fmtMs(p.ms) })),
    );
    const total = epochTotal(e);
    if (total) rows.push(h("tr", { class: "sl-total" }, h("td", { text: "total" }), h("td", { class: "sl-num", text: fmtMs(total) })));
    const offsets = Object.entries(e.offsets || {}).map(([k, v]) => h("div", {}, h("strong", { text: `${k} ` }), fmtOffset(v)));
    const progress = h("pre", { class: "sl-progress-json", "data-testid": "sl-progress-json" });
    const button = h("button", {
      class: "sl-button", type: "button", "data-testid": "sl-progress-button", text: "Spark progress JSON",
      disabled: e.state !== "finalized" || live === false,
      onclick: (ev) => {
        ev.stopPropagation();
        if (progressJson[key] !== undefined) {
          progress.hidden = !progress.hidden;
          return;
        }
        progress.textContent = "loading…";
        send({ action: "progress", flow: e.flow, epoch: e.epoch });
      },
    });
    if (progressJson[key] !== undefined) progress.textContent = progressJson[key] || "no progress report kept for this epoch";
    else progress.hidden = true;
    return h(
      "tr",
      { class: "sl-epoch-detail", "data-testid": "sl-epoch-detail", "data-epoch": e.epoch },
      h(
        "td",
        { colspan: columns },
        h(
          "div",
          { class: "sl-detail" },
          h("div", {}, h("h5", { text: "Where the time went" }), parts.length ? h("table", { class: "sl-table sl-breakdown" }, h("tbody", {}, rows)) : h("div", { class: "sl-muted", text: "not measured yet" })),
          h("div", { class: "sl-detail-offsets" }, h("h5", { text: "End offsets" }), offsets.length ? offsets : h("div", { class: "sl-muted", text: "—" })),
          h("div", { class: "sl-detail-progress" }, button, progress),
        ),
      ),
    );
  }

  function renderEpochs() {
    const epochs = (model.get("epochs") || []).slice().reverse();
    const multiFlow = new Set(epochs.map((e) => e.flow)).size > 1;
    if (!epochs.length) {
      timeline.replaceChildren(h("div", { class: "sl-empty", text: "waiting for the first epoch" }));
      return;
    }
    const longest = Math.max(1, ...epochs.map(epochTotal));
    const body = h("tbody");
    const headers = ["epoch", "progress", "rows", "duration", "source offsets"];
    for (const e of epochs) {
      const reached = STATES.indexOf(e.state);
      const times = [e.planned_at, e.flushed_at, e.finalized_at];
      const steps = h(
        "div",
        { class: "sl-steps" },
        STATES.map((name, i) => {
          const base = times[0];
          const at = times[i];
          const label = i === 0 || !at || !base ? name : `${name} +${fmtMs((at - base) * 1000)}`;
          return h("span", {
            class: `sl-step${i <= reached ? " sl-step-done" : ""}${i === reached ? " sl-step-current" : ""}`,
            title: at ? `${name} at ${fmtClock(at)}` : name,
            text: label,
          });
        }),
      );
      const parts = breakdown(e);
      const total = epochTotal(e);
      const d = e.durations_ms || {};
      const sp = e.spark_ms || {};
      const durText = typeof sp.triggerExecution === "number"
        ? `${fmtMs(sp.triggerExecution)} Spark batch` + (d.total ? ` · ${fmtMs(d.total)} in foreachBatch` : "")
        : d.total ? `${fmtMs(d.total)} in foreachBatch` : "";
      const top = parts.slice().sort((a, b) => b.ms - a.ms).slice(0, 3).map((p) => `${p.label} ${fmtMs(p.ms)}`).join(" · ");
      const sinkNames = Object.keys(e.rows || {});
      const rowsOut = sinkNames.map((k) => `${k} ${fmtInt(e.rows[k])}`).join(", ");
      const offsets = Object.entries(e.offsets || {}).map(([k, v]) => `${k} ${fmtOffset(v)}`);
      const key = epochKey(e);
      const open = expanded.has(key);
      body.append(
        h(
          "tr",
          {
            "data-testid": "sl-epoch", "data-epoch": e.epoch, "data-state": e.state, "data-flow": e.flow,
            class: `sl-epoch-${e.state} sl-epoch-row${open ? " sl-open" : ""}`, title: "click for the breakdown and Spark's progress report",
            onclick: () => {
              if (expanded.has(key)) expanded.delete(key);
              else expanded.add(key);
              renderEpochs();
            },
          },
          h("td", { class: "sl-num" }, h("span", { class: "sl-caret", text: open ? "▾ " : "▸ " }), h("strong", { text: `#${e.epoch}` }), multiFlow ? h("div", { class: "sl-muted", text: e.flow }) : null),
          h("td", {}, steps),
          h(
            "td",
            { class: "sl-num" },
            h("div", { text: e.input_rows === null || e.input_rows === undefined ? "—" : `${fmtInt(e.input_rows)} in` }),
            rowsOut ? h("div", { class: "sl-muted", text: `→ ${rowsOut}` }) : null,
          ),
          h("td", { class: "sl-dur" }, total ? segmentBar(parts, longest) : null, h("div", { text: durText }), top ? h("div", { class: "sl-muted", text: top }) : null),
          h("td", { class: "sl-offsets" }, offsets.map((o) => h("div", { text: o }))),
        ),
      );
      if (open) body.append(epochDetail(e, parts, headers.length));
    }
    const table = h(
      "table",
      { class: "sl-table sl-epochs-table" },
      h("thead", {}, h("tr", {}, headers.map((t) => h("th", { text: t })))),
      body,
    );
    timeline.replaceChildren(table);
  }

  function renderSample() {
    const graph = model.get("graph") || { nodes: [] };
    const samples = model.get("samples") || {};
    const selected = model.get("selected_node");
    const names = (graph.nodes || []).filter((n) => n.kind !== "sink").map((n) => n.name);
    for (const name of Object.keys(samples)) if (!names.includes(name)) names.push(name);
    const kinds = Object.fromEntries((graph.nodes || []).map((n) => [n.name, n.kind]));
    select.replaceChildren(
      ...names.map((n) => h("option", { value: n, text: kinds[n] ? `${n} (${kinds[n]})` : n, selected: n === selected })),
    );
    select.value = selected;
    const smp = samples[selected];
    if (!smp) {
      sampleMeta.textContent = "";
      sample.replaceChildren(h("div", { class: "sl-empty", text: selected ? `no rows sampled from ${selected} yet` : "no node selected" }));
      return;
    }
    const count = smp.count === null || smp.count === undefined ? "" : ` · ${fmtInt(smp.count)} rows in the batch`;
    sampleMeta.textContent = `epoch #${smp.epoch}${count} · showing ${smp.rows.length} · ${fmtClock(smp.at)}`;
    if (!smp.rows.length) {
      sample.replaceChildren(h("div", { class: "sl-empty", text: `epoch #${smp.epoch} of ${selected} had no rows` }));
      return;
    }
    const types = smp.types || [];
    const numeric = smp.columns.map((c) => smp.rows.every((r) => r[c] === null || typeof r[c] === "number"));
    const head = h(
      "tr",
      {},
      smp.columns.map((c, i) =>
        h("th", { class: numeric[i] ? "sl-num" : "", title: types[i] || "" }, c, types[i] ? h("div", { class: "sl-type", text: types[i] }) : null),
      ),
    );
    const body = h(
      "tbody",
      {},
      smp.rows.map((row) =>
        h(
          "tr",
          { "data-testid": "sl-sample-row" },
          smp.columns.map((c) => {
            const v = fmtValue(row[c]);
            return v === null
              ? h("td", { class: "sl-null", text: "null" })
              : h("td", { class: typeof row[c] === "number" ? "sl-num" : "", title: v.length > 40 ? v : null, text: truncate(v, 40) });
          }),
        ),
      ),
    );
    sample.replaceChildren(h("table", { class: "sl-table sl-sample-table" }, h("thead", {}, head), body));
  }

  function renderCharts() {
    ratesTab.classList.toggle("sl-tab-on", chart === "rates");
    durationsTab.classList.toggle("sl-tab-on", chart === "durations");
    rateLegend.hidden = chart !== "rates";
    rates.dataset.testid = chart === "rates" ? "sl-rate-chart" : "sl-duration-chart";
    if (chart === "rates") renderRates();
    else renderDurations();
  }

  function renderDurations() {
    const epochs = (model.get("epochs") || []).filter((e) => e.state === "finalized").slice(-30);
    if (!epochs.length) {
      rates.replaceChildren(h("div", { class: "sl-empty", text: "waiting for the first finalized epoch" }));
      return;
    }
    const W = 460;
    const H = 180;
    const m = { l: 46, r: 12, t: 10, b: 24 };
    const svg = s("svg", { class: "sl-rate-svg", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "batch duration per epoch" });
    const top = Math.max(1, ...epochs.map(epochTotal));
    const step = Math.pow(10, Math.floor(Math.log10(top)));
    const ymax = Math.ceil(top / step) * step;
    const y = (v) => H - m.b - (v / ymax) * (H - m.t - m.b);
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      svg.append(
        s("line", { class: "sl-grid-line", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }),
        s("text", { class: "sl-axis", x: m.l - 6, y: y(v) + 3, "text-anchor": "end", text: v >= 1000 ? `${+(v / 1000).toFixed(1)} s` : `${Math.round(v)} ms` }),
      );
    }
    const slot = (W - m.l - m.r) / epochs.length;
    const barW = Math.max(2, Math.min(24, slot * 0.7));
    const seen = new Map();
    epochs.forEach((e, i) => {
      const x = m.l + i * slot + (slot - barW) / 2;
      let acc = 0;
      for (const p of breakdown(e)) {
        seen.set(p.key, p.key === "sink" ? "sinks" : p.label);
        svg.append(
          s("rect", { class: `sl-seg sl-seg-${p.key}`, x: x.toFixed(1), width: barW.toFixed(1), y: y(acc + p.ms).toFixed(1), height: Math.max(0, y(acc) - y(acc + p.ms)).toFixed(1) },
            s("title", { text: `#${e.epoch} ${p.label}: ${fmtMs(p.ms)}` })),
        );
        acc += p.ms;
      }
    });
    svg.append(
      s("text", { class: "sl-axis", x: m.l, y: H - 6, text: `#${epochs[0].epoch}` }),
      s("text", { class: "sl-axis", x: W - m.r, y: H - 6, "text-anchor": "end", text: `#${epochs[epochs.length - 1].epoch}` }),
      s("text", { class: "sl-axis", x: (W + m.l - m.r) / 2, y: H - 6, "text-anchor": "middle", text: "Spark batch time per finalized epoch" }),
    );
    const legend = h("div", { class: "sl-seg-legend" }, [...seen].map(([key, label]) => h("span", {}, h("span", { class: `sl-swatch sl-seg-${key}` }), label)));
    rates.replaceChildren(svg, legend);
  }

  function renderRates() {
    const points = model.get("rates") || [];
    const W = 460;
    const H = 180;
    const m = { l: 46, r: 12, t: 10, b: 24 };
    const svg = s("svg", { class: "sl-rate-svg", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "input and processing rate" });
    const last = points[points.length - 1];
    rateLegend.replaceChildren(
      h("span", { class: "sl-key sl-key-input" }, "input ", h("strong", { text: last ? fmtRate(last.input) : "—" })),
      h("span", { class: "sl-key sl-key-processing" }, "processing ", h("strong", { text: last ? fmtRate(last.processing) : "—" })),
    );
    if (!points.length) {
      rates.replaceChildren(h("div", { class: "sl-empty", text: "waiting for the first finalized epoch" }));
      return;
    }
    let t0 = Math.min(...points.map((p) => p.t));
    let t1 = Math.max(...points.map((p) => p.t));
    if (t1 - t0 < 1) {
      t0 -= 1;
      t1 += 1;
    }
    const top = Math.max(1, ...points.map((p) => Math.max(p.input || 0, p.processing || 0)));
    const step = Math.pow(10, Math.floor(Math.log10(top)));
    const ymax = Math.ceil(top / step) * step;
    const x = (t) => m.l + ((t - t0) / (t1 - t0)) * (W - m.l - m.r);
    const y = (v) => H - m.b - (v / ymax) * (H - m.t - m.b);
    for (let i = 0; i <= 4; i++) {
      const v = (ymax * i) / 4;
      svg.append(
        s("line", { class: "sl-grid-line", x1: m.l, x2: W - m.r, y1: y(v), y2: y(v) }),
        s("text", { class: "sl-axis", x: m.l - 6, y: y(v) + 3, "text-anchor": "end", text: fmtCompact(v) }),
      );
    }
    svg.append(
      s("text", { class: "sl-axis", x: m.l, y: H - 6, text: fmtClock(t0) }),
      s("text", { class: "sl-axis", x: W - m.r, y: H - 6, "text-anchor": "end", text: fmtClock(t1) }),
      s("text", { class: "sl-axis", x: (W + m.l - m.r) / 2, y: H - 6, "text-anchor": "middle", text: "rows/s per finalized epoch" }),
    );
    const flows = [...new Set(points.map((p) => p.flow))];
    flows.forEach((flow, fi) => {
      const mine = points.filter((p) => p.flow === flow);
      for (const key of ["input", "processing"]) {
        const pts = mine.map((p) => `${x(p.t).toFixed(1)},${y(p[key] || 0).toFixed(1)}`).join(" ");
        svg.append(s("polyline", { class: `sl-line sl-line-${key}`, points: pts, "stroke-dasharray": fi ? "4 3" : null }, s("title", { text: `${flow} ${key}` })));
        const lp = mine[mine.length - 1];
        svg.append(s("circle", { class: `sl-dot sl-line-${key}`, cx: x(lp.t), cy: y(lp[key] || 0), r: 3 }));
      }
    });
    rates.replaceChildren(svg);
  }

  function send(content) {
    try {
      sendToKernel(model, content);
    } catch (err) {
      live = false; // no kernel behind the model
      renderHead();
    }
  }
  function onMessage(msg) {
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "pong") {
      live = true;
      renderHead();
    } else if (msg.type === "selected") {
      select.dataset.kernelSelected = msg.node; // what the kernel samples for and restarts with
    } else if (msg.type === "progress") {
      progressJson[`${msg.flow}\u0000${msg.epoch}`] = msg.json;
      renderEpochs();
    }
  }
  model.on("msg:custom", onMessage);
  // The kernel's heartbeat while a run feeds this widget: live even when the kernel is too busy
  // (Run All, a waiting cell) to answer the ping.
  function onBeat() {
    if (live !== true) {
      live = true;
      renderHead();
      renderEpochs();
    }
  }
  model.on("change:beat", onBeat);
  send({ action: "ping" });
  const pingTimer = setTimeout(() => {
    if (live === null) {
      live = false;
      renderHead();
      renderEpochs();
    }
  }, 5000);
  stopButton.addEventListener("click", () => {
    stopButton.disabled = true;
    send({ action: "stop" });
  });
  restartButton.addEventListener("click", () => {
    restartButton.disabled = true;
    stopButton.disabled = true;
    send({ action: "restart" });
  });
  ratesTab.addEventListener("click", () => ((chart = "rates"), renderCharts()));
  durationsTab.addEventListener("click", () => ((chart = "durations"), renderCharts()));

  // A node choice shows at once here, and reaches the kernel the way the buttons do (the control
  // channel, read while a cell keeps the kernel busy), numbered so that it applies in order.
  const view = `${Date.now()}-${Math.random()}`;
  let selectSeq = 0;
  function choose(name) {
    model.set("selected_node", name);
    send({ action: "select", node: name, view, seq: ++selectSeq });
  }
  select.addEventListener("change", () => choose(select.value));

  const handlers = [
    ["change:title change:status change:error change:controls", renderHead],
    ["change:graph", () => (renderDag(), renderSample())],
    ["change:node_stats", renderStats],
    ["change:epochs", () => (renderEpochs(), renderHead(), chart === "durations" && renderDurations())],
    ["change:samples", renderSample],
    ["change:selected_node", () => (renderSelection(), renderSample())],
    ["change:rates", () => chart === "rates" && renderRates()],
  ];
  for (const [events, fn] of handlers) for (const name of events.split(" ")) model.on(name, fn);

  renderHead();
  renderDag();
  renderEpochs();
  renderSample();
  renderCharts();

  return () => {
    clearTimeout(pingTimer);
    model.off("msg:custom", onMessage);
    model.off("change:beat", onBeat);
    for (const [events, fn] of handlers) for (const name of events.split(" ")) model.off(name, fn);
    select.removeEventListener("change", onSelect);
  };
}

export default { render };
