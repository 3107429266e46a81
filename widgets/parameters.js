// parameters: a notebook's dbutils.widgets as input controls (streamling.notebook.parameter_bar).
// Drawn in the bar above the notebook's cells when the page offers one (streamling's JupyterLab
// extension defines window.streamlingParameterBar), else in the declaring cell. Every view shows the
// same model: a value changed in one is the kernel's, and every other view's, at once.

let paramListIds = 0;

/** One widget's label and input control; a change sets the model's values (the kernel reads them). */
function paramControl(model, control) {
  const current = String((model.get("values") || {})[control.name] ?? "");
  const set = (value) => {
    model.set("values", { ...(model.get("values") || {}), [control.name]: value });
    model.save_changes();
  };
  const attrs = { class: "sl-param-input", "data-testid": "sl-param-input", "aria-label": control.label };
  let input;
  let extra = null;
  if (control.kind === "dropdown" || control.kind === "multiselect") {
    const multiple = control.kind === "multiselect";
    const picked = new Set(multiple ? current.split(",").map((v) => v.trim()) : [current]);
    input = h("select", {
      ...attrs, multiple, size: multiple ? Math.min(4, control.choices.length) : undefined,
      onchange: (e) => set([...e.target.selectedOptions].map((o) => o.value).join(",")),
    }, control.choices.map((c) => h("option", { value: c, selected: picked.has(c), text: c })));
  } else {
    const list = control.kind === "combobox" ? `sl-param-choices-${++paramListIds}` : undefined;
    input = h("input", { ...attrs, type: "text", value: current, list, onchange: (e) => set(e.target.value) });
    if (list) extra = h("datalist", { id: list }, control.choices.map((c) => h("option", { value: c })));
  }
  return h("label", { class: "sl-param", "data-testid": "sl-param", "data-name": control.name,
    "data-kind": control.kind }, h("span", { class: "sl-param-label", text: control.label }), input, extra);
}

/** Every declared widget's control, into ``node`` (replacing what it held). */
function drawParams(model, node) {
  const controls = model.get("controls") || [];
  node.replaceChildren(h("div", { class: "sl-params", "data-testid": "sl-params" },
    controls.length ? controls.map((c) => paramControl(model, c))
      : h("span", { class: "sl-params-none", text: "no parameters" })));
}

function render({ model, el }) {
  el.classList.add("sl-params-cell");
  let claim = null; // this view's place in the bar above the cells, once it has one
  const draw = () => (claim ? claim.redraw() : drawParams(model, el));
  const place = () => {
    const bar = typeof window.streamlingParameterBar === "function" ? window.streamlingParameterBar(el) : null;
    if (!bar) return;
    claim = bar.claim((node) => drawParams(model, node));
    el.replaceChildren(h("div", { class: "sl-params-note", "data-testid": "sl-params-note",
      text: "parameters: in the bar above the notebook's cells" }));
  };
  drawParams(model, el);
  // An output is drawn before the page holds it: look for the bar once it does (or give up).
  let frames = 0;
  const settle = () => {
    if (el.isConnected) place();
    else if (++frames < 120) requestAnimationFrame(settle);
  };
  requestAnimationFrame(settle);
  model.on("change:controls", draw);
  model.on("change:values", draw);
  return () => {
    model.off("change:controls", draw);
    model.off("change:values", draw);
    if (claim) claim.release();
  };
}

export default { render };
