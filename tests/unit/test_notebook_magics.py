"""Notebook authoring without Spark: cells build the same spec and plan as the YAML, exports run
unchanged, and a failing magic fails its cell with one readable line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython

from streamling.config import load_settings
from streamling.notebook.magics import PipelineError
from streamling.runtime.planner import build_plan
from streamling.spec import PipelineSpec, load_pipeline, parse_pipeline

YAML = """\
sources:
  raw.orders:
    type: generate
    rows: 1000
    primary_key: id
transforms:
  big:
    type: sql
    from: [raw.orders]
    sql: |
      SELECT id, customer, amount * quantity AS total
      FROM raw.orders WHERE amount > 500
  shout:
    type: script
    language: typescript
    from: [big]
    script: |
      function process(row: any) { return {...row, customer: row.customer.toUpperCase()}; }
sinks:
  out:
    type: postgres
    from: [shout]
    schema: shop
    table: big_orders
    on_conflict: nothing
  screen:
    type: print
    from: [big]
"""


@pytest.fixture
def ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    shell = start_ipython() or get_ipython()  # one shell per test process
    assert shell is not None
    shell.run_line_magic("load_ext", "streamling")
    shell.run_line_magic("config", "StreamlingMagics.full_traceback = False")
    from streamling.notebook.magics import StreamlingMagics

    magics = shell.magics_manager.registry["StreamlingMagics"]
    magics._pipeline = None  # a fresh notebook pipeline per test
    assert isinstance(magics, StreamlingMagics)
    yield shell
    magics._pipeline = None


def author(ip: Any) -> None:
    ip.run_cell_magic("streamling", "source raw.orders", "type: generate\nrows: 1000\nprimary_key: id\n")
    ip.run_cell_magic("streamling", "transform big --from raw.orders",
                      "SELECT id, customer, amount * quantity AS total\nFROM raw.orders WHERE amount > 500\n")
    ip.run_cell_magic("streamling", "transform shout --from big --type script --language typescript",
                      "function process(row: any) { return {...row, customer: row.customer.toUpperCase()}; }\n")
    ip.run_cell_magic("streamling", "sink out --from shout",
                      "type: postgres\nschema: shop\ntable: big_orders\non_conflict: nothing\n")
    ip.run_cell_magic("streamling", "sink screen --from big", "type: print\n")


def _shape(spec: PipelineSpec) -> dict[str, Any]:
    return {name: (n.kind, n.type, n.upstream, n.options.model_dump(by_alias=True)) for name, n in spec.nodes.items()}


def _pipeline(ip: Any) -> Any:
    return ip.magics_manager.registry["StreamlingMagics"].pipeline


def test_cells_build_the_same_spec_and_plan_as_the_yaml(ip: Any, tmp_path: Path) -> None:
    author(ip)
    from_cells = _pipeline(ip).spec()
    from_yaml = parse_pipeline(YAML)
    assert _shape(from_cells) == _shape(from_yaml)
    settings = load_settings(environ={}, cwd=tmp_path)
    assert build_plan(from_cells, settings).describe() == build_plan(from_yaml, settings).describe()


def test_export_writes_yaml_the_cli_loads_unchanged(ip: Any, tmp_path: Path) -> None:
    author(ip)
    out = ip.run_line_magic("streamling", "export exported/pipeline.yaml")
    path = tmp_path / "exported" / "pipeline.yaml"
    assert out.text == "wrote exported/pipeline.yaml — run it with: streamling exported/pipeline.yaml"
    assert _shape(load_pipeline(path)) == _shape(parse_pipeline(YAML))
    assert "sql: |" in path.read_text()  # multi-line SQL stays readable


def test_rerunning_a_cell_replaces_the_node_in_place(ip: Any) -> None:
    author(ip)
    ip.run_cell_magic("streamling", "transform big --from raw.orders", "SELECT id, customer FROM raw.orders")
    nb = _pipeline(ip)
    assert list(nb.nodes) == ["raw.orders", "big", "shout", "out", "screen"]
    assert nb.spec().nodes["big"].options.sql == "SELECT id, customer FROM raw.orders"


def test_pipeline_cell_takes_a_whole_yaml(ip: Any) -> None:
    result = ip.run_cell_magic("streamling", "pipeline", YAML)
    assert result.text == "pipeline is valid: 1 sources, 2 transforms, 2 sinks"
    assert _shape(_pipeline(ip).spec()) == _shape(parse_pipeline(YAML))


def test_remove_drops_a_node(ip: Any) -> None:
    author(ip)
    ip.run_line_magic("streamling", "remove screen")
    assert "screen" not in _pipeline(ip).nodes
    with pytest.raises(PipelineError, match="Node 'screen': there is no node 'screen'"):
        ip.run_line_magic("streamling", "remove screen")


def test_errors_fail_the_cell_with_one_line_per_problem(ip: Any) -> None:
    ip.run_cell_magic("streamling", "source orders", "type: generate\nrows: 10\n")
    with pytest.raises(PipelineError) as at_cell:
        ip.run_cell_magic("streamling", "sink out --from orders", "type: prnt\n")
    message = str(at_cell.value)
    assert message == ("Node 'out': unknown sink type 'prnt' (did you mean 'print'?); "
                       "available sink types: blackhole, clickhouse, delta, kafka, postgres, postgres_aggregate, "
                       "print, webhook")
    assert "Traceback" not in message
    # the same document fails validation with the same line (a pipeline cell is checked as validate does)
    with pytest.raises(PipelineError) as whole:
        ip.run_cell_magic("streamling", "pipeline", "sources:\n  orders: {type: generate, rows: 10}\n"
                                                    "sinks:\n  out: {type: prnt, from: orders}\n")
    assert str(whole.value) == message


def test_a_cell_that_fails_changes_nothing(ip: Any) -> None:
    author(ip)
    before = ip.run_line_magic("streamling", "yaml").text
    bad = [("transform big --from raw.orders", "SELECT id FROM raw.orders WHERE"),  # SQL that does not parse
           ("transform big --from raw.orders", "type: sql\nsql: SELECT 1\nfrom: [raw.orders]\nbogus: 1\n"),
           ("sink screen --from big", "type: prnt\n"),  # an unknown type
           ("sink screen --from big", "type: print\n  bad: [yaml\n"),  # YAML that does not parse
           ("transform fresh --from big", "SELECT id FROM big WHERE"),  # a new node: still not there
           ("pipeline", "sources:\n  x: {type: generate}\nsinks:\n  y: {type: prnt, from: x}\n")]
    for line, body in bad:
        with pytest.raises(PipelineError):
            ip.run_cell_magic("streamling", line, body)
        assert ip.run_line_magic("streamling", "yaml").text == before, line
        assert "pipeline is valid" in str(ip.run_line_magic("streamling", "validate"))


def test_a_definition_cell_checks_its_node_at_once_as_validate_would(ip: Any,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import time

    # A forward reference works: the sink is defined before its upstream; it is only noted.
    started = time.perf_counter()
    result = ip.run_cell("%%streamling sink out --from big\ntype: print\n")
    elapsed = time.perf_counter() - started
    assert result.error_in_exec is None and elapsed < 2.0
    assert "note: Node 'out': 'from' names 'big', which does not exist" in capsys.readouterr().out
    with pytest.raises(PipelineError, match="Node 'out': 'from' names 'big', which does not exist"):
        ip.run_line_magic("streamling", "validate")
    ip.run_cell_magic("streamling", "transform big --from orders", "SELECT id FROM orders")  # orders: later too
    ip.run_cell_magic("streamling", "source orders", "type: generate\nrows: 10\n")
    assert "pipeline is valid" in str(ip.run_line_magic("streamling", "validate"))
    # Each of these fails its own cell with the message validate would give, before any JVM.
    bad = [("source gen", "type: generat\n", "Node 'gen': unknown source type 'generat' (did you mean 'generate'?)"),
           ("source gen", "type: generate\nrowz: 5\n", "Node 'gen': unknown key 'rowz' (did you mean 'rows'?)"),
           ("transform t --from out --type script", "(r) => r", "Node 't': 'from' names sink 'out'"),
           ("transform t --from orders", "SELECT id FROM orders WHERE", "Node 't': SQL does not parse")]
    for line, body, expected in bad:
        with pytest.raises(PipelineError) as err:
            ip.run_cell_magic("streamling", line, body)
        assert str(err.value).startswith(expected), str(err.value)
        # the failed cell defined nothing: the pipeline stays as valid as it was
        assert "pipeline is valid" in str(ip.run_line_magic("streamling", "validate"))
    # An unknown name in --from is shown at once, without failing (a later cell may define it).
    result = ip.run_cell("%%streamling sink screen --from nosuch\ntype: print\n")
    assert result.error_in_exec is None
    assert "note: Node 'screen': 'from' names 'nosuch', which does not exist" in capsys.readouterr().out


def test_a_node_nothing_reads_yet_does_not_fail_its_cell(ip: Any) -> None:
    ip.run_cell_magic("streamling", "source orders", "type: generate\nrows: 10\n")
    ip.run_cell_magic("streamling", "sink out --from orders", "type: print\n")
    # The newest cell of a notebook being written: its reader is the next cell.
    assert ip.run_cell_magic("streamling", "transform t --from orders", "SELECT id FROM orders") is None
    with pytest.raises(PipelineError, match=r"nodes \['t'\] have no consumers"):
        ip.run_line_magic("streamling", "validate")


def test_bad_yaml_body_names_the_line(ip: Any) -> None:
    # the editor's line 3: the %%streamling line is line 1, the body's second line is line 3
    with pytest.raises(PipelineError, match=r"the cell body is not valid YAML at line 3 of the cell.*"
                                            r"write the source's keys"):
        ip.run_cell_magic("streamling", "source orders", "type: generate\n  rows: 10\n")


def test_sink_without_from_says_what_to_do(ip: Any) -> None:
    with pytest.raises(PipelineError, match=r"Node 'out': a sink reads one node: add --from UPSTREAM"):
        ip.run_cell_magic("streamling", "sink out", "type: print\n")


def test_full_traceback_switch_raises_the_original_error(ip: Any) -> None:
    from streamling.errors import StreamlingError

    ip.run_line_magic("config", "StreamlingMagics.full_traceback = True")
    try:
        with pytest.raises(StreamlingError):
            ip.run_line_magic("streamling", "validate")
    finally:
        ip.run_line_magic("config", "StreamlingMagics.full_traceback = False")


def test_unknown_command_lists_usage(ip: Any) -> None:
    with pytest.raises(PipelineError, match=r"(?s)unknown command 'frobnicate'.*%streamling validate"):
        ip.run_line_magic("streamling", "frobnicate")


def test_magic_names_do_not_clash_with_databricks_builtins(ip: Any) -> None:
    registered = set(ip.magics_manager.registry["StreamlingMagics"].magics["line"])
    registered |= set(ip.magics_manager.registry["StreamlingMagics"].magics["cell"])
    assert registered == {"streamling"}
    assert not registered & {"sql", "python", "scala", "r", "md", "sh", "fs", "run", "pip"}


def test_widget_stream_appends_from_threads() -> None:
    import threading

    from ipywidgets import Output

    from streamling.notebook.magics import _WidgetStream

    out = Output()
    stream = _WidgetStream(out)
    threads = [threading.Thread(target=stream.write, args=(f"line {i}\n",)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    texts = sorted(o["text"] for o in out.outputs)
    assert texts == sorted(f"line {i}\n" for i in range(20))
    assert all(o["name"] == "stdout" for o in out.outputs)


def test_debug_changes_without_a_key_compare_rows_as_multisets() -> None:
    import pyarrow as pa

    from streamling.notebook.batches import Capture, DebugResult

    before = pa.table({"v": [1, 1, 2, 3]})
    after = pa.table({"v": [1, 2, 2, 4], "w": ["a", "a", "a", "a"]})
    same_cols = DebugResult("t", Capture("t", 0, {}, {}, "run"), before, after.select(["v"]))
    assert same_cols.changes() == {"columns_added": [], "columns_removed": [], "rows_before": 4,
                                   "rows_after": 4, "rows_added": 2, "rows_removed": 2, "rows_changed": 0}
    widened = DebugResult("t", Capture("t", 0, {}, {}, "run"), before, after).changes()
    assert widened["columns_added"] == ["w"] and widened["rows_added"] == 4 and widened["rows_removed"] == 4


def test_a_failing_cell_shows_one_pipeline_error_line(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%streamling remove ghost")
    assert isinstance(result.error_in_exec, PipelineError)
    shown = capsys.readouterr()
    assert "PipelineError: Node 'ghost': there is no node 'ghost' — nodes: none yet" in shown.out + shown.err
    assert "Traceback" not in shown.out + shown.err
    assert ip.custom_exceptions == (PipelineError,)  # the handler did not fail and unregister itself


def test_spark_failure_logs_are_silenced_unless_full_traceback(ip: Any) -> None:
    import logging

    py4j = logging.getLogger("py4j.clientserver")
    assert py4j.level == logging.CRITICAL  # since the extension loaded
    ip.run_line_magic("config", "StreamlingMagics.full_traceback = True")
    try:
        assert py4j.level == logging.DEBUG
    finally:
        ip.run_line_magic("config", "StreamlingMagics.full_traceback = False")
    assert py4j.level == logging.CRITICAL


def test_plugin_nodes_are_defined_and_checked_in_cells_like_built_ins(ip: Any) -> None:
    ip.run_cell_magic("streamling", "source rnd", "type: basic_plugin.random_source\nmax_rows: 100\n")
    ip.run_cell_magic("streamling", "transform inserts --from rnd --type basic_plugin.filter_transform", "_gs_op: i\n")
    ip.run_cell_magic("streamling", "sink out --from inserts", "type: basic_plugin.print_sink\nmode: batch\n")
    assert "pipeline is valid" in str(ip.run_line_magic("streamling", "validate"))
    with pytest.raises(PipelineError) as err:
        ip.run_cell_magic("streamling", "source rnd", "type: basic_plugin.random_source\nmax_rows: many\n")
    assert str(err.value).startswith("Node 'rnd': plugin 'basic_plugin.random_source': option 'max_rows': "
                                     "Input should be a valid integer")


def test_expectations_in_cells(ip: Any) -> None:
    ip.run_cell_magic("streamling", "source orders", "type: generate\nrows: 10\n")
    ip.run_cell_magic("streamling", 'transform big --from orders --expect positive "amount > 0" --on-violation drop '
                                    '--expect known "country IS NOT NULL"', "SELECT * FROM orders")
    ip.run_cell_magic("streamling", "sink out --from big --expect has_id 'id IS NOT NULL' --on-violation fail",
                      "type: blackhole\n")
    assert "pipeline is valid" in str(ip.run_line_magic("streamling", "validate"))
    exported = yaml.safe_load(str(ip.run_line_magic("streamling", "yaml")))
    assert exported["transforms"]["big"]["expectations"] == [
        {"name": "positive", "condition": "amount > 0", "on_violation": "drop"},
        {"name": "known", "condition": "country IS NOT NULL"}]
    assert exported["sinks"]["out"]["expectations"] == [
        {"name": "has_id", "condition": "id IS NOT NULL", "on_violation": "fail"}]
    with pytest.raises(PipelineError, match="expectation 'broken': does not parse"):
        ip.run_cell_magic("streamling", "transform t --from orders --expect broken 'amount >'", "SELECT * FROM orders")


def test_warnings_are_plain_notes_in_the_cell_and_errors_stay_errors(
        ip: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import streamling.notebook

    logging.getLogger("streamling.runtime.flow").warning("not in a kernel: the process's own logging says it")
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(streamling.notebook, "in_kernel", lambda: True)
    logging.getLogger("streamling.runtime.flow").warning("flow 'orders': resuming %s with a different set of nodes",
                                                         "the checkpoint")
    logging.getLogger("streamling.runtime.flow").info("detail a notebook does not need")
    logging.getLogger("streamling.runtime.flow").error("flow 'orders' failed")
    out, err = capsys.readouterr()
    assert out == "streamling: flow 'orders': resuming the checkpoint with a different set of nodes\n"
    assert err == "streamling: flow 'orders' failed\n"
