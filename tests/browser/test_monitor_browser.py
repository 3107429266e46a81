"""The notebook in a real browser: JupyterLab from the venv, Debian's chromium driven by Playwright,
a notebook that defines a pipeline with the ``%%streamling`` magics and starts it.

One kernel (one Spark start) walks through what a user would look for, in order: the monitor's DAG,
finalized epochs, rows of the in-flight batch and the rate chart; a SQL mistake shown as one line and
nothing else; the live result table of `%streamling display`; the epoch breakdown and Spark's progress
report; the restart and stop buttons, Stop while another cell keeps the kernel busy; `show`'s
graph as a picture; then the notebook saved, its kernel gone, and reopened: the monitor renders its
saved state marked as not live, never a frozen "running" widget. Screenshots land in
``tests/artifacts/`` (CI artifacts).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

import pytest
from browser_lab import ARTIFACTS, Lab, browser_page, run_all, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.timeout(900)]

# The first SparkSession of a kernel, on a busy 2-core machine, can take minutes.
SPARK_START_MS = 240_000

CELLS = [
    "%load_ext streamling",
    "%%streamling source orders\ntype: generate\nrows_per_second: 2000\nrows_per_batch: 500",
    "%%streamling transform big --from orders\nSELECT id, amount FROM orders WHERE amount > 100",
    "%%streamling sink out --from big\ntype: blackhole",
    "%streamling run --seconds 600",
    "%streamling display big --rows 50",
    # Run All keeps the kernel busy here: the monitor and the display must stay live meanwhile. Run
    # again later, it is the busy cell during which Stop must act: long enough not to end first.
    "import time\nbusy_secs = 60 if 'busy_secs' in globals() else 20\ntime.sleep(busy_secs)",
    # A typo in a column: its definition cell (the session is warm) or `show` fails with one line.
    "%%streamling sink typo_out --from typo\ntype: blackhole",
    "%%streamling transform typo --from orders\nSELECT id, amont FROM orders",
    "%streamling show",
    # The failed typo cell defined nothing (a cell that fails changes nothing): only typo_out goes.
    "%streamling remove typo_out",
    "%streamling show",
]
BUSY_CELL = 6
TYPO_CELLS = (7, 8, 9)
SHOW_CELL = 11


def _api(lab: Lab, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"{lab.url}{path}?token={lab.token}", method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def _run_cell(page: Any, index: int) -> None:
    """Run one cell as a user does (click into it, Shift+Enter), until its prompt shows it was sent:
    on a loaded machine a key pressed before the editor took the focus goes elsewhere."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    before = prompt.text_content()
    for _ in range(3):
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Shift+Enter")
        try:
            page.wait_for_function(
                "([i, before]) => document.querySelectorAll('.jp-Notebook .jp-Cell')[i]"
                ".querySelector('.jp-InputPrompt').textContent !== before", arg=[index, before], timeout=10_000)
            return
        except Exception:  # noqa: BLE001 - playwright's TimeoutError: the key went elsewhere; again
            continue
    raise AssertionError(f"cell {index} did not start after three Shift+Enter")


def _status(monitor: Any) -> str:
    return str(monitor.locator("[data-testid=sl-status]").inner_text())


def _max_epoch(monitor: Any) -> int:
    epochs = monitor.locator("[data-testid=sl-epoch][data-state=finalized]")
    return max((int(e) for e in epochs.evaluate_all("els => els.map(e => e.dataset.epoch)")), default=-1)


def test_monitor_shows_a_running_pipeline(lab: Lab) -> None:
    write_notebook(lab.root / "monitor.ipynb", CELLS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot, reopened_shot = ARTIFACTS / "monitor.png", ARTIFACTS / "monitor-reopened.png"
    shot.unlink(missing_ok=True)
    reopened_shot.unlink(missing_ok=True)
    timings: dict[str, float] = {}
    with browser_page(lab, "monitor-failure.png") as page:
        started = time.monotonic()
        run_all(page, lab, "monitor.ipynb")

        monitor = page.locator("[data-testid=sl-monitor]")
        monitor.wait_for(timeout=SPARK_START_MS)
        timings["monitor shown"] = time.monotonic() - started
        nodes = monitor.locator("[data-testid=sl-node]")
        assert sorted(nodes.evaluate_all("els => els.map(e => e.dataset.node)")) == ["big", "orders", "out"]

        monitor.locator("[data-testid=sl-epoch][data-state=finalized]").first.wait_for(timeout=SPARK_START_MS)
        timings["first finalized epoch"] = time.monotonic() - started
        rows = monitor.locator("[data-testid=sl-sample-row]")
        rows.first.wait_for(timeout=60_000)

        # While Run All sleeps in a later cell the kernel cannot answer the widgets' ping: they stay
        # live all the same (the kernel side's heartbeat), Stop usable, not "saved snapshot".
        prompts = "i => [...document.querySelectorAll('.jp-Notebook .jp-Cell')].map(c => " \
                  "c.querySelector('.jp-InputPrompt').textContent)"
        page.wait_for_function(f"() => {{ const p = ({prompts})(); return /\\d/.test(p[{BUSY_CELL - 1}]) "
                               f"&& p[{BUSY_CELL}].includes('*'); }}", timeout=120_000)
        # A node chosen while the kernel is busy reaches it at once, as Stop does (the control
        # channel), and in order: the kernel's copy is what a Restart keeps.
        node_select = monitor.locator("[data-testid=sl-node-select]")
        node_select.select_option("orders")
        node_select.select_option("big")
        page.wait_for_function("() => document.querySelector('[data-testid=sl-node-select]')"
                               ".dataset.kernelSelected === 'big'", timeout=10_000)
        assert "*" in page.evaluate(f"() => ({prompts})()")[BUSY_CELL], "the choice reached the kernel after the cell"
        time.sleep(7)  # past the front end's 5 s wait for an answer to its ping
        assert "*" in page.evaluate(f"() => ({prompts})()")[BUSY_CELL], "the kernel is no longer busy"
        assert monitor.locator("[data-testid=sl-live]").get_attribute("data-live") == "true"
        assert monitor.locator("[data-testid=sl-stop]").is_visible()
        assert monitor.locator("[data-testid=sl-stop]").is_enabled()
        assert _status(monitor).startswith("running"), _status(monitor)
        assert page.locator("[data-testid=sl-display-status]").get_attribute("data-live") == "true"
        timings["live while busy"] = time.monotonic() - started

        # The default in-flight batch is the transform's: the SQL filter holds on every row.
        assert monitor.locator("[data-testid=sl-node-select]").input_value() == "big"
        header = monitor.locator(".sl-sample-table thead th").all_inner_texts()
        assert [h.split("\n")[0] for h in header][:2] == ["id", "amount"]  # then the runtime's _gs_op
        amounts = [float(t) for t in monitor.locator(".sl-sample-table tbody td:nth-child(2)").all_inner_texts()]
        assert amounts and all(a > 100 for a in amounts), amounts

        # Several epochs: the timeline fills, the rate chart draws lines, the sink counts rows.
        page.wait_for_function(
            "() => document.querySelectorAll('[data-testid=sl-epoch][data-state=finalized]').length >= 3",
            timeout=120_000)
        timings["third finalized epoch"] = time.monotonic() - started
        # The in-flight batch follows the run: a later epoch's rows replace epoch #0's.
        page.wait_for_function(
            "() => /epoch #[1-9]/.test((document.querySelector('[data-testid=sl-sample-meta]') || {}).textContent)",
            timeout=120_000)
        assert monitor.locator("[data-testid=sl-rate-chart] polyline").count() >= 2
        page.wait_for_function(
            "() => Number(document.querySelector('[data-testid=sl-node][data-node=out]').dataset.rows) > 0",
            timeout=30_000)
        out_rows = monitor.locator("[data-testid=sl-node][data-node=out] .sl-node-rows").text_content() or ""
        # counts are integers ("9 rows", "1.4k rows"), never "9.0 rows"
        assert re.fullmatch(r"(\d+|\d+(\.\d)?[kMG]) rows", out_rows), out_rows
        exact = monitor.locator("[data-testid=sl-node][data-node=out]").get_attribute("data-rows") or ""
        assert re.fullmatch(r"\d+", exact), exact
        epoch = monitor.locator("[data-testid=sl-epoch][data-state=finalized]").first
        assert "orders" in epoch.inner_text()  # the source's end offset is listed

        # The selector is bound to the model: switching node shows that node's batch.
        monitor.locator("[data-testid=sl-node-select]").select_option("orders")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.sl-sample-table thead th')]"
            ".some(th => th.textContent.startsWith('customer'))", timeout=30_000)
        monitor.locator("[data-testid=sl-node-select]").select_option("big")
        rows.first.wait_for(timeout=30_000)

        # The live result table: the transform's latest rows, typed, sortable, refreshed by later epochs.
        display = page.locator("[data-testid=sl-display]")
        display.locator("[data-testid=sl-display-row]").first.wait_for(timeout=60_000)
        columns = display.locator("[data-testid=sl-display-header]").evaluate_all(
            "els => els.map(e => e.dataset.column)")
        assert columns[:2] == ["id", "amount"], columns
        headline = display.locator("[data-testid=sl-display-headline]").inner_text()
        display.locator("[data-testid=sl-display-header][data-column=amount]").click()
        display.locator("[data-testid=sl-display-header][data-column=amount]").click()  # descending
        cells_shown = display.locator("[data-testid=sl-display-row] td:nth-child(2)").all_inner_texts()
        shown = [float(t) for t in cells_shown]
        assert shown == sorted(shown, reverse=True) and all(a > 100 for a in shown), shown
        assert display.locator("[data-testid=sl-display-chart] svg").count() == 1
        page.wait_for_function(
            "h => document.querySelector('[data-testid=sl-display-headline]').textContent !== h",
            arg=headline, timeout=90_000)
        timings["display refreshed"] = time.monotonic() - started

        # An epoch opens its breakdown, with every part named, and Spark's progress report.
        epoch.click()
        detail = monitor.locator("[data-testid=sl-epoch-detail]").first
        detail.wait_for(timeout=10_000)
        breakdown = detail.locator(".sl-breakdown").inner_text()
        for part in ("transforms", "sink out", "total"):
            assert part in breakdown, breakdown
        detail.locator("[data-testid=sl-progress-button]").click()
        page.wait_for_function(
            "() => (document.querySelector('[data-testid=sl-progress-json]') || {}).textContent"
            "?.includes('\"batchId\"')", timeout=30_000)
        monitor.locator("[data-testid=sl-tab-durations]").click()
        assert monitor.locator("[data-testid=sl-duration-chart] rect.sl-seg").count() >= 3
        monitor.scroll_into_view_if_needed()
        monitor.screenshot(path=str(shot))
        monitor.locator("[data-testid=sl-tab-rates]").click()

        # The SQL mistake: the first failing cell shows one error output, the one-line message.
        page.wait_for_function(
            f"() => [{', '.join(map(str, TYPO_CELLS))}].some(i => document.querySelectorAll("
            "'.jp-Notebook .jp-Cell')[i].querySelector('[data-mime-type=\"application/vnd.jupyter.stderr\"]'))",
            timeout=120_000)
        cells = page.locator(".jp-Notebook .jp-Cell")
        failed = next(cells.nth(i) for i in TYPO_CELLS
                      if cells.nth(i).locator("[data-mime-type='application/vnd.jupyter.stderr']").count())
        outputs = failed.locator(".jp-OutputArea-output")
        assert outputs.count() == 1, outputs.all_inner_texts()
        message = outputs.first.inner_text().strip()
        assert message.startswith("PipelineError: Node 'typo': "), message
        assert "amont" in message and "\n" not in message, message
        assert "org.apache" not in message and "java" not in message.lower(), message

        # Stop: the buttons act on the run; restart continues from the last finalized epoch.
        _run_cell(page, SHOW_CELL - 1)  # remove the sink left waiting for the typo
        _run_cell(page, SHOW_CELL)
        cells.nth(SHOW_CELL).locator(".jp-RenderedSVG, img").first.wait_for(timeout=60_000)
        before = _max_epoch(monitor)
        monitor.locator("[data-testid=sl-restart]").click()
        # The restarted run's timeline starts over and goes on from the checkpoint's next epoch.
        page.wait_for_function(
            "n => { const done = [...document.querySelectorAll('[data-testid=sl-epoch][data-state=finalized]')];"
            " return done.length > 0 && done.every(e => Number(e.dataset.epoch) > n)"
            " && document.querySelector('[data-testid=sl-status]').textContent.startsWith('running'); }",
            arg=before, timeout=180_000)
        timings["restarted"] = time.monotonic() - started
        # Stop takes effect while the kernel is busy in another cell: the monitor sends it on the
        # kernel's control channel (comms over subshells are off in this JupyterLab).
        _run_cell(page, BUSY_CELL)
        page.wait_for_function(f"() => ({prompts})()[{BUSY_CELL}].includes('*')", timeout=30_000)
        monitor.locator("[data-testid=sl-stop]").click()
        page.wait_for_function(
            "() => document.querySelector('[data-testid=sl-status]').textContent.startsWith('stopped')",
            timeout=120_000)
        timings["stopped"] = time.monotonic() - started
        assert "*" in page.evaluate(f"() => ({prompts})()")[BUSY_CELL], "the busy cell ended before the stop"
        assert monitor.locator("[data-testid=sl-stop]").is_disabled()

        # Saved, kernel gone, reopened: the saved state, marked as such, no "running".
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + 30
        while True:
            saved = _api(lab, "/api/contents/monitor.ipynb")["content"]
            state = (saved["metadata"].get("widgets") or {}).get("application/vnd.jupyter.widget-state+json")
            if state or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert state, "the notebook was saved without its widget state"
        for session in _api(lab, "/api/sessions"):
            _api(lab, f"/api/sessions/{session['id']}", method="DELETE")
        page.goto(lab.open_url("monitor.ipynb"))
        reopened = page.locator("[data-testid=sl-monitor]")
        reopened.wait_for(timeout=60_000)
        page.locator("[data-testid=sl-live][data-live=false]").wait_for(timeout=30_000)
        badge = page.locator("[data-testid=sl-live]").text_content() or ""
        assert re.fullmatch(r"saved snapshot of the run of \d{4}-\d\d-\d\d \d\d:\d\d · not live", badge), badge
        assert not _status(reopened).startswith("running"), _status(reopened)
        assert int(reopened.locator("[data-testid=sl-node][data-node=out]").get_attribute("data-rows") or 0) > 0
        assert reopened.locator("[data-testid=sl-stop]").is_hidden()
        snapshot = page.locator("[data-testid=sl-display]")
        assert snapshot.locator("[data-testid=sl-display-row]").count() > 0  # the saved rows, no kernel
        page.wait_for_function("() => document.querySelector('[data-testid=sl-display-status]')"
                               ".dataset.live === 'false'", timeout=30_000)
        page.locator(".jp-Notebook .jp-Cell").nth(SHOW_CELL).locator(".jp-RenderedSVG, img").first.wait_for(
            timeout=30_000)
        reopened.scroll_into_view_if_needed()
        reopened.screenshot(path=str(reopened_shot))
    assert shot.stat().st_size > 10_000 and reopened_shot.stat().st_size > 10_000
    print("monitor timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
