"""Static analysis and translation of SQL transforms with sqlglot, no JVM needed.

Users write SQL as Streamling's engine (DataFusion) reads it; it is parsed with the DataFusion
dialect (``sql_dialect``), translated to a tree whose Spark SQL gives the same rows
(``sql_translate``), and only then handed to Spark. The helpers that run after translation
(``pin_clock``, ``rewrite_dynamic_table_calls``) read Spark SQL.

Streamling's SQL transforms are stateless: projections, filters, functions and ``UNION ALL`` over
the upstream node names. Joins, aggregations, windows, ORDER BY and LIMIT would need state across
micro-batches (or give per-batch answers that silently differ from the user's intent), so they are
rejected at validate time. Node names may contain dots (``raw.transactions``): a table reference
is matched on its full dotted name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from streamling.errors import first_line
from streamling.spec.sql_dialect import DataFusion
from streamling.spec.sql_translate import DYNAMIC_TABLE_CHECK, translate
from streamling.util import did_you_mean

GS_OP = "_gs_op"
DIALECT = DataFusion  #: how users' SQL is read
SPARK = "spark"  #: what Spark is given


@dataclass
class SqlAnalysis:
    tables: list[str] = field(default_factory=list)  # as written, in order of appearance
    problems: list[str] = field(default_factory=list)
    parse_error: str | None = None
    #: distinct table names given to ``dynamic_table_check`` (string literals)
    dynamic_tables: list[str] = field(default_factory=list)
    #: a ``dynamic_table_check`` call names its table with a column (whose rows hold one name)
    dynamic_table_by_column: bool = False


def _table_name(table: exp.Table) -> str:
    return ".".join(p.name for p in table.parts)


def _parse(sql: str, read: type[DataFusion] | str = DIALECT) -> exp.Expression:
    statements = [s for s in sqlglot.parse(sql, read=read) if s is not None]
    if len(statements) != 1:
        raise ParseError(f"expected exactly one statement, found {len(statements)}")
    tree = statements[0]
    for call in _dynamic_table_calls(tree):
        first = call.expressions[0] if call.expressions else None
        if isinstance(first, exp.Column) and not first.table and first.this.quoted:
            # dynamic_table_check("t", v): the table's name, however it is quoted
            first.replace(exp.Literal.string(first.name))
    return tree


def parse_user_sql(sql: str) -> exp.Expression:
    """A user's query as Streamling reads it (DataFusion's dialect), untranslated."""
    return _parse(sql)


def _cte_names(tree: exp.Expression) -> set[str]:
    return {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}


def _parse_error_text(exc: Exception, sql: str) -> str:
    """sqlglot's first error in user terms: no token reprs or parser class names."""
    if isinstance(exc, sqlglot.errors.TokenError):  # "Error tokenizing '<context>'"
        context = first_line(exc).removeprefix("Error tokenizing ")
        return f"cannot tokenize the SQL near {context}; check for an unclosed quote"
    errors = getattr(exc, "errors", None) or []
    if not errors:
        return first_line(exc)
    first = errors[0]
    text = re.sub(r" but got (<Token .*>|None)$", "", str(first.get("description", "")))
    if "<class" in text:  # "Required keyword: 'this' missing for <class '…Where'>"
        text = "incomplete expression"
    text = text.replace("Invalid expression / Unexpected token", "unexpected token")
    text = text[:1].lower() + text[1:]
    near = f" near '{first['highlight']}'" if first.get("highlight") else ""
    line = f" (line {first['line']} of the SQL)" if "\n" in sql.strip() and first.get("line") else ""
    return f"{text}{near}{line}"


def analyze_sql(sql: str) -> SqlAnalysis:
    """Table references and every stateful construct in ``sql``."""
    out = SqlAnalysis()
    try:
        tree = _parse(sql)
    except (ParseError, sqlglot.errors.TokenError) as exc:
        out.parse_error = _parse_error_text(exc, sql)
        return out
    if not isinstance(tree, (exp.Query)):
        out.problems.append(f"only SELECT queries are allowed, found {tree.key.upper()}")
        return out
    ctes = _cte_names(tree)
    seen: set[str] = set()
    for table in tree.find_all(exp.Table):
        name = _table_name(table)
        if name.lower() in ctes or not name:
            continue
        if name.lower() not in seen:
            seen.add(name.lower())
            out.tables.append(name)
    checks: list[tuple[type[exp.Expression], str]] = [
        (exp.Join, "joins are not supported: a transform sees one micro-batch at a time"),
        (exp.Group, "GROUP BY (aggregation) is not supported in a stateless transform; "
                    "aggregate downstream, e.g. in the sink's database (a view over the table)"),
        (exp.Having, "HAVING is not supported in a stateless transform"),
        (exp.Window, "window functions (OVER …) are not supported in a stateless transform"),
        (exp.Order, "ORDER BY is not supported: order across micro-batches is not defined"),
        (exp.Limit, "LIMIT is not supported: it would apply per micro-batch, not to the stream"),
        (exp.Intersect, "INTERSECT is not supported; use UNION ALL"),
        (exp.Except, "EXCEPT is not supported; use UNION ALL"),
    ]
    for node_type, message in checks:
        found = [n for n in tree.find_all(node_type)
                 if not (node_type is exp.Order and isinstance(n.parent, exp.Window))]
        if found and message not in out.problems:
            out.problems.append(message)
    if any(_in_expression_subquery(sel) for sel in tree.find_all(exp.Select)):
        out.problems.append("subqueries inside expressions (IN (SELECT …), EXISTS, scalar subqueries) are not "
                            "supported: they read another stream like a join")
    for union in tree.find_all(exp.Union):
        if union.args.get("distinct"):
            out.problems.append("UNION (distinct) is not supported; use UNION ALL")
            break
    for select in tree.find_all(exp.Select):
        if select.args.get("distinct"):
            out.problems.append("SELECT DISTINCT is not supported in a stateless transform")
            break
    for call in _dynamic_table_calls(tree):
        args = call.expressions
        if len(args) != 2:
            out.problems.append(f"{DYNAMIC_TABLE_CHECK} takes 2 arguments (table name, value or list), "
                                f"found {len(args)}")
        elif isinstance(args[0], exp.Column):
            out.dynamic_table_by_column = True  # the name comes with the rows; checked per batch
        elif not (isinstance(args[0], exp.Literal) and args[0].is_string):
            out.problems.append(f"the first argument of {DYNAMIC_TABLE_CHECK} must be the dynamic table's name, "
                                f"as a string literal or a column holding it, found {args[0].sql(dialect=SPARK)}")
        elif args[0].name not in out.dynamic_tables:
            out.dynamic_tables.append(args[0].name)
    if any(True for _ in tree.find_all(exp.AggFunc)) and not any(
        "GROUP BY" in p for p in out.problems
    ):
        out.problems.append(
            "aggregate functions (count, sum, …) are not supported in a stateless transform"
        )
    _, translation_problems = translate(tree)
    out.problems.extend(p for p in translation_problems if p not in out.problems)
    return out


def _dynamic_table_calls(tree: exp.Expression) -> list[exp.Anonymous]:
    return [f for f in tree.find_all(exp.Anonymous) if str(f.name).lower() == DYNAMIC_TABLE_CHECK]


def dynamic_table_sql_problems(sql: str) -> list[str]:
    """A dynamic table's ``sql`` is one projection over one input, optionally filtered.

    Streamling runs it as a side output of its source (no joins, unions, CTEs or subqueries) and
    stores a single column; anything richer belongs in an SQL transform upstream.
    """
    try:
        tree = _parse(sql)
    except (ParseError, sqlglot.errors.TokenError):
        return []  # reported by analyze_sql
    only = "only a projection and filter (SELECT <value> FROM <input> [WHERE …]) is supported for dynamic tables"
    if not isinstance(tree, exp.Select) or tree.find(exp.CTE, exp.Subquery, exp.Join) is not None:
        return [only]
    source = tree.args.get("from_", tree.args.get("from"))
    if source is None or not isinstance(source.this, exp.Table):
        return [only]
    star, _ = _output_names(tree)
    if not star and len(tree.expressions) != 1:
        return [f"a dynamic table's sql must select exactly one column (the value to store), "
                f"found {len(tree.expressions)}"]
    if _dynamic_table_calls(tree):
        return [f"{DYNAMIC_TABLE_CHECK} cannot be used inside a dynamic table's own sql"]
    return []


def rewrite_dynamic_table_calls(sql: str, functions: Mapping[str, str], by_column: str | None = None) -> str:
    """``dynamic_table_check('t', v)`` → ``<functions['t']>(v)``: one per-epoch lookup function per table;
    ``dynamic_table_check(col, v)`` → ``<by_column>(col, v)``, which finds the table per batch.

    Reads and writes Spark SQL: it runs on the translated query."""
    tree = _parse(sql, SPARK)
    for call in _dynamic_table_calls(tree):
        args = call.expressions
        if len(args) == 2 and isinstance(args[0], exp.Literal) and args[0].name in functions:
            call.replace(exp.Anonymous(this=functions[args[0].name], expressions=[args[1].copy()]))
        elif len(args) == 2 and by_column is not None and not isinstance(args[0], exp.Literal):
            call.replace(exp.Anonymous(this=by_column, expressions=[args[0].copy(), args[1].copy()]))
    return tree.sql(dialect=SPARK)


def _output_names(select: exp.Select) -> tuple[bool, set[str]]:
    star = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in select.expressions)
    return star, {e.alias_or_name.lower() for e in select.expressions}


def _row_selects(tree: exp.Expression) -> list[exp.Select]:
    """Every SELECT whose rows flow to the output: top level, UNION ALL branches, CTEs and
    FROM-subqueries. (Subqueries inside expressions are rejected by ``analyze_sql``.)"""
    return [s for s in tree.find_all(exp.Select) if not _in_expression_subquery(s)]


def _in_expression_subquery(node: exp.Expression) -> bool:
    parent = node.parent
    while parent is not None:
        if isinstance(parent, (exp.In, exp.Exists)) or (
                isinstance(parent, exp.Subquery) and not isinstance(parent.parent, (exp.From, exp.Join))
                and parent.parent is not None and not isinstance(parent.parent, exp.SetOperation)):
            return True
        parent = parent.parent
    return False


_CLOCK_NAMES = {"now", "current_timestamp", "current_date", "curdate", "localtimestamp"}


def pin_clock(sql: str, epoch_time_iso: str) -> str:
    """Replace ``now()``/``current_timestamp``/``current_date`` by the epoch's own instant.

    Spark evaluates them once per query execution; an epoch that fans out to several sinks runs
    several executions, and each would see a different "now". Pinning gives every node and sink
    of an epoch the same value, as Streamling's per-batch evaluation does. Reads Spark SQL.
    """
    tree = _parse(sql, SPARK)
    stamp = exp.cast(exp.Literal.string(epoch_time_iso), exp.DataType.build("timestamp"))
    for node in list(tree.find_all(exp.CurrentTimestamp, exp.Localtimestamp, exp.CurrentDate, exp.Anonymous)):
        if isinstance(node, exp.Anonymous) and str(node.name).lower() not in _CLOCK_NAMES:
            continue
        is_date = isinstance(node, exp.CurrentDate) or (isinstance(node, exp.Anonymous)
                                                        and str(node.name).lower() in {"current_date", "curdate"})
        node.replace(exp.cast(stamp.copy(), exp.DataType.build("date")) if is_date else stamp.copy())
    return tree.sql(dialect=SPARK)


def uses_clock(sql: str) -> bool:
    """Whether translated (Spark) ``sql`` reads the clock."""
    tree = _parse(sql, SPARK)
    return any(not isinstance(n, exp.Anonymous) or str(n.name).lower() in _CLOCK_NAMES
               for n in tree.find_all(exp.CurrentTimestamp, exp.Localtimestamp, exp.CurrentDate, exp.Anonymous))


def rewrite_sql(sql: str, views: Mapping[str, str], carry_gs_op: bool = True,
                columns: Mapping[str, str] | None = None) -> str:
    """Translate ``sql`` to Spark SQL, point node references at their temp views and carry
    ``_gs_op`` when not selected.

    ``views`` maps lower-cased node names to view names. ``_gs_op`` is appended to each
    top-level SELECT that neither selects ``*`` nor names ``_gs_op``, so upserts and deletes
    keep flowing through projections without the user spelling the column. ``columns`` (the
    inputs' column → Spark type) settles the type-dependent translations, e.g. integer division.
    """
    tree, problems = translate(_parse(sql), columns)
    if problems:
        raise ParseError(problems[0])
    ctes = _cte_names(tree)
    for table in list(tree.find_all(exp.Table)):
        name = _table_name(table).lower()
        if name in ctes or name not in views:
            continue
        alias = table.alias
        replacement = exp.to_table(views[name])
        replacement.set("alias", exp.TableAlias(this=exp.to_identifier(alias or table.name)))
        table.replace(replacement)
    if carry_gs_op:
        for select in _row_selects(tree):
            star, names = _output_names(select)
            if not star and GS_OP not in names:
                select.select(exp.column(GS_OP), copy=False)
    return tree.sql(dialect=SPARK)


def _parse_expression(text: str) -> exp.Expression:
    return sqlglot.parse_one(text, read=DIALECT)


def expression_problems(text: str) -> list[str]:
    """What keeps a DataFusion boolean expression (a source's ``filter``) from running on Spark."""
    try:
        tree = _parse_expression(text)
    except (ParseError, sqlglot.errors.TokenError) as exc:
        return [f"does not parse: {_parse_error_text(exc, text)}"]
    if isinstance(tree, exp.Query):
        return ["must be an expression over the row's columns, not a query"]
    if tree.find(exp.AggFunc, exp.Window, exp.Subquery) is not None:
        return ["must not aggregate, use windows or subqueries"]
    return translate(tree)[1]


def filter_column_problem(predicate: str, columns: list[str]) -> str | None:
    """``column 'x' does not exist (did you mean 'y'?)`` for the first unknown column, else None.

    The predicate is read as Streamling's (DataFusion) SQL; names match case-insensitively, as
    Spark resolves them. One that does not parse is left to the filter's own checks.
    """
    try:
        tree: Any = sqlglot.parse_one(predicate, read=DIALECT)
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
        return None
    lambda_vars = {v.name.lower() for lam in tree.find_all(exp.Lambda) for v in lam.expressions}
    known = {c.lower() for c in columns}
    for column in tree.find_all(exp.Column):
        name = column.name
        if name and name.lower() not in known and name.lower() not in lambda_vars:
            return f"column '{name}' does not exist{did_you_mean(name, columns)}"
    return None


def spark_expression(text: str, columns: Mapping[str, str] | None = None) -> str:
    """A DataFusion expression (a source's ``filter``) as Spark SQL for ``F.expr``."""
    tree, problems = translate(_parse_expression(text), columns)
    if problems:
        raise ParseError(problems[0])
    return tree.sql(dialect=SPARK)
