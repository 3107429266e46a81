"""Notebook parameters the Databricks way: ``dbutils.widgets`` declare them, a job overrides them through
``STREAMLING_JOB_PARAMETERS``, and ``{{name}}`` / ``${name}`` insert them into ``%%streamling`` cells."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from typing import Any

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython

from streamling.errors import StreamlingError
from streamling.notebook import load_ipython_extension
from streamling.notebook.cells import PipelineError, cell_node, parse_line, substitute
from streamling.notebook.dbutils import PARAMETERS_ENV, DBUtils, InputWidgetNotDefined, Widgets, dbutils


def test_widgets_hold_defaults_that_job_parameters_override() -> None:
    env = {PARAMETERS_ENV: json.dumps({"topic": "prod.orders", "extra": "1", "n": 5})}
    widgets = Widgets(env)
    widgets.text("topic", "orders", "Kafka topic")
    widgets.dropdown("mode", "fast", ["fast", "safe"])
    widgets.combobox("region", "eu", ["us"], label="Region")
    widgets.multiselect("days", "mon,tue", ["mon", "tue", "wed"])
    assert widgets.get("topic") == "prod.orders"
    assert widgets.get("mode") == "fast"
    assert widgets.get("extra") == "1"  # a job parameter no widget declares is readable, as on Databricks
    assert widgets.getAll() == {"topic": "prod.orders", "mode": "fast", "region": "eu", "days": "mon,tue",
                                "extra": "1", "n": "5"}
    assert widgets.defaults() == {"topic": "orders", "mode": "fast", "region": "eu", "days": "mon,tue"}
    assert widgets.getArgument("nope", "x") == "x" and widgets.getArgument("mode") == "fast"
    widgets.remove("mode")
    with pytest.raises(InputWidgetNotDefined, match="^No input widget named mode is defined$"):
        widgets.get("mode")
    widgets.removeAll()
    assert widgets.defaults() == {}


def test_widget_declarations_are_checked() -> None:
    widgets = DBUtils(environ={}).widgets
    with pytest.raises(ValueError, match="not one of its choices: fast, safe"):
        widgets.dropdown("mode", "slow", ["fast", "safe"])
    with pytest.raises(ValueError, match="not one of its choices"):
        widgets.multiselect("days", "mon,sun", ["mon", "tue"])
    with pytest.raises(TypeError):
        widgets.text("n", None)  # type: ignore[arg-type]
    with pytest.raises(InputWidgetNotDefined):
        widgets.remove("never")


def test_job_parameters_must_be_a_json_object() -> None:
    with pytest.raises(StreamlingError, match="STREAMLING_JOB_PARAMETERS is not valid JSON"):
        Widgets({PARAMETERS_ENV: "topic=orders"}).getAll()
    with pytest.raises(StreamlingError, match="must be a JSON object"):
        Widgets({PARAMETERS_ENV: "[1]"}).getAll()


def test_substitute_replaces_both_forms_and_leaves_dotted_ones() -> None:
    values = {"topic": "orders", "rows": "10"}
    assert substitute("topic: {{topic}}\nrows: {{ rows }}", values, "x") == "topic: orders\nrows: 10"
    assert substitute("t_${topic} ${var.x} {{job.id}} $${topic}", values, "x") == \
        "t_orders ${var.x} {{job.id}} ${topic}"
    assert substitute("no references", {}, "x") == "no references"
    script = "return `${topic} is ${row.x}` + '{{topic}}' + `$${topic}`;"
    assert substitute(script, values, "x", dollar_braces=False) == \
        "return `${topic} is ${row.x}` + 'orders' + `$${topic}`;"


def test_an_unknown_parameter_names_every_unknown_and_the_defined_ones() -> None:
    with pytest.raises(StreamlingError) as err:
        substitute("{{a}} ${b} {{a}} {{rows}}", {"rows": "1", "topic": "t"}, "the cell body")
    assert err.value.headline() == (
        "unknown parameters 'a', 'b' in the cell body — defined parameters: rows, topic; declare one with "
        "dbutils.widgets.text('a', '<default>') or pass it as a job parameter")


def test_cell_lines_and_bodies_take_parameters() -> None:
    values = {"name": "orders", "n": "5"}
    args = parse_line("source {{name}} --option 'rows=${n}'", values)
    assert cell_node(args, "type: generate\nprimary_key: id\n", values) == (
        "source", "orders", {"type": "generate", "primary_key": "id", "rows": 5})
    script = cell_node(parse_line("transform t --from {{name}} --type script", values),
                       "function process(row) { return {...row, s: `${row.id}-{{n}}`}; }", values)
    assert script.definition["script"] == "function process(row) { return {...row, s: `${row.id}-5`}; }\n"
    assert cell_node(parse_line("pipeline"), "sources: {a: {type: generate, rows: {{n}}}}", values).definition == {
        "sources": {"a": {"type": "generate", "rows": 5}}}


@pytest.fixture
def ip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    shell = start_ipython() or get_ipython()
    assert shell is not None
    shell.run_line_magic("load_ext", "streamling")
    magics = shell.magics_manager.registry["StreamlingMagics"]
    magics._pipeline = None
    monkeypatch.delenv(PARAMETERS_ENV, raising=False)
    yield shell
    magics._pipeline = None
    dbutils.widgets.removeAll()


def test_the_magic_substitutes_widget_values_and_job_parameters(ip: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ip.user_ns["dbutils"] is dbutils
    ip.run_cell('dbutils.widgets.text("rows", "10")\ndbutils.widgets.text("src", "orders")').raise_error()
    ip.run_cell_magic("streamling", "source {{src}}", "type: generate\nrows: {{rows}}\n")
    monkeypatch.setenv(PARAMETERS_ENV, json.dumps({"rows": "99"}))
    ip.run_cell_magic("streamling", "source other", "type: generate\nrows: ${rows}\n")
    nodes = ip.magics_manager.registry["StreamlingMagics"].pipeline.nodes
    assert nodes["orders"][1]["rows"] == 10 and nodes["other"][1]["rows"] == 99
    unknown = r"unknown parameter 'nope' in the cell line — defined parameters: rows, src;"
    with pytest.raises(PipelineError, match=unknown):
        ip.run_line_magic("streamling", "remove {{nope}}")


class _Shell:
    def __init__(self, user_ns: dict[str, Any]) -> None:
        self.user_ns = user_ns
        self.registered: list[Any] = []
        self.custom_exc: tuple[Any, Any] | None = None
        self.custom_exceptions: tuple[type[BaseException], ...] = ()  # as IPython's shell has it
        self.magics_manager = types.SimpleNamespace(registry={})

    def register_magics(self, magics: Any) -> None:
        self.registered.append(magics)

    def set_custom_exc(self, exc_tuple: tuple[type[BaseException], ...], handler: Any) -> None:
        self.custom_exc = (exc_tuple, handler)
        self.custom_exceptions = exc_tuple


def test_load_ext_keeps_a_dbutils_the_kernel_already_has() -> None:
    databricks = object()
    shell = _Shell({"dbutils": databricks})
    load_ipython_extension(shell)
    assert shell.user_ns["dbutils"] is databricks
    assert shell.custom_exc is not None and shell.custom_exc[0] == (PipelineError,)
    fresh = _Shell({})
    load_ipython_extension(fresh)
    assert fresh.user_ns["dbutils"] is dbutils


def test_in_a_notebook_the_widgets_are_input_controls_whose_values_the_next_get_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import IPython.display

    import streamling.notebook
    from streamling.notebook.parameter_bar import ParameterBar

    shown: list[Any] = []
    cell = types.SimpleNamespace(execution_count=1)
    monkeypatch.setattr(streamling.notebook, "in_kernel", lambda: True)
    updated: list[str] = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id: shown.append(obj))
    monkeypatch.setattr(IPython.display, "update_display", lambda obj, display_id: updated.append(display_id))
    monkeypatch.setattr(IPython, "get_ipython", lambda: cell)
    env: dict[str, str] = {}
    w = Widgets(environ=env)
    w.text("topic", "orders", "Kafka topic")
    w.dropdown("mode", "fast", ["fast", "safe"])
    cell.execution_count = 2
    w.combobox("region", "eu", ["eu", "us"])
    w.multiselect("kinds", "a", ["a", "b", "c"])
    # Each declaring cell shows, once, the one widget that draws them all (in the bar above the cells).
    bar = shown[0]
    assert isinstance(bar, ParameterBar) and shown == [bar, bar]
    # a cell's later declarations update the displays (the text/HTML fallback of every cell showing it)
    assert updated == [f"streamling-parameters-{bar.model_id}"] * 2
    assert bar.controls == [
        {"name": "topic", "kind": "text", "label": "Kafka topic", "choices": []},
        {"name": "mode", "kind": "dropdown", "label": "mode", "choices": ["fast", "safe"]},
        {"name": "region", "kind": "combobox", "label": "region", "choices": ["eu", "us"]},
        {"name": "kinds", "kind": "multiselect", "label": "kinds", "choices": ["a", "b", "c"]}]
    assert bar.values == {"topic": "orders", "mode": "fast", "region": "eu", "kinds": "a"}
    bar.values = {"topic": "payments", "mode": "safe", "region": "ap", "kinds": "a,c"}  # as the page sets them
    assert w.getAll() == {"topic": "payments", "mode": "safe", "region": "ap", "kinds": "a,c"}
    assert w.defaults()["topic"] == "orders"  # what a job of this notebook uses
    assert bar.summary_text() == "parameters: topic = payments, mode = safe, region = ap, kinds = a,c"
    # re-running the declaring cell keeps what was entered, as on Databricks
    cell.execution_count = 3
    w.text("topic", "orders", "Kafka topic")
    assert w.get("topic") == "payments" and len(shown) == 3 and bar.values["topic"] == "payments"
    w.remove("mode")
    assert [c["name"] for c in bar.controls] == ["topic", "region", "kinds"] and "mode" not in bar.values
    # a page still showing a removed widget (or sending a non-text value) changes nothing the kernel reads
    bar.values = {**bar.values, "mode": "fast", "region": ["not", "text"]}
    assert w.getAll() == {"topic": "payments", "region": "ap", "kinds": "a,c"}
    env[PARAMETERS_ENV] = json.dumps({"topic": "from-the-job"})  # a job parameter still wins
    assert w.get("topic") == "from-the-job"


def test_a_task_written_for_databricks_imports_our_dbutils_and_gets_spark_only_when_it_asks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from streamling.notebook import dbutils as ours

    for name in ("databricks", "databricks.sdk", "databricks.sdk.runtime"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    ours.provide_databricks_runtime()
    from databricks.sdk.runtime import dbutils, getArgument  # type: ignore[import-not-found]

    assert dbutils is ours.dbutils and getArgument == ours.dbutils.widgets.getArgument
    runtime = sys.modules["databricks.sdk.runtime"]
    assert "spark" not in vars(runtime)  # no JVM until the code asks for the session
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = runtime.nothing
