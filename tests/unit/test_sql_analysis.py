"""SQL transforms: which nodes they read, which constructs they may not use, and the rewrite
that points them at temp views while carrying ``_gs_op`` through projections."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from streamling.spec.sql import GS_OP, analyze_sql, rewrite_sql

JOIN = "joins are not supported: a transform sees one micro-batch at a time"
GROUP_BY = ("GROUP BY (aggregation) is not supported in a stateless transform; "
            "aggregate downstream, e.g. in the sink's database (a view over the table)")
HAVING = "HAVING is not supported in a stateless transform"
WINDOW = "window functions (OVER …) are not supported in a stateless transform"
ORDER_BY = "ORDER BY is not supported: order across micro-batches is not defined"
LIMIT = "LIMIT is not supported: it would apply per micro-batch, not to the stream"
INTERSECT = "INTERSECT is not supported; use UNION ALL"
EXCEPT = "EXCEPT is not supported; use UNION ALL"
UNION = "UNION (distinct) is not supported; use UNION ALL"
DISTINCT = "SELECT DISTINCT is not supported in a stateless transform"
AGGREGATE = "aggregate functions (count, sum, …) are not supported in a stateless transform"


# --- table references ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("sql", "tables"),
    [
        ("SELECT id FROM orders", ["orders"]),
        ("SELECT id FROM raw.transactions", ["raw.transactions"]),
        ("SELECT id FROM `raw.transactions`", ["raw.transactions"]),
        ("SELECT id FROM `raw`.`transactions`", ["raw.transactions"]),
        ("SELECT t.id FROM `raw.transactions` AS t WHERE t.amount > 0", ["raw.transactions"]),
        ("SELECT id FROM eu UNION ALL SELECT id FROM us", ["eu", "us"]),
        ("SELECT id FROM Orders UNION ALL SELECT id FROM orders", ["Orders"]),
        ("SELECT id FROM (SELECT id, amount FROM orders) AS s", ["orders"]),
        ("SELECT 1 AS one", []),
    ],
)
def test_tables_are_named_in_order_of_appearance(sql: str, tables: list[str]) -> None:
    analysis = analyze_sql(sql)
    assert analysis.parse_error is None
    assert analysis.problems == []
    assert analysis.tables == tables


def test_cte_names_are_not_tables() -> None:
    sql = """
        WITH big AS (SELECT * FROM orders WHERE amount > 100),
             bigger AS (SELECT * FROM big WHERE amount > 1000)
        SELECT id FROM bigger
    """
    assert analyze_sql(sql).tables == ["orders"]


def test_cte_names_match_case_insensitively() -> None:
    assert analyze_sql("WITH Big AS (SELECT * FROM orders) SELECT id FROM BIG").tables == ["orders"]


def test_stateless_sql_has_no_problems() -> None:
    sql = """
        SELECT id, upper(name) AS name, cast(amount AS decimal(38, 2)) AS amount,
               CASE WHEN amount > 100 THEN 'big' ELSE 'small' END AS size
        FROM orders
        WHERE amount IS NOT NULL AND _gs_op <> 'd'
    """
    analysis = analyze_sql(sql)
    assert (analysis.tables, analysis.problems, analysis.parse_error) == (["orders"], [], None)


# --- forbidden constructs -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("sql", "problems"),
    [
        ("SELECT o.id FROM orders o JOIN customers c ON o.customer_id = c.id", [JOIN]),
        ("SELECT o.id FROM orders o LEFT JOIN customers c ON o.customer_id = c.id", [JOIN]),
        ("SELECT o.id FROM orders o CROSS JOIN customers c", [JOIN]),
        ("SELECT o.id FROM orders o, customers c", [JOIN]),
        ("SELECT customer_id, sum(amount) AS total FROM orders GROUP BY customer_id", [GROUP_BY]),
        ("SELECT customer_id FROM orders GROUP BY customer_id HAVING count(*) > 1", [GROUP_BY, HAVING]),
        ("SELECT count(*) AS n FROM orders", [AGGREGATE]),
        ("SELECT max(amount) AS top FROM orders", [AGGREGATE]),
        ("SELECT id, row_number() OVER (PARTITION BY customer_id ORDER BY id) AS rn FROM orders", [WINDOW]),
        ("SELECT id FROM orders ORDER BY id", [ORDER_BY]),
        ("SELECT id FROM orders LIMIT 10", [LIMIT]),
        ("SELECT id FROM orders ORDER BY amount DESC LIMIT 10", [ORDER_BY, LIMIT]),
        ("SELECT id FROM eu UNION SELECT id FROM us", [UNION]),
        ("SELECT id FROM eu UNION DISTINCT SELECT id FROM us", [UNION]),
        ("SELECT id FROM eu INTERSECT SELECT id FROM us", [INTERSECT]),
        ("SELECT id FROM eu EXCEPT SELECT id FROM us", [EXCEPT]),
        ("SELECT DISTINCT customer_id FROM orders", [DISTINCT]),
    ],
)
def test_stateful_constructs_are_rejected(sql: str, problems: list[str]) -> None:
    analysis = analyze_sql(sql)
    assert analysis.parse_error is None
    assert analysis.problems == problems


def test_window_order_by_is_not_reported_as_order_by() -> None:
    assert analyze_sql("SELECT row_number() OVER (ORDER BY id) AS rn FROM orders").problems == [WINDOW]


def test_union_all_is_allowed() -> None:
    assert analyze_sql("SELECT id FROM eu UNION ALL SELECT id FROM us").problems == []


@pytest.mark.parametrize("sql", ["INSERT INTO archive SELECT * FROM orders", "UPDATE orders SET a = 1"])
def test_only_select_queries_are_allowed(sql: str) -> None:
    statement = sql.split()[0]
    assert analyze_sql(sql).problems == [f"only SELECT queries are allowed, found {statement}"]


# --- parse errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT id, FROM WHERE orders", "expected table name near 'WHERE'"),
        ("SELEC id FROM orders", "unexpected token near 'FROM'"),
        ("SELECT id FROM orders WHERE", "incomplete expression near 'WHERE'"),
        ("SELECT id\nFROM orders\nWHERE (amount > 10", "expecting ) near '10' (line 3 of the SQL)"),
        ("SELECT 'abc FROM orders",
         "cannot tokenize the SQL near 'SELECT 'abc FROM order'; check for an unclosed quote"),
        ("SELECT id FROM orders; SELECT id FROM refunds", "expected exactly one statement, found 2"),
        ("", "expected exactly one statement, found 0"),
    ],
)
def test_parse_errors_read_well(sql: str, message: str) -> None:
    analysis = analyze_sql(sql)
    assert analysis.parse_error == message
    assert "<Token" not in message and "<class" not in message


# --- rewrite --------------------------------------------------------------------------------------

VIEWS = {"orders": "v_orders", "eu": "v_eu", "us": "v_us", "asia": "v_asia",
         "raw.transactions": "v_raw_transactions"}


def _top_level_outputs(sql: str) -> list[list[str]]:
    """The output column names of each top-level SELECT (each UNION ALL branch)."""
    def selects(node: exp.Expression) -> list[exp.Select]:
        if isinstance(node, exp.Select):
            return [node]
        if isinstance(node, exp.SetOperation):
            return selects(node.left) + selects(node.right)
        if isinstance(node, exp.Subquery):
            return selects(node.this)
        return []

    tree = sqlglot.parse_one(sql, read="spark")
    return [[e.alias_or_name.lower() if not isinstance(e, exp.Star) else "*" for e in s.expressions]
            for s in selects(tree)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT id FROM orders",
        "SELECT id, amount FROM orders WHERE _gs_op <> 'd'",
        "SELECT id, _gs_op FROM orders",
        "SELECT id, _GS_OP FROM orders",
        "SELECT orders._gs_op, id FROM orders",
        "SELECT id AS _gs_op FROM orders",
        "SELECT id FROM eu UNION ALL SELECT id FROM us",
        "SELECT id FROM eu UNION ALL SELECT id, _gs_op FROM us",
        "SELECT id FROM eu UNION ALL SELECT id FROM us UNION ALL SELECT id FROM asia",
        "(SELECT id FROM eu) UNION ALL (SELECT id FROM us)",
    ],
)
def test_rewrite_carries_gs_op_exactly_once_per_branch(sql: str) -> None:
    rewritten = rewrite_sql(sql, VIEWS)
    outputs = _top_level_outputs(rewritten)
    assert outputs
    assert all(cols.count(GS_OP) == 1 for cols in outputs), rewritten
    # Rewriting is idempotent: a second pass adds nothing.
    assert rewrite_sql(rewritten, {}) == rewritten


def test_rewrite_appends_gs_op_after_the_user_columns() -> None:
    assert rewrite_sql("SELECT id, amount FROM orders", VIEWS) == (
        "SELECT id, amount, _gs_op FROM v_orders AS orders"
    )


def test_rewrite_union_all_branches_each_get_gs_op() -> None:
    assert rewrite_sql("SELECT id FROM eu UNION ALL SELECT id FROM us", VIEWS) == (
        "SELECT id, _gs_op FROM v_eu AS eu UNION ALL SELECT id, _gs_op FROM v_us AS us"
    )


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM orders", "SELECT * FROM v_orders AS orders"),
        ("SELECT o.* FROM orders o", "SELECT o.* FROM v_orders AS o"),
        ("SELECT *, 1 AS one FROM orders", "SELECT *, 1 AS one FROM v_orders AS orders"),
    ],
)
def test_rewrite_leaves_star_alone(sql: str, expected: str) -> None:
    # ``*`` already includes _gs_op; adding it again would duplicate the column.
    assert rewrite_sql(sql, VIEWS) == expected


def test_rewrite_without_carrying_gs_op() -> None:
    rewritten = rewrite_sql("SELECT id FROM orders", VIEWS, carry_gs_op=False)
    assert rewritten == "SELECT id FROM v_orders AS orders"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        # The node name stays usable as a qualifier: the view is aliased to it.
        ("SELECT orders.id FROM Orders", "SELECT orders.id, _gs_op FROM v_orders AS Orders"),
        ("SELECT x.id FROM orders x WHERE x.amount > 1",
         "SELECT x.id, _gs_op FROM v_orders AS x WHERE x.amount > 1"),
        ("SELECT t.id FROM `raw.transactions` AS t", "SELECT t.id, _gs_op FROM v_raw_transactions AS t"),
        ("SELECT id FROM raw.transactions", "SELECT id, _gs_op FROM v_raw_transactions AS transactions"),
    ],
)
def test_rewrite_points_node_names_at_views(sql: str, expected: str) -> None:
    assert rewrite_sql(sql, VIEWS) == expected


def test_rewrite_keeps_cte_names() -> None:
    sql = "WITH big AS (SELECT * FROM orders WHERE amount > 100) SELECT id FROM big"
    assert rewrite_sql(sql, {**VIEWS, "big": "v_big"}, carry_gs_op=False) == (
        "WITH big AS (SELECT * FROM v_orders AS orders WHERE amount > 100) SELECT id FROM big"
    )




@pytest.mark.parametrize(
    "sql",
    [
        "WITH big AS (SELECT id FROM orders WHERE amount > 100) SELECT id FROM big",
        "SELECT id FROM (SELECT id, amount FROM orders) AS s",
    ],
)
def test_rewrite_carries_gs_op_through_ctes_and_subqueries(sql: str) -> None:
    rewritten = rewrite_sql(sql, VIEWS)
    tree = sqlglot.parse_one(rewritten, read="spark")
    for select in tree.find_all(exp.Select):
        names = {e.alias_or_name.lower() for e in select.expressions}
        assert GS_OP in names or any(isinstance(e, exp.Star) for e in select.expressions), select.sql()


@pytest.mark.parametrize("sql", [
    "SELECT id FROM orders WHERE id IN (SELECT id FROM refunds)",
    "SELECT id FROM orders WHERE EXISTS (SELECT 1 FROM refunds WHERE refunds.id = orders.id)",
    "SELECT id, (SELECT max(id) FROM refunds) AS m FROM orders",
])
def test_subqueries_in_expressions_are_rejected_like_joins(sql: str) -> None:
    problems = analyze_sql(sql).problems
    assert any(p.startswith("subqueries inside expressions") for p in problems), problems
