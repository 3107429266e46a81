"""The monitor widget in a real browser: JupyterLab from the venv, Debian's chromium driven by
Playwright, a notebook that defines a pipeline with the ``%%streamling`` magics and starts it.

The test runs every cell, then waits for what a user would look for: the DAG, finalized epochs in
the timeline, rows of the in-flight batch and the rate chart. It leaves a screenshot in
``tests/artifacts/monitor.png`` (a CI artifact). Playwright never downloads a browser here: it
drives ``/usr/bin/chromium`` (``apt-get install chromium``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import time

import pytest
from browser_lab import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, Lab, outputs_text, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.timeout(900)]

# The first SparkSession of a kernel, on a busy 2-core machine, can take minutes.
SPARK_START_MS = 240_000

CELLS = [
    "%load_ext streamling",
    "%%streamling source orders\ntype: generate\nrows_per_second: 2000\nrows_per_batch: 500",
    "%%streamling transform big --from orders\nSELECT id, amount FROM orders WHERE amount > 100",
    "%%streamling sink out --from big\ntype: blackhole",
    "%streamling run --seconds 90",
]


def test_monitor_shows_a_running_pipeline(lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    write_notebook(lab.root / "monitor.ipynb", CELLS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "monitor.png"
    shot.unlink(missing_ok=True)
    timings: dict[str, float] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            started = time.monotonic()
            page.goto(lab.open_url("monitor.ipynb"))
            page.wait_for_selector(".jp-Notebook", timeout=60_000)
            page.get_by_text("| Idle").wait_for(timeout=120_000)  # kernel started and connected
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

            monitor = page.locator("[data-testid=sl-monitor]")
            monitor.wait_for(timeout=SPARK_START_MS)
            timings["monitor shown"] = time.monotonic() - started
            nodes = monitor.locator("[data-testid=sl-node]")
            assert sorted(nodes.evaluate_all("els => els.map(e => e.dataset.node)")) == ["big", "orders", "out"]

            monitor.locator("[data-testid=sl-epoch][data-state=finalized]").first.wait_for(timeout=SPARK_START_MS)
            timings["first finalized epoch"] = time.monotonic() - started
            rows = monitor.locator("[data-testid=sl-sample-row]")
            rows.first.wait_for(timeout=60_000)

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
            assert monitor.locator("[data-testid=sl-rate-chart] polyline").count() >= 2
            page.wait_for_function(
                "() => Number(document.querySelector('[data-testid=sl-node][data-node=out]').dataset.rows) > 0",
                timeout=30_000)
            epoch = monitor.locator("[data-testid=sl-epoch][data-state=finalized]").first
            assert "orders" in epoch.inner_text()  # the source's end offset is listed

            # The selector is bound to the model: switching node shows that node's batch.
            monitor.locator("[data-testid=sl-node-select]").select_option("orders")
            page.wait_for_function(
                "() => [...document.querySelectorAll('.sl-sample-table thead th')]"
                ".some(th => th.textContent.startsWith('customer'))", timeout=30_000)
            monitor.locator("[data-testid=sl-node-select]").select_option("big")
            rows.first.wait_for(timeout=30_000)

            monitor.scroll_into_view_if_needed()
            monitor.screenshot(path=str(shot))
        except Exception as exc:
            page.screenshot(path=str(ARTIFACTS / "monitor-failure.png"), full_page=True)
            raise AssertionError(f"{exc}\n\nnotebook outputs:\n{outputs_text(page)}\n\n"
                                 f"JupyterLab log:\n{lab.log_tail()}") from exc
        finally:
            browser.close()
    assert not errors, errors
    assert shot.stat().st_size > 10_000
    print("monitor timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))

