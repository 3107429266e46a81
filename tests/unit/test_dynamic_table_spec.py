"""Dynamic tables without Spark: options, validation of the graph, planning order, settings and the
Arrow kernel behind ``dynamic_table_check``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from streamling.config import load_settings
from streamling.errors import ValidationError
from streamling.functions.dynamic_table import check_membership
from streamling.runtime.planner import effective_keys, split_flows
from streamling.spec import load_pipeline, parse_pipeline
from streamling.spec.sql import analyze_sql, dynamic_table_sql_problems, rewrite_dynamic_table_calls
from streamling.spec.transforms import DynamicTableTransformOptions
from streamling.transforms.dynamic_table import index_name

VALID = Path(__file__).resolve().parents[2] / "fixtures" / "pipelines" / "valid" / "dynamic_table.yaml"


def pipeline(transforms: dict[str, Any], sinks: dict[str, Any] | None = None,
             sources: dict[str, Any] | None = None) -> Any:
    doc = {"sources": sources or {"orders": {"type": "generate", "rows": 10},
                                  "refunds": {"type": "generate", "rows": 10}},
           "transforms": transforms,
           "sinks": sinks or {"out": {"type": "print", "from": "checked"}}}
    return parse_pipeline(yaml.safe_dump(doc, sort_keys=False))


def problems(transforms: dict[str, Any], sinks: dict[str, Any] | None = None,
             sources: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ValidationError) as info:
        pipeline(transforms, sinks, sources)
    return [p.headline() for p in info.value.problems]


def table(sql: str | None = "SELECT customer FROM orders WHERE amount > 900", **extra: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "dynamic_table", "backend_type": "InMemory", "backend_entity_name": "big"}
    if sql is not None:
        node["sql"] = sql
    return {**node, **extra}


CHECKED = {"type": "sql", "sql": "SELECT id FROM orders WHERE dynamic_table_check('big', customer)"}


# --- options -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spelling", "canonical"), [
    ("in-memory", "InMemory"), ("InMemory", "InMemory"), ("in_memory", "InMemory"), ("INMEMORY", "InMemory"),
    ("postgres", "Postgres"), ("Postgres", "Postgres"), ("POSTGRES", "Postgres"),
])
def test_backend_spellings(spelling: str, canonical: str) -> None:
    opts = DynamicTableTransformOptions.model_validate(
        {"type": "dynamic_table", "backend_type": spelling, "backend_entity_name": "t"})
    assert opts.backend_type == canonical
    assert (opts.column, opts.time_column, opts.sql, opts.cache) == ("value", "updated_at", None, None)


def test_unknown_and_foreign_keys_are_rejected_with_the_allowed_list() -> None:
    found = problems({"big": table(primary_key="id", colum="x"), "checked": CHECKED})
    assert found[0].startswith("dynamic_table transform 'big': unknown key 'primary_key'; allowed keys: "
                               "backend_entity_name, backend_type, cache, cache_refresh_debounce_ms, column, "
                               "description, from, schema, sql, telemetry, time_column, type")
    assert "unknown key 'colum' (did you mean 'column', 'time_column'?)" in found[1]


def test_bad_backend_and_postgres_identifiers() -> None:
    found = problems({"big": table(backend_type="redis"), "checked": CHECKED})
    assert "backend_type: must be Postgres or InMemory (got 'redis')" in found[0]
    found = problems({"big": table(backend_type="postgres", backend_entity_name="big-list"), "checked": CHECKED})
    assert "backend_entity_name 'big-list' is not a plain identifier" in found[0]


def test_from_needs_sql_and_names_one_input() -> None:
    assert "'from' is only used with 'sql'" in problems(
        {"big": table(None, **{"from": "orders"}), "checked": CHECKED})[0]
    assert "filled from one input; 'from' lists 2" in problems(
        {"big": table(**{"from": "orders, refunds"}), "checked": CHECKED})[0]


# --- graph validation ----------------------------------------------------------------------------

def test_checking_transform_runs_after_the_table_and_the_table_needs_no_consumer() -> None:
    spec = pipeline({"big": table(), "checked": CHECKED, "unused": table(None, backend_entity_name="unused")},
                    sources={"orders": {"type": "generate", "rows": 10}})
    assert spec.nodes["checked"].upstream == ["orders"]
    assert spec.nodes["checked"].requires == ["big"]
    assert spec.nodes["big"].upstream == ["orders"]
    order = [n.name for n in spec.topological()]
    assert order.index("big") < order.index("checked")


def test_undefined_table_names_the_table_and_suggests() -> None:
    sql = {"type": "sql", "sql": "SELECT id FROM orders WHERE dynamic_table_check('bigg', customer)"}
    found = problems({"big": table(), "checked": sql})
    assert found == ["sql transform 'checked': dynamic table 'bigg' is used in SQL transform but not defined in "
                     "pipeline topology (did you mean 'big'?) [transforms.checked.sql (line 16)] — add a transform "
                     "of type dynamic_table named 'bigg', or fix the name"]


def test_checked_name_must_be_a_dynamic_table_given_as_a_literal() -> None:
    sql = {"type": "sql", "sql": "SELECT id FROM orders WHERE dynamic_table_check('other', customer)"}
    other = {"type": "sql", "sql": "SELECT id FROM refunds"}
    found = problems({"other": other, "checked": sql}, sinks={"out": {"type": "print", "from": "checked"},
                                                              "o2": {"type": "print", "from": "other"}})
    assert "dynamic_table_check names 'other', which is a sql transform, not a dynamic_table" in found[0]
    # a column naming the table is Streamling's other form: checked per batch, not here
    sql = {"type": "sql", "sql": "SELECT id FROM orders WHERE dynamic_table_check(customer, customer)"}
    assert not [p for p in problems({"big": table(), "checked": sql}) if "dynamic_table_check" in p]
    sql = {"type": "sql", "sql": "SELECT id FROM orders WHERE dynamic_table_check(1 + 1, customer)"}
    assert ("must be the dynamic table's name, as a string literal or a column holding it, found 1 + 1"
            in problems({"big": table(), "checked": sql})[0])


def test_table_filled_by_sql_must_be_checked_on_the_same_input() -> None:
    sql = {"type": "sql", "sql": "SELECT id FROM refunds WHERE dynamic_table_check('big', customer)"}
    found = problems({"big": table(), "checked": sql}, sources={"orders": {"type": "generate", "rows": 10},
                                                                 "refunds": {"type": "generate", "rows": 10}})
    assert "dynamic table 'big' is filled from 'orders' but this transform reads 'refunds'" in found[0]
    # a table filled outside the pipeline can be checked from any input
    spec = pipeline({"big": table(None), "checked": {**sql}}, sources={"refunds": {"type": "generate", "rows": 1}})
    assert spec.nodes["checked"].requires == ["big"]


def test_dynamic_table_rows_cannot_be_read() -> None:
    found = problems({"big": table(), "checked": {"type": "sql", "sql": "SELECT * FROM big"}},
                     sources={"orders": {"type": "generate", "rows": 10}})
    assert "reads dynamic table 'big', which produces no rows" in found[0]
    assert "query it with dynamic_table_check('big', value)" in found[0]


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT customer, id FROM orders", "must select exactly one column (the value to store), found 2"),
    ("SELECT customer FROM orders UNION ALL SELECT customer FROM refunds", "only a projection and filter"),
    ("SELECT c FROM (SELECT customer AS c FROM orders)", "only a projection and filter"),
    ("SELECT customer FROM orders GROUP BY customer", "GROUP BY (aggregation) is not supported"),
    ("SELECT a.customer FROM orders a JOIN refunds b ON a.id = b.id", "joins are not supported"),
])
def test_table_sql_is_projection_and_filter_only(sql: str, message: str) -> None:
    found = problems({"big": table(sql), "checked": CHECKED})
    assert any(message in p and p.startswith("dynamic_table transform 'big'") for p in found), found


def test_a_table_cannot_be_filled_from_rows_that_check_it() -> None:
    found = problems({"big": table("SELECT customer FROM checked"), "checked": CHECKED})
    assert any("reads 'checked', which checks this dynamic table" in p for p in found), found


def test_valid_fixture_plans_one_flow_with_the_table_first() -> None:
    spec = load_pipeline(VALID)
    (flow,) = split_flows(spec)
    assert [t.name for t in flow.transforms] == ["big_senders", "flagged"]  # 'blocked' has no input: no flow
    assert spec.nodes["flagged"].requires == ["big_senders", "blocked"]
    keys = effective_keys(spec)
    assert keys["big_senders"] == [] and keys["flagged"] == ["id"]


# --- SQL helpers ---------------------------------------------------------------------------------

def test_checks_are_found_and_rewritten_to_per_epoch_functions() -> None:
    sql = ("SELECT id, dynamic_table_check('a', x) AS in_a, DYNAMIC_TABLE_CHECK(\"b\", array(x, y)) FROM t "
           "WHERE dynamic_table_check('a', lower(x))")
    assert sorted(analyze_sql(sql).dynamic_tables) == ["a", "b"]
    out = rewrite_dynamic_table_calls(sql, {"a": "__f_a", "b": "__f_b"}).lower()
    assert "dynamic_table_check" not in out
    assert "__f_a(x) as in_a" in out and "__f_b(array(x, y))" in out and "__f_a(lower(x))" in out
    assert dynamic_table_sql_problems("SELECT lower(x) FROM t WHERE y > 1") == []


def test_index_names_stay_within_postgres_limits() -> None:
    assert index_name("allow", "updated_at") == "idx_allow_updated_at"
    long = index_name("t" * 60, "updated_at")
    assert len(long) == 63 and long != index_name("t" * 59 + "u", "updated_at")
    assert long == index_name("t" * 60, "updated_at")


# --- settings ------------------------------------------------------------------------------------

def test_postgres_connection_falls_back_to_the_sink_settings() -> None:
    settings = load_settings(environ={
        "STREAMLING__POSTGRES_SINK__HOST": "db", "STREAMLING__POSTGRES_SINK__PORT": "6543",
        "STREAMLING__POSTGRES_SINK__PASS": "sinkpw", "STREAMLING__DYNAMIC_TABLE_BACKEND__POSTGRES__DB": "lists",
        "STREAMLING__DYNAMIC_TABLE_BACKEND__MAX_BATCH_SIZE": "50"}, cwd=Path("/nonexistent"))
    conn = settings.dynamic_table_connection()
    assert (conn.host, conn.port, conn.db, conn.pass_) == ("db", 6543, "lists", "sinkpw")
    dt = settings.dynamic_table_backend
    assert (dt.max_batch_size, dt.postgres.dt_schema_name, dt.postgres.cache_enabled,
            dt.postgres.cache_refresh_debounce_ms) == (50, "streamling", False, 1000)
    own = load_settings(environ={"STREAMLING__DYNAMIC_TABLE_BACKEND__POSTGRES__PASSWORD": "dtpw"},
                        cwd=Path("/nonexistent"))
    assert own.dynamic_table_connection().pass_ == "dtpw"
    assert own.masked()["dynamic_table_backend"]["postgres"]["password"] == "***"


# --- dynamic_table_check over Arrow --------------------------------------------------------------

MEMBERS = frozenset({"a", "b", "42"})


@pytest.mark.parametrize(("values", "expected"), [
    (pa.array(["a", "x", None, "b", "a"]), [True, False, None, True, True]),
    (pa.array(["a", None], type=pa.large_string()), [True, None]),
    (pa.array([42, 7, None]), [True, False, None]),  # compared as text
    (pa.array(["a", "x", None]).dictionary_encode(), [True, False, None]),
    (pa.array([["x", "b"], [], None, [None, "x"], [None, "a"], ["x"]], type=pa.list_(pa.string())),
     [True, False, None, False, True, False]),
    (pa.array([["a"], [], None], type=pa.large_list(pa.large_string())), [True, False, None]),
    (pa.chunked_array([pa.array(["a"]), pa.array(["x", None])]), [True, False, None]),
])
def test_check_membership(values: Any, expected: list[bool | None]) -> None:
    out = check_membership(values, MEMBERS)
    assert out.type == pa.bool_() and out.to_pylist() == expected


def test_check_against_an_empty_table() -> None:
    assert check_membership(pa.array(["a", None]), frozenset()).to_pylist() == [False, None]
    lists = pa.array([["a"], [], None], type=pa.list_(pa.string()))
    assert check_membership(lists, frozenset()).to_pylist() == [False, False, None]


def test_sliced_lists_keep_their_rows() -> None:
    lists = pa.array([["a"], ["x"], ["b", None], None, []], type=pa.list_(pa.string())).slice(1)
    assert check_membership(lists, MEMBERS).to_pylist() == [False, True, None, False]

