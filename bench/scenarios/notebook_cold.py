"""``notebook_cold``: Run All on a cold kernel, as a notebook user meets streamling first.

The quickstart notebook (``notebooks/quickstart.ipynb``, as committed) is executed by nbclient in a
fresh kernel, timed from the client's start (kernel start included) to the end of each cell. The
figures are the cell that first shows rows (``%streamling preview``), the end of ``%streamling
wait`` (the pipeline ran to its end) and the whole notebook. The floor is a notebook of one cell in
a fresh kernel of its own: ``SparkSession.builder.getOrCreate()`` and ``spark.range(5).show()`` — no
notebook shows Spark rows sooner on this machine. Both run interleaved, so the multiple is taken at
the same load.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from scenarios.common import ROOT, Options, ScenarioResult, Side, interleaved, log, paired_ratio, temp_dir

NAME = "notebook_cold"
FLOOR_CELL = "from pyspark.sql import SparkSession\nspark = SparkSession.builder.getOrCreate()\nspark.range(5).show()"


def _execute(nb: Any, cwd: str) -> dict[str, float]:
    """Run every cell in a fresh kernel; seconds from the start to the end of each cell, by index."""
    from nbclient import NotebookClient

    done: dict[int, float] = {}
    started = time.monotonic()

    def cell_done(cell: Any, cell_index: int, **_: Any) -> None:
        done[cell_index] = time.monotonic() - started

    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": cwd}},
                            on_cell_executed=cell_done)
    client.execute()
    done[-1] = time.monotonic() - started
    return done


def _quickstart() -> dict[str, Any]:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    code = {i: "".join(c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    preview = next(i for i, s in code.items() if "%streamling preview" in s)
    wait = next(i for i, s in code.items() if "%streamling wait" in s)
    with temp_dir(NAME) as work:
        shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", work / "quickstart.ipynb")
        done = _execute(nb, str(work))
    return {"first_rows_secs": done[preview], "pipeline_done_secs": done[wait], "notebook_secs": done[-1]}


def _floor() -> dict[str, Any]:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(FLOOR_CELL)])
    with temp_dir(f"{NAME}-floor") as work:
        done = _execute(nb, str(work))
    return {"first_rows_secs": done[0]}


def run(opts: Options) -> ScenarioResult:
    sides = {"quickstart": Side("quickstart"), "floor": Side("floor")}
    log(f"{NAME}: quickstart Run All vs a bare SparkSession + show(), each in a fresh kernel, {opts.runs} runs")
    interleaved(opts.runs, {"quickstart": _quickstart, "floor": _floor}, sides, log)
    result = ScenarioResult(NAME, {"runs": opts.runs, "notebook": "notebooks/quickstart.ipynb"}, sides)
    q, f = sides["quickstart"], sides["floor"]
    result.figures = {
        "quickstart: first rows (preview)": (q.median("first_rows_secs"), "s"),
        "quickstart: pipeline done (wait)": (q.median("pipeline_done_secs"), "s"),
        "quickstart: whole notebook": (q.median("notebook_secs"), "s"),
        "floor: SparkSession + show()": (f.median("first_rows_secs"), "s"),
    }
    result.ratios = {"floor/quickstart first rows": paired_ratio(q, f, "first_rows_secs", False)}
    result.notes.append("ratio: floor seconds / quickstart seconds to the first rows (1.0 = as fast as the floor)")
    return result
