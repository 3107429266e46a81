"""A definition cell shows its node's resolved schema when the kernel's Spark session is warm, fails
with ``show``'s one-line error when its node does not analyse, and never starts a session itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython

from streamling.notebook.magics import PipelineError
from streamling.notebook.session import NotebookPipeline

pytestmark = pytest.mark.spark

SOURCE = "type: generate\nrows: 100\nprimary_key: id\n"


@pytest.fixture
def magics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.chdir(tmp_path)
    shell = start_ipython() or get_ipython()
    assert shell is not None
    shell.run_line_magic("load_ext", "streamling")
    shell.run_line_magic("config", "StreamlingMagics.full_traceback = False")
    registered = shell.magics_manager.registry["StreamlingMagics"]
    yield registered
    registered._pipeline = None


def _warm(magics: Any, spark: Any, tmp_path: Path) -> NotebookPipeline:
    magics._pipeline = NotebookPipeline(application_id="cell_schema", cwd=tmp_path, spark=spark)
    return magics._pipeline  # type: ignore[no-any-return]


def test_a_cell_on_a_warm_session_shows_its_nodes_columns_and_types(magics: Any, spark: Any,
                                                                      tmp_path: Path) -> None:
    _warm(magics, spark, tmp_path)
    shown = magics.streamling("source orders", SOURCE)
    assert shown.text.startswith("orders → id: bigint, customer: string,") and shown.text.endswith(" · key: id")
    started = time.perf_counter()
    shown = magics.streamling("transform big --from orders",
                              "SELECT id, upper(customer) AS who, amount * quantity AS total FROM orders")
    elapsed = time.perf_counter() - started
    # No sink reads 'big' yet: an unfinished notebook still gets the schema.
    assert shown.text == "big → id: bigint, who: string, total: double, _gs_op: string · key: id"
    assert '<u>id</u>: <span style="color:#777">bigint</span>' in shown.html
    assert elapsed < 10, elapsed  # analysis only (measured ~0.1-0.3 s on a warm session)
    sink = magics.streamling("sink out --from big", "type: blackhole\n")
    assert sink.text.startswith("out → id: bigint, who: string")  # a sink shows what it receives


def test_a_sql_mistake_fails_the_cell_with_the_line_show_gives(magics: Any, spark: Any, tmp_path: Path) -> None:
    _warm(magics, spark, tmp_path)
    magics.streamling("source orders", SOURCE)
    with pytest.raises(PipelineError) as cell:
        magics.streamling("transform big --from orders", "SELECT id, nosuch FROM orders")
    message = str(cell.value)
    assert message.startswith("Node 'big': ") and "nosuch" in message and "\n" not in message
    assert "big" not in magics.pipeline.nodes  # the failed cell defined nothing
    # the same definition, put in place without its cell, fails `show` with the same line
    magics.pipeline.define("transform", "big", {"type": "sql", "from": ["orders"],
                                                "sql": "SELECT id, nosuch FROM orders"})
    magics.pipeline.define("sink", "out", {"type": "blackhole", "from": ["big"]})
    with pytest.raises(PipelineError) as show:
        magics.streamling("show")
    assert message in str(show.value).splitlines()
    # A key the output does not have is this node's problem too, found only by analysis.
    with pytest.raises(PipelineError, match=r"^Primary key validation failed for node 'big': columns \["):
        magics.streamling("transform big --from orders --option primary_key=nope", "SELECT id FROM orders")


def test_an_undefined_upstream_shows_only_the_note(magics: Any, spark: Any, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _warm(magics, spark, tmp_path)
    assert magics.streamling("transform big --from orders", "SELECT id FROM orders") is None
    assert "note: Node 'big': 'from' names 'orders', which does not exist" in capsys.readouterr().out
    # A problem of another node (its own cell failed) leaves this cell's schema out, not failing it.
    magics.streamling("source orders", SOURCE)
    magics.pipeline.define("transform", "broken", {"type": "sql", "from": ["orders"],
                                                   "sql": "SELECT id, missing FROM orders"})
    assert magics.streamling("transform after --from broken", "SELECT id FROM broken") is None


def test_without_a_warm_session_no_session_is_started(magics: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import streamling.runtime.session as session

    def no_session(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a definition cell started a Spark session")

    monkeypatch.setattr(session, "build_session", no_session)
    magics._pipeline = NotebookPipeline(application_id="cell_schema", cwd=tmp_path)
    started = time.perf_counter()
    assert magics.streamling("source orders", SOURCE) is None
    assert magics.streamling("transform big --from orders", "SELECT id, nosuch FROM orders") is None
    assert time.perf_counter() - started < 2.0
    assert magics.pipeline._spark is None
