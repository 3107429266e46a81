// streamling-magics: SQL, YAML and JavaScript/TypeScript highlighting of `%%streamling` cells in
// JupyterLab 4 and Notebook 7, and the bar above a notebook's cells where its dbutils.widgets show.
//
// A prebuilt federated extension written by hand: no build step, no bundled code. JupyterLab loads
// this file as a plain <script> (package.json names it in jupyterlab._build.load) and uses the
// webpack-style container it leaves on window._JUPYTERLAB["streamling-magics"]: init(shareScope)
// with the modules JupyterLab shares, then get("./extension") for a factory whose result's
// `default` is the plugin. The plugin's tokens are taken from the shared @jupyterlab/notebook and
// @jupyterlab/codemirror, the very instances JupyterLab's own plugins provide.
//
// A code cell's editor language follows its model's mimeType. The notebook sets every code cell to
// the kernel's mimetype (text/x-ipython) when a cell is inserted and when the kernel's language_info
// arrives; this plugin sets it again, after the notebook, for cells that start with `%%streamling`.
//
// Files under static/ are served as immutable (cached for a year), so the name carries a hash of
// the content: after an edit, rename the file to remoteEntry.<first 16 hex digits of its sha256>.js
// and update package.json (tests/browser/test_editor_browser.py checks both; `fixtures/dev setup`
// copies the extension into the venv).

(() => {
  "use strict";

  const NAME = "streamling-magics";

  // Mimetypes the JupyterLab 4 language registry knows (@jupyterlab/codemirror's default languages;
  // TypeScript is only application/typescript there).
  const SQL = "text/x-sql";
  const YAML = "text/x-yaml";
  const JAVASCRIPT = "text/javascript";
  const TYPESCRIPT = "application/typescript";

  // The cell line's options (src/streamling/notebook/cells.py parser()) and how many values each takes.
  const OPTIONS = {
    from: 1, type: 1, language: 1, option: 1, rows: 1, seconds: 1, timeout: 1, sample: 1,
    wait: 0, expect: 2, "on-violation": 1,
  };

  /** Split a magic's line roughly as shlex does: whitespace separates, quotes group and are dropped. */
  function words(line) {
    const tokens = line.match(/(?:"(?:\\.|[^"\\])*"|'[^']*'|[^\s"']+)+/g) || [];
    return tokens.map((t) => t.replace(/"((?:\\.|[^"\\])*)"|'([^']*)'/g,
      (_, dq, sq) => (dq !== undefined ? dq.replace(/\\(.)/g, "$1") : sq)));
  }

  /** command, --type and --language of a `%%streamling` line (argparse also takes unique prefixes). */
  function parseLine(rest) {
    const positional = [];
    const values = {};
    const tokens = words(rest);
    for (let i = 0; i < tokens.length; i++) {
      const token = tokens[i];
      if (!token.startsWith("--") || token === "--") {
        positional.push(token);
        continue;
      }
      const [given, inline] = token.slice(2).split(/=(.*)/s);
      const matches = given in OPTIONS ? [given] : Object.keys(OPTIONS).filter((o) => o.startsWith(given));
      const option = matches.length === 1 ? matches[0] : null;
      const arity = option ? OPTIONS[option] : 0;
      if (inline !== undefined) values[option] = inline;
      else if (arity > 0) {
        values[option] = tokens[i + 1];
        i += arity;
      }
    }
    return { command: positional[0], type: values.type, language: values.language };
  }

  /** The mimetype of a `%%streamling` cell's body, or null when the source is no such cell. */
  function bodyMimeType(source) {
    // IPython drops leading blank lines and indentation before looking for a cell magic.
    const line = source.trimStart().split(/\r?\n/, 1)[0];
    const magic = /^%%streamling(?=\s|$)/.exec(line);
    if (!magic) return null;
    const { command, type, language } = parseLine(line.slice(magic[0].length));
    if (command === "source" || command === "sink" || command === "pipeline") return YAML;
    if (command !== "transform") return null;
    const kind = type ?? "sql";
    if (kind === "sql") return SQL;
    if (kind === "script") return /^(ts|typescript)$/i.test((language ?? "").trim()) ? TYPESCRIPT : JAVASCRIPT;
    return YAML; // a transform of any other type is written as its YAML keys
  }

  const nextTask = () => new Promise((resolve) => setTimeout(resolve));

  function activate(app, tracker, languages) {
    if (!tracker) return; // a page without notebooks
    const followed = new WeakSet(); // cell models whose source changes are followed
    const ours = new WeakSet(); // cell models whose mimetype this plugin set

    // The mimetype a code cell should have now, or null to leave it as it is.
    const target = (notebook, model) =>
      bodyMimeType(model.sharedModel.getSource()) ?? (ours.has(model) ? notebook.codeMimetype : null);

    async function update(notebook, model) {
      if (model.type !== "code") return;
      const first = target(notebook, model);
      if (!first || first === model.mimeType) return;
      // An editor applies each mimetype's language once it has loaded, not the last one set: wait
      // until the one just set (e.g. the notebook's text/x-ipython, loaded for the first time) is in
      // place, or it would replace ours.
      await languages?.getLanguage(model.mimeType).catch(() => null);
      await nextTask();
      if (model.isDisposed) return;
      const wanted = target(notebook, model);
      if (!wanted || wanted === model.mimeType) return;
      if (wanted === notebook.codeMimetype) ours.delete(model);
      else ours.add(model);
      model.mimeType = wanted;
    }

    function watch(panel) {
      const notebook = panel.content;
      // Every code cell, once each signal that may have just reset them has reached all handlers,
      // the notebook's own included.
      let pending = false;
      const schedule = () => {
        if (pending) return;
        pending = true;
        queueMicrotask(() => {
          pending = false;
          if (notebook.isDisposed) return;
          for (const cell of notebook.widgets) {
            const model = cell.model;
            if (!followed.has(model)) {
              followed.add(model);
              model.sharedModel.changed.connect((_, change) => change.sourceChange && schedule());
            }
            update(notebook, model).catch((error) => console.warn(`${NAME}: cell not updated`, error));
          }
        });
      };

      let model = null;
      const attach = () => {
        if (model === notebook.model) return;
        if (model) {
          model.cells.changed.disconnect(schedule);
          model.metadataChanged.disconnect(schedule);
        }
        model = notebook.model;
        if (model) {
          model.cells.changed.connect(schedule); // inserted cells get the notebook's mimetype
          model.metadataChanged.connect(schedule); // language_info: the kernel (or its language) changed
        }
        schedule();
      };
      notebook.modelChanged.connect(attach);
      attach();
    }

    tracker.forEach(watch);
    tracker.widgetAdded.connect((_, panel) => watch(panel));
  }

  // The parameters bar: as on Databricks, a notebook's dbutils.widgets (streamling's ParameterBar
  // widget, widgets/parameters.js) are drawn above its cells, whichever cell declared them. The
  // widget's views call window.streamlingParameterBar(theirElement) once the page holds them: null
  // outside a notebook panel (they then draw in their cell), else a handle to claim the bar with. The
  // latest claim draws there; when its view goes (its output cleared), the one before it does again.
  function activateBar(app, tracker) {
    if (!tracker) return;
    const bars = new WeakMap(); // notebook panel -> { bar, claims }

    function barOf(panel) {
      let state = bars.get(panel);
      if (!state) {
        // A panel of the header's own class (a Lumino BoxPanel, a widget like any): no second copy of
        // Lumino is loaded for it, and the bar holds plain elements, no child widgets.
        const bar = new panel.contentHeader.constructor();
        bar.addClass("sl-params-bar");
        bar.node.dataset.testid = "sl-params-bar";
        bar.hide();
        panel.contentHeader.addWidget(bar);
        state = { bar, claims: [] };
        bars.set(panel, state);
      }
      return state;
    }

    function update(panel, state) {
      const { bar, claims } = state;
      const top = claims[claims.length - 1];
      if (!top) {
        bar.node.replaceChildren();
        bar.hide();
      } else {
        top.draw(bar.node);
        bar.show();
        // The header's layout sizes the bar from its minimum height: the height of what it holds,
        // with its padding and border (the bar is border-box).
        const style = getComputedStyle(bar.node);
        const frame = ["paddingTop", "paddingBottom", "borderTopWidth", "borderBottomWidth"]
          .reduce((sum, key) => sum + (parseFloat(style[key]) || 0), 0);
        const content = bar.node.firstElementChild ? bar.node.firstElementChild.offsetHeight : 0;
        bar.node.style.minHeight = `${Math.ceil(content + frame)}px`;
      }
      panel.contentHeader.fit();
    }

    window.streamlingParameterBar = (el) => {
      const panel = tracker.find((p) => p.node.contains(el));
      if (!panel || !panel.contentHeader || panel.isDisposed) return null;
      const state = barOf(panel);
      return {
        claim(draw) {
          const claim = {
            draw,
            redraw: () => state.claims[state.claims.length - 1] === claim && update(panel, state),
            release: () => {
              const at = state.claims.indexOf(claim);
              if (at >= 0) state.claims.splice(at, 1);
              if (!panel.isDisposed) update(panel, state);
            },
          };
          state.claims.push(claim);
          update(panel, state);
          return claim;
        },
      };
    };
  }

  // The container protocol JupyterLab's bootstrap and main() use (webpack module federation).
  let shareScope = {};

  /** A package JupyterLab shares: its core packages are singletons, so the loaded (else newest) copy. */
  async function importShared(name) {
    const versions = Object.entries(shareScope[name] ?? {});
    if (!versions.length) throw new Error(`${NAME}: JupyterLab shares no ${name}`);
    versions.sort(([a, x], [b, y]) => !!y.loaded - !!x.loaded || b.localeCompare(a, undefined, { numeric: true }));
    const factory = await versions[0][1].get();
    return factory();
  }

  const containers = (window._JUPYTERLAB = window._JUPYTERLAB || {});
  containers[NAME] = {
    init(scope) {
      shareScope = scope;
    },
    async get(module) {
      if (module !== "./extension") throw new Error(`Module "${module}" does not exist in container ${NAME}.`);
      const [notebook, codemirror] = await Promise.all(
        [importShared("@jupyterlab/notebook"), importShared("@jupyterlab/codemirror")]);
      const plugins = [{
        id: `${NAME}:highlight`,
        description: "Highlights the body of %%streamling cells as SQL, YAML, JavaScript or TypeScript.",
        autoStart: true,
        optional: [notebook.INotebookTracker, codemirror.IEditorLanguageRegistry],
        activate,
      }, {
        id: `${NAME}:parameters-bar`,
        description: "Shows a notebook's dbutils.widgets in a bar above its cells.",
        autoStart: true,
        optional: [notebook.INotebookTracker],
        activate: activateBar,
      }];
      return () => ({ __esModule: true, default: plugins });
    },
  };
})();
