"""The pieces of a notebook job that need no Spark: SQL cells split into statements, errors in one line."""

from __future__ import annotations

from streamling.bundle.notebook_job import _describe, split_sql
from streamling.errors import StreamlingError
from streamling.notebook.cells import PipelineError


def test_sql_cells_split_at_semicolons_outside_strings_and_comments() -> None:
    text = ("CREATE TABLE t AS SELECT 'a;b' AS s, \"x;y\" AS q; -- a comment; not a statement\n"
            "/* block; comment */ INSERT INTO t VALUES ('it''s; fine', `c;d`);\n\n;  SELECT * FROM t")
    assert split_sql(text) == [
        "CREATE TABLE t AS SELECT 'a;b' AS s, \"x;y\" AS q",
        "INSERT INTO t VALUES ('it''s; fine', `c;d`)",
        "SELECT * FROM t",
    ]
    assert split_sql("SELECT 'back\\'slash;' AS s") == ["SELECT 'back\\'slash;' AS s"]
    assert split_sql("-- only a comment\n") == []


def test_a_failed_cell_is_described_in_one_line() -> None:
    assert _describe(ZeroDivisionError("division by zero")) == "ZeroDivisionError: division by zero"
    assert _describe(ValueError("first\nsecond")) == "ValueError: first"
    assert _describe(PipelineError("Node 'x': bad")) == "Node 'x': bad"
    assert _describe(StreamlingError("no such topic", hint="create it")) == "no such topic — create it"
