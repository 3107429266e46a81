"""The notebooks in ``notebooks/`` as a fresh clone shows them, before anything runs.

GitHub, nbviewer and a JupyterLab without the widget's front end render a saved monitor from its
text and HTML fallback, and JupyterLab with it from the saved widget state: both must show how the
run ended (final status and counts), never a frozen "running" with no counts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
FINAL = re.compile(r"^(stopped|failed)\b")


def _monitor_outputs(nb: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for cell in nb["cells"] for o in cell.get("outputs", [])
            if "".join(o.get("data", {}).get("text/plain", "")).startswith("streamling monitor:")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_saved_monitor_shows_how_its_run_ended(path: Path) -> None:
    nb = json.loads(path.read_text())
    outputs = _monitor_outputs(nb)
    if not outputs:
        pytest.fail(f"{path.name} has no saved monitor: run it (Run All) and save it with its outputs")
    widgets = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for output in outputs:
        text = "".join(output["data"]["text/plain"])
        status = re.search(r"^status: (.*)$", text, re.M)
        assert status and FINAL.match(status.group(1)), f"{path.name}: the saved monitor says {text[:200]!r}"
        assert "epochs: none yet" not in text, text
        html = "".join(output["data"].get("text/html", ""))
        assert re.search(r"status: <code>(stopped|failed)", html), html[:300]
        if WIDGET_VIEW in output["data"]:  # a live monitor, saved with its widget's state
            model = widgets["state"][output["data"][WIDGET_VIEW]["model_id"]]["state"]
            assert FINAL.match(str(model.get("status"))), model.get("status")
