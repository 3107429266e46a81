"""The sink contract: one test body that every sink writing to a real target passes (the replay body:
every sink keeping rows by key).

- a replayed epoch (Spark runs an uncommitted epoch again with the same id) leaves the target as the
  first run left it, and ``_gs_op`` updates and deletes apply;
- an unreachable target is transient: the flow's write (``flow.write_epoch``: the only place that
  retries) makes every attempt of its policy, and the error names the sink;
- a terminal failure (a refused login, a path that cannot be a table) is tried once, names the sink
  and never shows the secret; a refused login points at the credentials, not the data. The flow
  then fails the epoch, so it is not committed (shown once for all sinks in ``tests/spark/test_epochs.py``).

The rows are read back through the sink's own ``read_back`` reader, what ``display`` shows. A sink
joins by adding a ``Target`` to ``TARGETS``: what it is configured with, and what makes it fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamling.config import load_settings
from streamling.config.settings import RetrySettings
from streamling.errors import StreamlingError
from streamling.runtime.flow import write_epoch
from streamling.runtime.nodes import Epoch, NodeContext, Sink
from streamling.runtime.planner import sink_class
from streamling.spec import parse_pipeline
from streamling.util import free_port

pytestmark = pytest.mark.spark
DDL = "id long, name string, amount double, _gs_op string"
RETRY = RetrySettings(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=20)


@dataclass(frozen=True)
class Target:
    """One sink type on its real target."""

    name: str
    #: the sink's YAML keys for a table named ``table`` (``where`` is a fresh folder of the test)
    body: Callable[[str, Path], dict[str, Any]]
    #: the fixture that gives its service's settings as environment variables ("" for none)
    environ_fixture: str = ""
    #: environment overrides that point it at a port where nothing listens
    unreachable: Callable[[], dict[str, str]] | None = None
    #: keys (and a body change) that make it fail for good: a refused login, a path that is a file
    terminal: Callable[[Path], tuple[dict[str, str], dict[str, Any]]] | None = None
    #: the secret of its settings, which no error may show
    secret_key: str = ""
    #: whether its target holds the written rows by key (an aggregate holds their totals)
    keeps_rows: bool = True


def _delta_on_a_file(where: Path) -> tuple[dict[str, str], dict[str, Any]]:
    blocker = where / "not-a-folder"
    blocker.write_text("a file where the table's folder should be")
    return {}, {"path": str(blocker / "table")}


TARGETS = [
    Target("postgres", lambda table, _: {"type": "postgres", "table": table}, "pg_environ",
           unreachable=lambda: {"STREAMLING__POSTGRES_SINK__PORT": str(free_port())},
           terminal=lambda _: ({"STREAMLING__POSTGRES_SINK__PASS": "not-the-password"}, {}),
           secret_key="STREAMLING__POSTGRES_SINK__PASS"),
    Target("clickhouse", lambda table, _: {"type": "clickhouse", "table": table}, "ch_environ",
           unreachable=lambda: {"STREAMLING__CLICKHOUSE_SINK__URL": f"http://127.0.0.1:{free_port()}"},
           terminal=lambda _: ({"STREAMLING__CLICKHOUSE_SINK__PASSWORD": "not-the-password"}, {}),
           secret_key="STREAMLING__CLICKHOUSE_SINK__PASSWORD"),
    Target("delta", lambda table, where: {"type": "delta", "path": str(where / table)}, terminal=_delta_on_a_file),
    Target("postgres_aggregate", lambda table, _: {"type": "postgres_aggregate", "landing_table": f"{table}_landing",
                                                   "agg_table": table, "group_by": {"name": {}},
                                                   "aggregate": {"n": {"fn": "count"}}}, "pg_environ",
           unreachable=lambda: {"STREAMLING__POSTGRES_SINK__PORT": str(free_port())},
           terminal=lambda _: ({"STREAMLING__POSTGRES_SINK__PASS": "not-the-password"}, {}),
           secret_key="STREAMLING__POSTGRES_SINK__PASS", keeps_rows=False),
]
MARKS = {"postgres": [pytest.mark.postgres], "clickhouse": [pytest.mark.clickhouse], "delta": [],
         "postgres_aggregate": [pytest.mark.postgres]}


def _params(has: Callable[[Target], object]) -> list[Any]:
    return [pytest.param(t, id=t.name, marks=MARKS[t.name]) for t in TARGETS if has(t)]


class Sinks:
    """Sinks of one target type, opened on the test session's Spark and closed after the test."""

    def __init__(self, target: Target, spark: Any, environ: Mapping[str, str], where: Path, table: str) -> None:
        self.target, self.spark, self.environ, self.where, self.table = target, spark, environ, where, table
        self.made: list[Sink] = []
        self.opened: list[Sink] = []

    def make(self, environ: Mapping[str, str] | None = None, **body: Any) -> Sink:
        node = {"from": "gen", "primary_key": "id", **self.target.body(self.table, self.where), **body}
        doc = {"sources": {"gen": {"type": "generate", "rows": 1}}, "sinks": {"out": node}}
        spec = parse_pipeline(yaml.safe_dump(doc)).nodes["out"]
        settings = load_settings(environ={**self.environ, **(environ or {})}, cwd=self.where)
        ctx = NodeContext(spec=spec, settings=settings, primary_key=["id"], state_dir=str(self.where / "state"),
                          input_schema=self.spark.createDataFrame([], DDL).schema)
        sink = sink_class(spec)(ctx)
        self.made.append(sink)
        return sink

    def write(self, sink: Sink, rows: list[tuple[Any, ...]], epoch: int, attempts: list[int] | None = None) -> int:
        """Write one epoch as the flow does (``write_epoch``: retried by ``RETRY`` while transient),
        opening the sink in its first attempt; each attempt is counted in ``attempts``."""
        def attempt_once(df: Any, ep: Epoch) -> int:
            if attempts is not None:
                attempts.append(1)
            if sink not in self.opened:
                sink.open(self.spark)
                self.opened.append(sink)
            return write(df, ep)

        write = sink.write
        sink.write = attempt_once  # type: ignore[method-assign]
        try:
            return write_epoch(sink, self.spark.createDataFrame(rows, DDL),
                               Epoch(epoch, "f0", "contract", sink_token="contract-token"), RETRY)
        finally:
            sink.write = write  # type: ignore[method-assign]

    def rows(self, sink: Sink) -> list[tuple[Any, ...]]:
        reader = sink.read_back(self.spark)
        assert reader is not None, f"{self.target.name} sink has no reader"
        try:
            table, _ = reader.read(100)
        finally:
            reader.close()
        return sorted((r["id"], r["name"], float(r["amount"])) for r in table.select(["id", "name", "amount"])
                      .to_pylist())

    def close(self) -> None:
        for sink in self.made:
            sink.close()


@pytest.fixture()
def sinks(request: pytest.FixtureRequest, spark: Any, tmp_path: Path, unique_name: str) -> Iterator[Sinks]:
    target: Target = request.param
    environ = request.getfixturevalue(target.environ_fixture) if target.environ_fixture else {}
    made = Sinks(target, spark, environ, tmp_path, unique_name)
    yield made
    made.close()


@pytest.mark.parametrize("sinks", _params(lambda t: t.keeps_rows), indirect=True)
def test_a_replayed_epoch_changes_nothing_and_updates_and_deletes_apply(sinks: Sinks) -> None:
    sink = sinks.make()
    sinks.write(sink, [(1, "a", 1.0, "i"), (2, "b", 2.0, "i"), (3, "c", 3.0, "i")], epoch=0)
    second = [(1, "a2", 1.5, "u"), (2, None, None, "d"), (4, "d", 4.0, "i"), (4, "d2", 4.5, "u")]
    sinks.write(sink, second, epoch=1)
    expected = [(1, "a2", 1.5), (3, "c", 3.0), (4, "d2", 4.5)]
    assert sinks.rows(sink) == expected
    sinks.write(sink, second, epoch=1)  # Spark runs an epoch that was not committed again
    assert sinks.rows(sink) == expected
    again = sinks.make()  # a restarted driver replays it with new sink instances
    sinks.write(again, second, epoch=1)
    assert sinks.rows(again) == expected


@pytest.mark.parametrize("sinks", _params(lambda t: t.unreachable), indirect=True)
def test_an_unreachable_target_is_retried_by_the_flow_then_named(sinks: Sinks) -> None:
    assert sinks.target.unreachable is not None
    sink = sinks.make(sinks.target.unreachable())
    attempts: list[int] = []
    with pytest.raises(StreamlingError) as info:
        sinks.write(sink, [(1, "a", 1.0, "i")], epoch=0, attempts=attempts)
    assert len(attempts) == RETRY.max_attempts, "a transient failure gets every attempt of the policy"
    assert info.value.retriable and info.value.node == "out", info.value.describe(debug=True)
    assert str(info.value).startswith(f"{sinks.target.name} sink 'out': "), str(info.value)


@pytest.mark.parametrize("sinks", _params(lambda t: t.terminal), indirect=True)
def test_a_terminal_failure_is_tried_once_and_shows_no_secret(sinks: Sinks) -> None:
    assert sinks.target.terminal is not None
    environ, body = sinks.target.terminal(sinks.where)
    sink = sinks.make(environ, **body)
    attempts: list[int] = []
    with pytest.raises(StreamlingError) as info:
        sinks.write(sink, [(1, "a", 1.0, "i")], epoch=0, attempts=attempts)
    assert len(attempts) == 1, "a terminal failure is not retried"
    text = info.value.describe(debug=True)
    assert not info.value.retriable and info.value.node == "out", text
    assert str(info.value).startswith(f"{sinks.target.name} sink 'out': "), text
    if environ:  # a refused login names the keys to fix, not the data
        hint = (info.value.hint or "").lower()
        assert "user" in hint and "pass" in hint and "fix the table" not in text, text
    for secret in {environ.get(sinks.target.secret_key), sinks.environ.get(sinks.target.secret_key)} - {None, ""}:
        assert secret not in text
