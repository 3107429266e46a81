"""A notebook compiles, without running, into the pipeline its cells build when it runs; every
cell a job cannot take is reported at once, with the cell it is in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython

from streamling.bundle.compile import Cell, CompiledNotebook, compile_notebook, read_notebook
from streamling.errors import ValidationError
from streamling.notebook.dbutils import PARAMETERS_ENV, dbutils

ROOT = Path(__file__).resolve().parents[2]
IPYNB = ROOT / "fixtures" / "notebooks" / "orders_job.ipynb"
SOURCE = ROOT / "fixtures" / "notebooks" / "orders_job.py"

EXPECTED = """\
sources:
  orders:
    type: generate
    rows: 1000
    rows_per_batch: 250
    primary_key: id
transforms:
  large_orders:
    type: sql
    from:
    - orders
    sql: |
      SELECT id, customer, amount * quantity AS total
      FROM orders
      WHERE amount > 900
  labelled:
    type: script
    language: javascript
    from:
    - large_orders
    script: |
      function process(row) {
        return {...row, label: `big order of ${row.customer}`};
      }
sinks:
  console:
    type: print
    from:
    - labelled
"""


def notebook(tmp_path: Path, *cells: str | tuple[str, list[str]], name: str = "job.ipynb") -> Path:
    """An .ipynb of code cells (``(source, tags)`` for tagged ones; ``"md:…"`` for markdown)."""
    out = []
    for cell in cells:
        source, tags = (cell, []) if isinstance(cell, str) else cell
        kind = "markdown" if source.startswith("md:") else "code"
        out.append({"cell_type": kind, "metadata": {"tags": tags}, "source": source.removeprefix("md:"),
                    **({"outputs": [], "execution_count": None} if kind == "code" else {})})
    path = tmp_path / name
    path.write_text(json.dumps({"cells": out, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


SOURCE_CELL = "%%streamling source orders\ntype: generate\nrows: 10\n"
SINK_CELL = "%%streamling sink out --from orders\ntype: print\n"


def problems(path: Path, parameters: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ValidationError) as err:
        compile_notebook(path, parameters)
    return [p.headline() for p in err.value.problems]


# --- the same pipeline as the notebook ---------------------------------------------------------


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(PARAMETERS_ENV, raising=False)
    ip = start_ipython() or get_ipython()  # one shell per test process
    assert ip is not None
    ip.run_line_magic("load_ext", "streamling")
    magics = ip.magics_manager.registry["StreamlingMagics"]
    magics._pipeline = None
    yield ip
    magics._pipeline = None
    ip.run_line_magic("config", "StreamlingMagics.application_id = ''")
    dbutils.widgets.removeAll()


def run_in_notebook(ip: Any, path: Path) -> Any:
    """Run the notebook's cells in a kernel the way "Run all" does, except the interactive ones and
    `%streamling run` (no Spark here); return the pipeline the magics built."""
    for cell in read_notebook(path):
        if cell.kind != "code" or "interactive" in cell.tags or "%streamling run" in cell.source:
            continue
        ip.run_cell(cell.source).raise_error()
    return ip.magics_manager.registry["StreamlingMagics"].pipeline


def test_ipynb_and_databricks_source_compile_to_the_pipeline_the_magics_build(shell: Any) -> None:
    from_ipynb = compile_notebook(IPYNB)
    from_source = compile_notebook(SOURCE)
    built = run_in_notebook(shell, IPYNB)
    assert from_ipynb.document == from_source.document == built.document()
    assert from_ipynb.to_yaml() == from_source.to_yaml() == built.to_yaml() == EXPECTED
    assert built.application_id == from_ipynb.application_id == "orders_job"


def test_job_parameters_override_the_declared_defaults_as_in_the_notebook(shell: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    parameters = {"rows": "50", "threshold": "990"}
    compiled = compile_notebook(SOURCE, parameters)
    monkeypatch.setenv(PARAMETERS_ENV, json.dumps(parameters))
    assert compiled.document == run_in_notebook(shell, IPYNB).document()
    assert compiled.document["sources"]["orders"]["rows"] == 50
    assert compiled.document["transforms"]["large_orders"]["sql"].endswith("WHERE amount > 990")
    # ${row.customer} in the script is JavaScript's, not a parameter
    assert "${row.customer}" in compiled.document["transforms"]["labelled"]["script"]
    assert compiled.parameters == {"rows": "1000", "threshold": "900"}  # the declared defaults


def test_settings_parameters_and_run_options_come_from_the_notebook() -> None:
    compiled = compile_notebook(IPYNB)
    assert isinstance(compiled, CompiledNotebook)
    assert compiled.path == IPYNB
    assert (compiled.application_id, compiled.config_name) == ("orders_job", None)
    assert compiled.parameters == {"rows": "1000", "threshold": "900"}
    assert compiled.run == {"rows": 6}
    assert compiled.warnings == []


def test_config_sets_application_id_and_config_name(tmp_path: Path) -> None:
    settings = ("%load_ext streamling\n%config StreamlingMagics.application_id = \"daily\"\n"
                "%config StreamlingMagics.config_name = 'prod.yaml'\n%config StreamlingMagics.monitor = False\n"
                "%config StreamlingMagics.full_traceback = True")
    path = notebook(tmp_path, settings, SOURCE_CELL, SINK_CELL)
    compiled = compile_notebook(path)
    assert (compiled.application_id, compiled.config_name) == ("daily", "prod.yaml")


@pytest.mark.parametrize(("line", "run"), [
    ("%streamling run --rows 6 --wait --sample 5", {"rows": 6}),
    ("%streamling run --seconds 30", {"seconds": 30.0}),
    ("%streamling run\n%streamling wait --timeout 300", {}),
    ("%streamling validate", {}),
])
def test_run_options(tmp_path: Path, line: str, run: dict[str, Any]) -> None:
    assert compile_notebook(notebook(tmp_path, "%load_ext streamling", SOURCE_CELL, SINK_CELL, line)).run == run


def test_interactive_magics_are_skipped_without_a_warning(tmp_path: Path) -> None:
    path = notebook(tmp_path, "%load_ext streamling", SOURCE_CELL, SINK_CELL,
                    "%streamling validate\n%streamling show\n%streamling yaml\n%streamling preview out --rows 3",
                    "%streamling run\n%streamling capture out\n%streamling debug out\n%streamling status",
                    "%streamling export out.yaml\n%streamling stop")
    compiled = compile_notebook(path)
    assert compiled.warnings == []
    assert list(compiled.document["sinks"]) == ["out"]


def test_reset_is_skipped_with_a_warning(tmp_path: Path) -> None:
    compiled = compile_notebook(notebook(tmp_path, "%load_ext streamling", "%streamling reset", SOURCE_CELL, SINK_CELL))
    assert compiled.warnings == [
        "cell 2: `%streamling reset` is not part of the job: a job never deletes its checkpoints "
        "(start over with a new application_id)"]


def test_python_cells_make_the_job_run_the_notebook(tmp_path: Path) -> None:
    path = notebook(tmp_path, "%load_ext streamling", SOURCE_CELL, SINK_CELL,
                    "import os\n\nprint(os.getcwd())", ("print('notebook only')", ["interactive"]))
    compiled = compile_notebook(path)
    assert compiled.executes == [4]  # the interactive cell stays out of the job
    assert compiled.document["sinks"] == {"out": {"type": "print", "from": ["orders"]}}
    only_streamling = compile_notebook(notebook(tmp_path, "%load_ext streamling", 'dbutils.widgets.text("n", "1")',
                                                SOURCE_CELL, SINK_CELL, name="pipeline.ipynb"))
    assert only_streamling.executes == []  # declarations and imports alone: the compiled pipeline runs


def test_a_python_notebook_without_streamling_cells_is_a_job(tmp_path: Path) -> None:
    path = notebook(tmp_path, 'dbutils.widgets.text("day", "2026-01-01")',
                    "%sql\nCREATE TABLE t AS SELECT 1", "df = spark.table('t')\ndisplay(df)", "x = !ls", "md:done")
    compiled = compile_notebook(path)
    assert compiled.executes == [2, 3, 4] and not any(compiled.document.values())
    assert compiled.parameters == {"day": "2026-01-01"}


def test_a_syntax_error_and_languages_that_do_not_run_here(tmp_path: Path) -> None:
    path = notebook(tmp_path, "x = (1,", "%scala\nval x = 1", "%r\nx <- 1", "print(1)\n%sql SELECT 1",
                    "%run ./missing", "%run ./helpers x=1", "%run /Workspace/Shared/lib")
    assert problems(path) == [
        "invalid Python: '(' was never closed [job.ipynb: cell 1 (line 1)] — the cell fails in the notebook too: "
        "fix it there",
        "`%scala` cells cannot run here: a job runs Python and SQL cells [job.ipynb: cell 2 (line 1)] — rewrite the "
        "cell in Python or SQL, or tag it `interactive`",
        "`%r` cells cannot run here: a job runs Python and SQL cells [job.ipynb: cell 3 (line 1)] — rewrite the cell "
        "in Python or SQL, or tag it `interactive`",
        "`%sql` must be the first line of its cell [job.ipynb: cell 4 (line 2)] — a language magic applies to the "
        "whole cell: start a new cell with it",
        "`%run ./missing`: no notebook ./missing next to this one (tried missing.py, missing.ipynb, missing.sql) "
        "[job.ipynb: cell 5 (line 1)] — check the path, relative to this notebook",
        "`%run ./helpers x=1`: 'x=1' is not an argument [job.ipynb: cell 6 (line 1)] — arguments are $name=value, "
        "e.g. %run ./helpers $day=\"2026-01-01\"",
        "`%run /Workspace/Shared/lib` names a workspace path; here a notebook includes files of its bundle by "
        "relative path [job.ipynb: cell 7 (line 1)] — e.g. %run ./helpers",
    ]
    (tmp_path / "helpers.py").write_text("# Databricks notebook source\nx = 1\n")
    compiled = compile_notebook(notebook(tmp_path, "%run ./helpers $day=\"2026-01-01\"", name="ok.ipynb"))
    assert compiled.executes == [1] and compiled.includes == [(tmp_path / "helpers.py").resolve()]


def test_reading_a_databricks_sql_notebook(tmp_path: Path) -> None:
    path = tmp_path / "report.sql"
    path.write_text("-- Databricks notebook source\nCREATE OR REPLACE TEMP VIEW v AS SELECT 1 AS x\n\n"
                    "-- COMMAND ----------\n\n-- MAGIC %python\n-- MAGIC print(spark.table('v').count())\n\n"
                    "-- COMMAND ----------\n\n-- MAGIC %md\n-- MAGIC # Notes\n")
    cells = read_notebook(path)
    assert [(c.kind, c.language()[0]) for c in cells] == [("code", "sql"), ("code", "python"), ("markdown", "sql")]
    assert cells[1].language()[1] == "print(spark.table('v').count())\n"
    assert compile_notebook(path).executes == [1, 2]


def test_an_unknown_parameter_is_an_error_listing_the_defined_ones(tmp_path: Path) -> None:
    path = notebook(tmp_path, "%load_ext streamling", 'dbutils.widgets.text("rows", "10")',
                    "%%streamling source orders\ntype: generate\nrows: {{rows}}\nprimary_key: {{key}}\n", SINK_CELL)
    assert problems(path) == [
        "unknown parameter 'key' in the cell body [job.ipynb: cell 3 (line 1)] — defined parameters: rows; "
        "declare one with dbutils.widgets.text('key', '<default>') or pass it as a job parameter"]
    assert compile_notebook(path, {"key": "id"}).document["sources"]["orders"]["primary_key"] == "id"


def test_a_parameter_in_the_cell_line(tmp_path: Path) -> None:
    path = notebook(tmp_path, "%load_ext streamling", 'dbutils.widgets.text("upstream", "orders")', SOURCE_CELL,
                    "%%streamling sink out --from {{upstream}} --option 'table=t_${upstream}'\ntype: postgres\n")
    assert compile_notebook(path).document["sinks"]["out"] == {"type": "postgres", "from": ["orders"],
                                                               "table": "t_orders"}


def test_every_problem_is_reported_at_once_with_its_cell(tmp_path: Path) -> None:
    path = notebook(tmp_path, "md:# A notebook", "%pip install requests", "%load_ext streamling",
                    "!ls -l", "%%sql\nSELECT 1", "%config InlineBackend.figure_format = 'retina'",
                    "x = 1", SOURCE_CELL, SINK_CELL + "\n", "%%streamling sink echo --from out\ntype: print\n",
                    "%%streamling sink lost --from nowhere\ntype: print\n", "%streamling remove ghost",
                    "%streamling run --rows 3 --seconds 4")
    assert problems(path) == [
        "`%pip` does not run in a job: it would install into the environment streamling itself runs from "
        "[job.ipynb: cell 2 (line 1)] — install the package into the environment the job runs in before deploying, "
        "or tag the cell `interactive` to keep it for the notebook only",
        "'ghost': there is no node 'ghost' [job.ipynb: cell 12 (line 1)] — nodes: orders, out, echo, lost",
        "give --rows or --seconds, not both [job.ipynb: cell 13 (line 1)]",
        "print sink 'echo': 'from' names sink 'out'; only sources and transforms produce rows "
        "[job.ipynb: cell 10 (line 1)]",
        "print sink 'lost': 'from' names 'nowhere', which does not exist [job.ipynb: cell 11 (line 1)]",
    ]


def test_raises_exception_cells_are_compiled_like_the_notebook_runs_them(tmp_path: Path) -> None:
    path = notebook(tmp_path, "%load_ext streamling", SOURCE_CELL, SINK_CELL,
                    ("%%streamling sink broken\ntype: print\n", ["raises-exception"]),
                    ("%%streamling sink out --from orders\ntype: blackhole\n", ["raises-exception"]),
                    ("print(1 / 0)", ["raises-exception", "interactive"]))
    compiled = compile_notebook(path)
    # the tagged cells fail in the notebook, and a failing cell changes nothing: 'out' stays a print sink
    assert compiled.document["sinks"] == {"out": {"type": "print", "from": ["orders"]}}
    assert compiled.warnings == [
        "cell 4 (tagged raises-exception) fails as in the notebook and changes nothing in the job: Node 'broken': a "
        "sink reads one node: add --from UPSTREAM — %%streamling sink broken --from <transform or source>",
        "cell 5 (tagged raises-exception) fails in the notebook, so its definition of 'out' is not part of the job"]
    python = notebook(tmp_path, "%load_ext streamling", SOURCE_CELL, SINK_CELL, ("1 / 0", ["raises-exception"]),
                      name="python.ipynb")
    assert compile_notebook(python).executes == [4]  # the job runs it, and goes on past its failure


def test_widget_declarations_need_literal_arguments_and_known_names(tmp_path: Path) -> None:
    path = notebook(tmp_path, "%load_ext streamling",
                    'import os\ndbutils.widgets.text("topic", os.environ["TOPIC"])',
                    'dbutils.widgets.dropdown("mode", "fast", ["slow", "safe"])',
                    'env = dbutils.widgets.get("env")', SOURCE_CELL, SINK_CELL)
    assert problems(path) == [  # a computed default (cell 2) is known when the job runs the notebook
        "dbutils.widgets.dropdown: default value 'fast' of dropdown widget 'mode' is not one of its choices: slow, "
        "safe [job.ipynb: cell 3 (line 1)]",
        "No input widget named env is defined [job.ipynb: cell 4 (line 1)] — declare it first, e.g. "
        "dbutils.widgets.text('env', '<default>'), or pass it as a job parameter",
    ]
    ok = notebook(tmp_path, "%load_ext streamling",
                  'dbutils.widgets.combobox(name="env", defaultValue="dev", choices=["dev", "prod"], label="Env")\n'
                  'env = dbutils.widgets.get("env")', SOURCE_CELL, SINK_CELL, name="ok.ipynb")
    assert compile_notebook(ok).parameters == {"env": "dev"}


def test_a_notebook_without_nodes_and_other_config(tmp_path: Path) -> None:
    assert problems(notebook(tmp_path, "%load_ext streamling", "md:nothing here")) == [
        "the notebook defines no pipeline [job.ipynb] — add %%streamling source/transform/sink cells"]
    path = notebook(tmp_path, "%load_ext streamling\n%config StreamlingMagics.app_id = 'x'", SOURCE_CELL, SINK_CELL,
                    name="config.ipynb")
    assert problems(path) == [
        "StreamlingMagics has no setting 'app_id' [config.ipynb: cell 1 (line 2)] — settings: application_id, "
        "config_name, full_traceback, monitor, sample_rows"]


def test_pipeline_cell_and_source_lines_locate_problems(tmp_path: Path) -> None:
    document = "sources:\n  orders: {type: generate, rows: 10}\nsinks:\n  out: {type: print, from: [orders], x: 1}\n"
    path = notebook(tmp_path, "%load_ext streamling", "%%streamling pipeline\n" + document)
    [problem] = problems(path)
    assert problem.startswith("print sink 'out': unknown key 'x'") and "[job.ipynb: cell 2 (line 1)]" in problem
    source = tmp_path / "job.py"
    source.write_text("# Databricks notebook source\n# MAGIC %load_ext streamling\n\n# COMMAND ----------\n\n"
                      "# DBTITLE 1,Source\n# MAGIC %%streamling source orders\n# MAGIC type: generate\n# MAGIC\n"
                      "# MAGIC rows: 10\n\n# COMMAND ----------\n\nimport os\nos.getcwd()\n")
    assert [p.split(" — ")[0] for p in problems(source)] == ["the pipeline has no sinks [job.py]"]


def test_reading_a_databricks_source_notebook(tmp_path: Path) -> None:
    path = tmp_path / "nb.py"
    path.write_text("# Databricks notebook source\n# MAGIC %md\n# MAGIC # Title\n# MAGIC\n# MAGIC text\n\n"
                    "# COMMAND ----------\n\n# DBTITLE 1,Declare\n# streamling: interactive\nx = 1\n\n"
                    "# COMMAND ----------\n\n# MAGIC %%streamling source a\n# MAGIC type: generate\n")
    assert read_notebook(path) == [
        Cell(1, "markdown", "# Title\n\ntext\n", []),
        Cell(2, "code", "x = 1\n", ["interactive"]),
        Cell(3, "code", "%%streamling source a\ntype: generate\n", []),
    ]
    assert [c.lines for c in read_notebook(path)] == [[3, 4, 5], [11], [15, 16]]
    plain = tmp_path / "plain.py"
    plain.write_text("print('hello')\n")
    with pytest.raises(Exception, match="not a notebook"):
        read_notebook(plain)


def test_the_compiled_yaml_is_a_pipeline_file(tmp_path: Path) -> None:
    from streamling.spec import parse_pipeline

    compiled = compile_notebook(IPYNB)
    assert yaml.safe_load(compiled.to_yaml())["sources"] == compiled.document["sources"]
    assert set(parse_pipeline(compiled.to_yaml()).nodes) == {"orders", "large_orders", "labelled", "console"}
