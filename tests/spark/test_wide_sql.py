"""SQL over decimals wider than Spark's 38 digits (carried as exact text) is exact or refused when
the query is planned — never computed on text."""

from __future__ import annotations

import pytest

from streamling.errors import StreamlingError, ValidationError

PIPELINE = """
    sources:
      s: {{type: generate, rows: 3}}
    transforms:
      js:
        type: script
        from: s
        primary_key: id
        schema: {{id: int64, Big: 'decimal256(60,0)'}}
        script: 'function process(row) {{ return {{id: row.id, Big: String(row.id)}}; }}'
      q: {{type: sql, sql: "{sql}"}}
    sinks:
      out: {{type: blackhole, from: q}}
"""


def test_arithmetic_on_a_wide_column_is_refused_at_planning(runner) -> None:
    with pytest.raises((ValidationError, StreamlingError)) as info:
        runner.pipeline(PIPELINE.format(sql="SELECT id, big + 1 AS b FROM js")).analyze()
    text = str(info.value)
    assert "sql transform 'q': SQL is not exact on wide decimals: column 'big' is decimal256(60,0)" in text
    assert "(`big + 1`) would not be exact" in text


def test_equality_on_a_wide_column_plans(runner) -> None:
    plan = runner.pipeline(PIPELINE.format(sql="SELECT id, big FROM js WHERE big = '2'")).analyze()
    from streamling.spec.types import wide_fields

    assert [f.name for f in plan.schemas["q"].fields] == ["id", "big", "_gs_op"]  # unquoted: folded
    assert {k: v.name for k, v in wide_fields(plan.schemas["q"]).items()} == {"big": "decimal256(60,0)"}
