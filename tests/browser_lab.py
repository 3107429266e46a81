"""A private JupyterLab for browser tests: the server from the venv, Debian's chromium driven by
Playwright (which never downloads a browser here: it drives ``/usr/bin/chromium``, installed by
``fixtures/dev test``), and helpers to write notebooks and read what a cell shows."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from streamling.util import free_port

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    log: Path
    data_dir: Path  # the server's JUPYTER_DATA_DIR: its notebook signatures live there

    def trust(self, notebook: str) -> None:
        """Sign a notebook as this server's user would with "Trust Notebook"."""
        from nbformat.sign import NotebookNotary

        path = self.root / notebook
        nb = nbformat.read(path, as_version=4)
        NotebookNotary(data_dir=str(self.data_dir)).sign(nb)

    def open_url(self, notebook: str) -> str:
        # ``reset``: start from an empty workspace, whatever a previous session left.
        return f"{self.url}/lab/tree/{notebook}?reset&token={self.token}"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _write_lab_settings(settings_dir: Path) -> None:
    """Start the notebook's kernel without asking, and no news or update checks (no network). Comms
    over kernel subshells off: a widget's request must reach a busy kernel without them (streamling's
    widgets use the control channel), as in front ends and kernels that have none."""
    files = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"autoStartDefaultKernel": True},
        "@jupyterlab/apputils-extension/kernels-settings.jupyterlab-settings": {"commsOverSubshells": "disabled"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                            "checkForUpdates": False},
    }
    for name, value in files.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@contextmanager
def running_lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on a free loopback port with its own config, settings and workspaces."""
    if not Path(CHROMIUM).exists():
        # `fixtures/dev test` installs it; a missing browser must not turn the test into a silent skip.
        pytest.fail(f"{CHROMIUM} is missing: run the tests with `fixtures/dev test` (it installs chromium) "
                    "or apt-get install chromium")
    root = tmp_path / "notebooks"
    root.mkdir()
    private = tmp_path / "jupyter"
    _write_lab_settings(private / "lab-settings")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ,
           "JUPYTER_CONFIG_DIR": str(private / "config"), "JUPYTER_RUNTIME_DIR": str(private / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(private / "lab-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(private / "workspaces"), "JUPYTER_DATA_DIR": str(private / "data"),
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
        yield Lab(url, token, root, log, private / "data")
    finally:
        proc.terminate()  # the server shuts its kernels down; their Spark JVMs exit with them
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, path)


def outputs_text(page: Any) -> str:
    texts = page.locator(".jp-OutputArea-output").all_inner_texts()
    return "\n---\n".join(t.strip()[:2000] for t in texts if t.strip())


@contextmanager
def browser_page(lab: Lab, failure_shot: str) -> Iterator[Any]:
    """A chromium page on ``lab``. A failure inside saves a full-page screenshot as
    ``tests/artifacts/<failure_shot>`` and is re-raised with the notebook's outputs and the lab's
    log; an error the page's own scripts raised fails the test after the block."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield page
        except Exception as exc:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / failure_shot), full_page=True)
            raise AssertionError(f"{exc}\n\nnotebook outputs:\n{outputs_text(page)}\n\n"
                                 f"JupyterLab log:\n{lab.log_tail()}") from exc
        finally:
            browser.close()
    assert not errors, errors


def run_all(page: Any, lab: Lab, notebook: str) -> None:
    """Open ``notebook``, wait for its kernel, and start Run All from the Run menu."""
    page.goto(lab.open_url(notebook))
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.get_by_text("| Idle").wait_for(timeout=120_000)  # kernel started and connected
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
