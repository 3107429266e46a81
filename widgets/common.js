// What the streamling widgets share (prepended to each widget's ESM by streamling.notebook.widget,
// since an anywidget module is one file): DOM and SVG element builders, and formatters both use.
// Text is always set through textContent, never parsed as HTML.

const SVG_NS = "http://www.w3.org/2000/svg";

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c);
  return el;
}

// A UNIX time (seconds) as the viewer's local time of day, hh:mm:ss.
function fmtClock(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((x) => String(x).padStart(2, "0")).join(":");
}

// A moment as the reader's local date and time to the minute ("2026-11-28 04:01"): when a saved
// widget's run took place, which may be days before it is reopened.
function fmtWhen(t) {
  if (!t) return "";
  const d = new Date(t * 1000);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`;
}

// A request to the widget's kernel (a button, a ping, a download). Where the front end exposes the
// kernel connection (JupyterLab), it goes on the kernel's control channel, which the kernel reads in
// a thread of its own even while a cell runs (Run All, `%streamling wait`); elsewhere, or if the
// kernel does not know the widget, it is a comm message, read between cells. Answers come back as
// the widget's custom messages either way. Throws only when neither route is open (no kernel).
function sendToKernel(model, content) {
  const token = model.get("control_token");
  const manager = model.widget_manager;
  const kernel = manager ? manager.kernel : null;
  if (token && kernel && typeof kernel.sendControlMessage === "function") {
    try {
      const id = globalThis.crypto && crypto.randomUUID ? crypto.randomUUID() : `sl-${Date.now()}-${Math.random()}`;
      const msg = {
        header: {
          msg_id: id, msg_type: "streamling_control_request", session: kernel.clientId,
          username: kernel.username || "", date: new Date().toISOString(), version: "5.3",
        },
        parent_header: {}, metadata: {}, content: { token, request: content }, channel: "control", buffers: [],
      };
      const future = kernel.sendControlMessage(msg, true, true);
      future.onReply = (reply) => {
        if (!reply || !reply.content || reply.content.status !== "ok") model.send(content);
      };
      future.done.catch(() => {});
      return;
    } catch (err) {
      // a kernel connection that refuses control messages: the comm below
    }
  }
  model.send(content);
}
