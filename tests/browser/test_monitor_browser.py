"""The monitor widget in a real browser: JupyterLab from the venv, Debian's chromium driven by
Playwright, a notebook that defines a pipeline with the ``%%streamling`` magics and starts it.

The test runs every cell, then waits for what a user would look for: the DAG, finalized epochs in
the timeline, rows of the in-flight batch and the rate chart. It leaves a screenshot in
``tests/artifacts/monitor.png`` (a CI artifact). Playwright never downloads a browser here: it
drives ``/usr/bin/chromium`` (``apt-get install chromium``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# The first SparkSession of a kernel, on a busy 2-core machine, can take minutes.
SPARK_START_MS = 240_000

CELLS = [
    "%load_ext streamling",
    "%%streamling source orders\ntype: generate\nrows_per_second: 2000\nrows_per_batch: 500",
    "%%streamling transform big --from orders\nSELECT id, amount FROM orders WHERE amount > 100",
    "%%streamling sink out --from big\ntype: blackhole",
    "%streamling run --seconds 90",
]


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    log: Path

    def open_url(self, notebook: str) -> str:
        # ``reset``: start from an empty workspace, whatever a previous session left.
        return f"{self.url}/lab/tree/{notebook}?reset&token={self.token}"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_lab_settings(settings_dir: Path) -> None:
    """Start the notebook's kernel without asking, and no news or update checks (no network)."""
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                            "checkForUpdates": False},
    }
    for name, value in files.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    if not Path(CHROMIUM).exists():
        # `fixtures/dev test` installs it; a missing browser must not turn the test into a silent skip.
        pytest.fail(f"{CHROMIUM} is missing: run the tests with `fixtures/dev test` (it installs chromium) "
                    "or apt-get install chromium")
    root = tmp_path / "notebooks"
    root.mkdir()
    private = tmp_path / "jupyter"
    _write_lab_settings(private / "lab-settings")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(private / "config"), "JUPYTER_RUNTIME_DIR": str(private / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(private / "lab-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(private / "workspaces"),
           "STREAMLING_CACHE_DIR": os.environ.get("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))}
    log = tmp_path / "jupyter.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--ServerApp.terminals_enabled=False", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()}")
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer on {url} within 120 s:\n{log.read_text()}")
                time.sleep(0.5)
        yield Lab(url, token, root, log)
    finally:
        proc.terminate()  # the server shuts its kernels down; their Spark JVMs exit with them
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def _outputs_text(page: Any) -> str:
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    return "\n---\n".join(t.strip()[:2000] for t in texts if t.strip())


def test_monitor_shows_a_running_pipeline(lab: Lab) -> None:
    from playwright.sync_api import sync_playwright

    _notebook(lab.root / "monitor.ipynb", CELLS)
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
            raise AssertionError(f"{exc}\n\nnotebook outputs:\n{_outputs_text(page)}\n\n"
                                 f"JupyterLab log:\n{lab.log_tail()}") from exc
        finally:
            browser.close()
    assert not errors, errors
    assert shot.stat().st_size > 10_000
    print("monitor timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))

