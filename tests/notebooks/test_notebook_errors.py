"""A failing magic fails its cell for every runner: executed in a real kernel (nbclient, as nbconvert
and papermill run notebooks), execution stops at the cell with one clean ``PipelineError`` output —
no Python or Java traceback — and later cells do not run. The failures here happen before Spark
starts, so no JVM is needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[2]


def execute(tmp_path: Path, *sources: str) -> tuple[Any, CellExecutionError | None]:
    """Run the cells in a fresh ``python3`` kernel (the venv's: jupyter_client starts ``python`` as this
    interpreter) and return the notebook with its outputs and the error that stopped it."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    client = NotebookClient(nb, kernel_name="python3", timeout=120, startup_timeout=120,
                            resources={"metadata": {"path": str(tmp_path)}})
    error = None
    try:
        client.execute(cwd=str(tmp_path))
    except CellExecutionError as exc:
        error = exc
    return nb, error


def _errors(cell: Any) -> list[Any]:
    return [o for o in cell.outputs if o.output_type == "error"]


def _assert_clean(output: Any) -> str:
    text = "\n".join(output.traceback)
    assert output.ename == "PipelineError"
    assert "Traceback (most recent call last)" not in text
    assert "\tat " not in text and "org.apache" not in text and "py4j" not in text.lower()
    assert text == f"PipelineError: {output.evalue}"
    return text


def test_a_failing_magic_stops_the_notebook_with_one_clean_error(tmp_path: Path) -> None:
    nb, error = execute(tmp_path, "%load_ext streamling",
                        "%%streamling source orders\ntype: generat\nrows: 10\n",
                        "%%streamling sink out --from orders\ntype: print\n",
                        "%streamling validate",
                        "print('after the failure')")
    assert error is not None
    assert error.ename == "PipelineError"
    # (the list of source types that follows grows with the registry)
    assert error.evalue.startswith("Node 'orders': unknown source type 'generat' (did you mean 'generate'?); "
                                   "available source types: ")
    assert "\n" not in error.evalue
    failed = nb.cells[1]  # the definition cell checks its node at once
    [output] = _errors(failed)
    _assert_clean(output)
    assert output.evalue == error.evalue
    assert not [o for o in failed.outputs if o.output_type == "stream" and o.name == "stderr"]
    for later in nb.cells[2:]:
        assert later.execution_count is None and later.outputs == []


def test_every_problem_is_one_line_of_the_error(tmp_path: Path) -> None:
    nb, error = execute(tmp_path, "%load_ext streamling",
                        "%%streamling pipeline\nsources:\n  orders: {type: generat}\n"
                        "sinks:\n  out: {type: prnt, from: orders}\n")
    assert error is not None
    [output] = _errors(nb.cells[1])
    _assert_clean(output)
    first, second = output.evalue.splitlines()
    assert first.startswith("Node 'orders': unknown source type 'generat' (did you mean 'generate'?)")
    assert second.startswith("Node 'out': unknown sink type 'prnt' (did you mean 'print'?)")


def test_a_failing_line_magic_inside_python_code_fails_the_cell(tmp_path: Path) -> None:
    nb, error = execute(tmp_path, "%load_ext streamling",
                        "x = 1\n%streamling debug nosuch\nx = 2",
                        "x")
    assert error is not None
    [output] = _errors(nb.cells[1])
    _assert_clean(output)
    assert output.evalue == ("Node 'nosuch': no captured batch yet — run `%streamling capture nosuch` while the "
                             "pipeline runs, or `%streamling preview nosuch`")
    assert nb.cells[2].execution_count is None


def test_full_traceback_shows_the_original_exception(tmp_path: Path) -> None:
    nb, error = execute(tmp_path, "%load_ext streamling\n%config StreamlingMagics.full_traceback = True",
                        "%streamling debug nosuch")
    assert error is not None
    [output] = _errors(nb.cells[1])
    assert output.ename == "StreamlingError"
    assert "no captured batch yet" in output.evalue
    assert len(output.traceback) > 1  # the whole Python traceback


def test_a_parameter_reference_in_a_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLING_JOB_PARAMETERS", json.dumps({"rows": "7"}))
    nb, error = execute(tmp_path, "%load_ext streamling",
                        'dbutils.widgets.text("rows", "10")\ndbutils.widgets.text("name", "orders")',
                        "%%streamling source {{name}}\ntype: generate\nrows: ${rows}\n",
                        "%%streamling sink out --from ${name}\ntype: print\n",
                        "print(get_ipython().magics_manager.registry['StreamlingMagics'].pipeline.to_yaml())",
                        "%%streamling source other\ntype: generate\nrows: {{nope}}\n")
    assert error is not None and error.ename == "PipelineError"
    assert "unknown parameter 'nope' in the cell body" in error.evalue
    assert "defined parameters: name, rows" in error.evalue
    printed = "".join(o.text for o in nb.cells[4].outputs if o.output_type == "stream")
    assert "orders:\n    type: generate\n    rows: 7\n" in printed
    assert "from:\n    - orders\n" in printed


def test_a_script_that_does_not_load_fails_its_own_cell_without_a_jvm(tmp_path: Path) -> None:
    """The node is built as ``--validate`` builds it when its cell runs: the syntax error stops the
    notebook there (not at ``run``), and the previous definition of the node stays current."""
    nb, error = execute(tmp_path, "%load_ext streamling",
                        "%%streamling source orders\ntype: generate\nrows: 10\n",
                        "%%streamling transform tagged --from orders --type script\n"
                        "function process(row) { return {...row, tag: 'a'}; }",
                        "%%streamling transform tagged --from orders --type script\n"
                        "function process(row) { return {...row ; }",
                        "print('after the failure')")
    assert error is not None
    [output] = _errors(nb.cells[3])
    _assert_clean(output)
    assert output.evalue.startswith("Node 'tagged': the script does not load: SyntaxError"), output.evalue
    assert nb.cells[4].execution_count is None
    magics = "get_ipython().magics_manager.registry['StreamlingMagics'].pipeline"
    nb, error = execute(tmp_path, "%load_ext streamling",
                        "%%streamling source orders\ntype: generate\nrows: 10\n",
                        "%%streamling transform tagged --from orders --type script\n"
                        "function process(row) { return {...row, tag: 'a'}; }",
                        "try:\n    get_ipython().run_cell_magic('streamling', 'transform tagged --from orders --type "
                        "script', 'function process(row) { return {...row ; }')\nexcept Exception as exc:\n"
                        "    print(type(exc).__name__)",
                        f"print({magics}.to_yaml())")
    assert error is None
    printed = "".join(o.text for cell in nb.cells[3:] for o in cell.outputs if o.output_type == "stream")
    assert "PipelineError" in printed and "tag: 'a'" in printed and "...row ;" not in printed, printed


@pytest.mark.spark
def test_a_sql_mistake_shows_one_error_and_no_spark_output(tmp_path: Path) -> None:
    """What a user sees on ``show`` with an unknown column: the one-line error, no JVM or PySpark
    log above it (py4j tracebacks, the SQLQueryContextLogger plan dump, the JVM's start-up lines)."""
    nb, error = execute(tmp_path, "%load_ext streamling",
                        "%%streamling source orders\ntype: generate\nrows: 10\nprimary_key: id\n",
                        "%%streamling transform big --from orders\nSELECT id, amout FROM orders\n",
                        "%%streamling sink out --from big\ntype: blackhole\n",
                        "%streamling show")
    assert error is not None
    shown = nb.cells[4]
    [output] = _errors(shown)
    _assert_clean(output)
    assert output.evalue.startswith("Node 'big': ") and "amout" in output.evalue
    assert [o.output_type for o in shown.outputs] == ["error"], shown.outputs  # nothing above it
    noise = ("org.apache.spark", "SQLQueryContextLogger", "WARNING: Using incubator modules",
             "Setting default log level")
    stderr = "".join(o.text for cell in nb.cells for o in cell.outputs
                     if o.output_type == "stream" and o.name == "stderr")
    assert not [n for n in noise if n in stderr], stderr


def test_nbval_and_nbconvert_fail_on_a_notebook_whose_validate_fails(tmp_path: Path) -> None:
    """The runners themselves, as CI and jobs call them: each exits non-zero at the failed cell."""
    import os
    import subprocess
    import sys

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext streamling",
        "%%streamling transform big --from orderz\nSELECT id FROM orderz",  # a note: a later cell may define it
        "%streamling validate",
        "print('after the failure')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    env = {**os.environ, "PYTHONPATH": ""}
    nbval = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                            "--nbval-current-env", "-o", "addopts=", "-o", "testpaths=", str(path)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert nbval.returncode == 1, nbval.stdout + nbval.stderr
    assert "PipelineError" in nbval.stdout and "1 failed" in nbval.stdout, nbval.stdout
    nbconvert = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                                "--output", str(tmp_path / "out.ipynb"), str(path)],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert nbconvert.returncode != 0
    assert "PipelineError" in nbconvert.stderr and "orderz" in nbconvert.stderr, nbconvert.stderr[-2000:]
    assert "after the failure" not in nbconvert.stderr
