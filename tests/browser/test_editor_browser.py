"""Syntax highlighting of ``%%streamling`` cells in a real JupyterLab (widgets/labextension).

Notebooks with a SQL transform, a YAML source, script transforms and plain Python cells are opened,
never run: the plugin works on the cell sources alone. Their kernels still start (the lab's settings
start them), and each kernel's language_info sets every code cell back to Python once: the test
waits for that, so it also checks that the plugin sets the cells' languages again afterwards. A
Python cell is then typed into a SQL cell and back, and a second notebook is opened from the file
browser. Screenshot in ``tests/artifacts/editor.png``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import pytest
from browser_lab import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, ROOT, Lab, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

EXTENSION = ROOT / "widgets" / "labextension"
INSTALLED = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "streamling-magics"

PYTHON, SQL, YAML, SCRIPT, TYPESCRIPT, EDITED = range(6)
CELLS = [
    "import os\nfor x in range(3):\n    print(x)",
    "%%streamling transform big --from orders\nSELECT id, amount FROM orders WHERE amount > 100",
    "%%streamling source orders\ntype: generate\nrows_per_second: 2000",
    '%%streamling transform tagged --from big --type script\nfunction process(row) { return {...row, tag: "big"}; }',
    "%%streamling transform typed --from big --type script --language typescript\n"
    "function process(row: any): any { return row; }",
    'print("plain")',
]

LATER = ["%%streamling sink out --from big\ntype: blackhole", "%%streamling transform t\nSELECT 1", "import os"]

# The code cells of the notebook in front (another tab's panel is hidden).
CELLS_IN_FRONT = "document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')"
# The editor's language (CodeMirror sets data-language on its content) and its highlighted spans.
READ_CELL = """cell => ({
  language: cell.querySelector('.cm-content').dataset.language || null,
  spans: [...cell.querySelectorAll('.cm-content .cm-line span')].map(s => [s.textContent, s.className]),
})"""


def test_the_extension_is_installed_as_committed() -> None:
    """The file JupyterLab loads is the committed one, under a name that changes with its content.

    Static files of lab extensions are served as immutable, so an edited file under an old name
    would stay cached in browsers.
    """
    package = json.loads((EXTENSION / "package.json").read_text())
    entry = EXTENSION / package["jupyterlab"]["_build"]["load"]
    digest = hashlib.sha256(entry.read_bytes()).hexdigest()[:16]
    assert entry.name == f"remoteEntry.{digest}.js", (
        f"rename {entry.name} to remoteEntry.{digest}.js and update package.json's jupyterlab._build.load")
    assert [p.name for p in (EXTENSION / "static").iterdir()] == [entry.name], "one remoteEntry, the one loaded"
    committed = sorted(p.relative_to(EXTENSION) for p in EXTENSION.rglob("*") if p.is_file())
    installed = sorted(p.relative_to(INSTALLED) for p in INSTALLED.rglob("*") if p.is_file())
    assert installed == committed and all(
        (INSTALLED / p).read_bytes() == (EXTENSION / p).read_bytes() for p in committed), (
        f"{INSTALLED} differs from widgets/labextension: run fixtures/dev setup")


def test_streamling_cells_are_highlighted_in_their_body_language(lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    # Neither names its language (as a saved notebook would in language_info): their code cells turn
    # Python only when their kernel answers, the first time loading the Python language.
    write_notebook(lab.root / "editor.ipynb", CELLS)
    write_notebook(lab.root / "later.ipynb", LATER)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "editor.png"
    shot.unlink(missing_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")

        def read(index: int) -> dict:
            return cells.nth(index).evaluate(READ_CELL)

        def wait_language(index: int, language: str) -> dict:
            page.wait_for_function(f"([i, lang]) => {CELLS_IN_FRONT}[i]?.querySelector('.cm-content')"
                                   "?.dataset.language === lang", arg=[index, language], timeout=20_000)
            return read(index)

        def classes(cell: dict, text: str) -> set[str]:
            found = {cls for t, cls in cell["spans"] if t == text}
            assert found, f"no highlighted span {text!r} in {cell}"
            return found

        def replace_source(index: int, lines: list[str]) -> None:
            cells.nth(index).locator(".cm-content").click()
            page.keyboard.press("ControlOrMeta+a")
            for n, line in enumerate(lines):
                if n:
                    page.keyboard.press("Enter")
                page.keyboard.type(line)

        try:
            started = time.monotonic()
            page.goto(lab.open_url("editor.ipynb"))
            cells.nth(len(CELLS) - 1).locator(".cm-content").wait_for(timeout=60_000)
            page.get_by_text("| Idle").wait_for(timeout=120_000)
            python = wait_language(PYTHON, "python")  # the kernel's language_info reached the cells
            page.wait_for_timeout(1_000)
            keyword = classes(python, "import")
            assert len(keyword) == 1 and classes(python, "for") == keyword, python
            sql = wait_language(SQL, "sql")
            assert classes(sql, "SELECT") == classes(sql, "WHERE") == keyword, sql

            yaml = wait_language(YAML, "yaml")
            key = classes(yaml, "type")
            assert key != keyword and classes(yaml, "rows_per_second") == key, yaml
            assert "generate" not in [t for t, cls in yaml["spans"] if cls in key], yaml  # a value, not a key

            script = wait_language(SCRIPT, "javascript")
            assert classes(script, "function") == classes(script, "return") == keyword, script
            typescript = wait_language(TYPESCRIPT, "typescript")
            assert classes(typescript, "function") == keyword, typescript
            assert read(EDITED)["language"] == "python"

            # Typing a cell magic into a Python cell switches it to SQL; removing it switches back.
            replace_source(EDITED, ["%%streamling transform x", "SELECT 1"])
            edited = wait_language(EDITED, "sql")
            assert classes(edited, "SELECT") == keyword, edited
            page.keyboard.press("Escape")  # command mode: no cursor in the screenshot
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").screenshot(path=str(shot))
            replace_source(EDITED, ["import sys"])
            edited = wait_language(EDITED, "python")
            assert classes(edited, "import") == keyword, edited
            assert read(SQL)["language"] == "sql"
            opened = time.monotonic()

            # A notebook opened later: the plugin follows it too.
            page.keyboard.press("Escape")
            page.get_by_text("later.ipynb", exact=True).dblclick()
            page.wait_for_function(f"() => {CELLS_IN_FRONT}.length === {len(LATER)}", timeout=30_000)
            wait_language(2, "python")
            page.wait_for_timeout(1_000)
            assert wait_language(0, "yaml")["language"] == "yaml"
            assert classes(wait_language(1, "sql"), "SELECT") == keyword
            print(f"editor timings (s): first notebook {opened - started:.0f}, "
                  f"second notebook {time.monotonic() - opened:.0f}")
        except Exception as exc:
            page.screenshot(path=str(ARTIFACTS / "editor-failure.png"), full_page=True)
            raise AssertionError(f"{exc}\n\nJupyterLab log:\n{lab.log_tail()}") from exc
        finally:
            browser.close()
    assert not errors, errors
    assert shot.stat().st_size > 5_000
