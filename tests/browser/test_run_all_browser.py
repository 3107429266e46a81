"""Run All in a real JupyterLab stops at the first failing ``%%streamling`` cell, whatever its kind,
and a committed notebook opened as on a fresh clone shows its saved monitor as a static snapshot.
A notebook's ``dbutils.widgets`` show in a bar above its cells, and a value changed there is what the
next ``%%streamling`` cell reads.

The failures here are found when the cell runs, before any Spark session: a YAML cell that does not
parse, SQL that does not parse, a script that does not load. Each notebook holds a valid definition
of the node first, so the test also sees that the failed cell did not replace it.
"""

from __future__ import annotations

import re
import shutil

import pytest
from browser_lab import ARTIFACTS, ROOT, Lab, browser_page, run_all, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

SOURCE = "%%streamling source orders\ntype: generate\nrows: 10"
#: kind -> (a good cell, the same node's failing cell, the error's start, what `yaml` shows after it)
FAILING = {
    "yaml": ("%%streamling sink out --from orders\ntype: print", "%%streamling sink out --from orders\ntype: [print",
             "Node 'out': the cell body is not valid YAML", "type: print"),
    "sql": ("%%streamling transform big --from orders\nSELECT id FROM orders",
            "%%streamling transform big --from orders\nSELEC id FROM orders", "Node 'big': SQL does not parse",
            "SELECT id FROM orders"),
    "script": ("%%streamling transform tagged --from orders --type script\n"
               "function process(row) { return {...row, tag: 'a'}; }",
               "%%streamling transform tagged --from orders --type script\nfunction process(row) { return {...row ; }",
               "Node 'tagged': the script does not load: SyntaxError", "tag: 'a'"),
}
FAILING_CELL = 3
PROMPTS = "() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')].map(c => " \
          "c.querySelector('.jp-InputPrompt').textContent.trim())"


def _notebook(kind: str) -> list[str]:
    good, bad, _, _ = FAILING[kind]
    return ["%load_ext streamling", SOURCE, good, bad, "print('after the failure')",
            "%streamling yaml"]


def test_run_all_stops_at_the_first_failing_cell_of_every_kind_and_a_fresh_clone_shows_a_snapshot(
        lab: Lab) -> None:
    for kind in FAILING:
        write_notebook(lab.root / f"{kind}.ipynb", _notebook(kind))
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", lab.root / "quickstart.ipynb")
    with browser_page(lab, "run-all-failure.png") as page:
        for kind, (_, bad, message, kept) in FAILING.items():
            run_all(page, lab, f"{kind}.ipynb")
            failed = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(FAILING_CELL)
            error = failed.locator("[data-mime-type='application/vnd.jupyter.stderr']")
            error.wait_for(timeout=120_000)
            assert error.inner_text().strip().startswith(f"PipelineError: {message}"), error.inner_text()
            page.wait_for_function(f"() => !({PROMPTS})().some(p => p.includes('*'))", timeout=60_000)
            prompts = page.evaluate(f"({PROMPTS})()")
            # every cell up to the failing one ran; none after it did
            assert all(any(ch.isdigit() for ch in p) for p in prompts[:FAILING_CELL + 1]), (kind, prompts)
            assert not any(any(ch.isdigit() for ch in p) for p in prompts[FAILING_CELL + 1:]), (kind, prompts)
            # the failed cell changed nothing: running the yaml cell shows the good definition
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(len(prompts) - 1).locator(
                ".jp-InputArea-editor").click()
            page.keyboard.press("Shift+Enter")
            shown = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").nth(len(prompts) - 1)
            shown.locator(".jp-OutputArea-output").first.wait_for(timeout=60_000)
            text = shown.locator(".jp-OutputArea-output").first.inner_text()
            assert kept in text and bad.splitlines()[1] not in text, text

        # The committed quickstart as a fresh clone opens it: not trusted, so JupyterLab shows the
        # monitor's HTML fallback, which is the end of its run.
        page.goto(lab.open_url("quickstart.ipynb"))
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        fallback = page.locator(".jp-OutputArea-output", has_text="streamling monitor: quickstart").first
        fallback.wait_for(timeout=60_000)
        text = fallback.inner_text()
        assert "status: stopped" in text and "running" not in text, text
        assert re.search(r"lake\s+sink\s+delta\s+\d+", text), text
        # Trusted, the widget itself renders from the saved state: a static snapshot.
        lab.trust("quickstart.ipynb")
        page.goto(lab.open_url("quickstart.ipynb"))
        monitor = page.locator("[data-testid=sl-monitor]")
        monitor.wait_for(timeout=60_000)
        page.locator("[data-testid=sl-live][data-live=false]").wait_for(timeout=30_000)
        status = monitor.locator("[data-testid=sl-status]").inner_text()
        assert status.startswith("stopped"), status
        assert int(monitor.locator("[data-testid=sl-node][data-node=lake]").get_attribute("data-rows") or 0) > 0
        assert monitor.locator("[data-testid=sl-stop]").is_hidden()
        assert monitor.locator("[data-testid=sl-epoch][data-state=finalized]").count() > 0


PARAMETERS = [
    "%load_ext streamling",
    'dbutils.widgets.text("region", "eu", "Region")\ndbutils.widgets.dropdown("size", "10", ["10", "20", "30"])',
    'dbutils.widgets.multiselect("kinds", "a", ["a", "b", "c"])',
    "%%streamling source orders\ntype: generate\nrows: {{size}}",
    "%streamling yaml",
    "print(sorted(dbutils.widgets.getAll().items()))",
]


def test_dbutils_widgets_show_above_the_cells_and_a_changed_value_is_what_the_next_cell_reads(lab: Lab) -> None:
    write_notebook(lab.root / "parameters.ipynb", PARAMETERS)
    cells = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell"
    with browser_page(lab, "parameters-failure.png") as page:
        run_all(page, lab, "parameters.ipynb")
        page.wait_for_function(f"() => !({PROMPTS})().some(p => p.includes('*') || !/\\d/.test(p))",
                               timeout=120_000)
        bar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) [data-testid=sl-params-bar]")
        bar.wait_for(timeout=30_000)
        # Every declared widget, whichever cell declared it, in one bar above the first cell.
        names = bar.locator("[data-testid=sl-param]").evaluate_all("els => els.map(e => e.dataset.name)")
        assert names == ["region", "size", "kinds"], names
        first_cell = page.locator(cells).first.bounding_box()
        box = bar.bounding_box()
        assert box and first_cell and box["height"] > 20 and box["y"] + box["height"] <= first_cell["y"] + 1, \
            (box, first_cell)
        for declaring in (1, 2):  # the declaring cells say where their controls went
            note = page.locator(cells).nth(declaring).locator("[data-testid=sl-params-note]")
            assert note.inner_text() == "parameters: in the bar above the notebook's cells"
        yaml_out = page.locator(cells).nth(4).locator(".jp-OutputArea-output").first
        assert "rows: 10" in yaml_out.inner_text(), yaml_out.inner_text()

        # Changed in the bar: the kernel reads the new values, and the definition cell run again too.
        bar.locator("[data-name=size] select").select_option("30")
        region = bar.locator("[data-name=region] input")
        region.fill("us")
        region.press("Enter")
        bar.locator("[data-name=kinds] select").select_option(["a", "c"])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "parameters.png"))
        page.locator(cells).nth(3).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")  # the source cell, then the yaml cell
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(
            f"() => /rows: 30/.test(document.querySelectorAll('{cells}')[4].querySelector('.jp-OutputArea-output')"
            "?.textContent || '')", timeout=60_000)
        page.keyboard.press("Shift+Enter")  # getAll
        page.wait_for_function(
            f"() => (document.querySelectorAll('{cells}')[5].querySelector('.jp-OutputArea-output')?.textContent"
            " || '').includes('region')", timeout=60_000)
        printed = page.locator(cells).nth(5).locator(".jp-OutputArea-output").first.inner_text()
        assert printed.strip() == "[('kinds', 'a,c'), ('region', 'us'), ('size', '30')]", printed

        # Declared again (the cell run again): the same controls, the values entered kept.
        page.locator(cells).nth(1).locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        page.locator(cells).nth(1).locator("[data-testid=sl-params-note]").wait_for(timeout=30_000)
        assert bar.locator("[data-testid=sl-param]").count() == 3
        assert bar.locator("[data-name=region] input").input_value() == "us"
        assert bar.locator("[data-name=size] select").input_value() == "30"
