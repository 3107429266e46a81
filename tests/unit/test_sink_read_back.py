"""What the notebook's ``display`` of a sink shows when the sink's target cannot be read: the
reader each sink declares (``Sink.read_back``) words the failure with the table and where it is,
never the password. The services here are dead ports: nothing answers."""

from __future__ import annotations

from typing import Any

import yaml

from streamling.config import load_settings
from streamling.runtime.nodes import NodeContext, Sink
from streamling.spec import parse_pipeline
from streamling.util import free_port

PASSWORD = "s3cret-not-for-display"


def _sink(body: dict[str, Any], **overrides: Any) -> Sink:
    from streamling.runtime.planner import _instantiate

    doc = {"sources": {"s": {"type": "generate", "rows": 1}}, "sinks": {"out": {"from": "s", **body}}}
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["out"]
    ctx = NodeContext(spec=spec, settings=load_settings(environ={}, overrides=overrides), primary_key=["id"],
                      dry_run=True)
    sink = _instantiate(spec, ctx)
    assert isinstance(sink, Sink)
    return sink


def _failure(sink: Sink) -> str:
    reader = sink.read_back(None)  # type: ignore[arg-type]  # no Spark: these readers do not use it
    assert reader is not None
    try:
        reader.read(10)
    except Exception as exc:  # noqa: BLE001 - whatever the client raises is what the view words
        return reader.error_text(exc)
    finally:
        reader.close()
    raise AssertionError("a dead port answered")


def test_a_dead_postgres_is_named_with_the_table_and_without_the_password() -> None:
    port = free_port()
    for body, table in (({"type": "postgres", "table": "orders"}, "orders"),
                        ({"type": "postgres_aggregate", "landing_table": "orders_landing", "agg_table": "orders_agg",
                          "group_by": {"customer": {}}, "aggregate": {"n": {"fn": "count"}}}, "orders_agg")):
        sink = _sink(body, postgres_sink={"host": "127.0.0.1", "port": port, "pass": PASSWORD})
        text = _failure(sink)
        assert text.startswith(f'querying "public"."{table}" on 127.0.0.1:{port}/'), text
        assert "Connection refused" in text and PASSWORD not in text


def test_a_dead_clickhouse_is_named_with_the_table() -> None:
    port = free_port()
    sink = _sink({"type": "clickhouse", "table": "orders"},
                 clickhouse_sink={"url": f"http://127.0.0.1:{port}", "password": PASSWORD})
    text = _failure(sink)
    assert text.startswith("querying ClickHouse table default.orders failed: "), text
    assert PASSWORD not in text


def test_sinks_that_keep_nothing_to_query_have_no_reader() -> None:
    assert _sink({"type": "print"}).read_back(None) is None  # type: ignore[arg-type]
    assert _sink({"type": "blackhole"}).read_back(None) is None  # type: ignore[arg-type]
