"""Decimals wider than Spark's 38 digits travel exactly: script → SQL → a real Postgres table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import Runner

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

BIG = "-123456789012345678901234567890123456789012345678901234567890"  # 60 digits
FRAC = "9" * 66 + ".0123456789"  # decimal256(76,10): 66 digits before the point, 10 after
U256_MAX = str(2**256 - 1)  # 78 digits


def test_a_60_digit_value_reaches_postgres_exactly(spark: Any, tmp_path: Path, pg_environ: dict[str, str],
                                                    pg: Any, unique_name: str) -> None:
    runner = Runner(spark, tmp_path, environ=pg_environ)
    runner.run(f"""
sources:
  s: {{type: generate, rows: 3, profile: orders, partitions: 1}}
transforms:
  js:
    type: script
    from: s
    primary_key: id
    schema: {{id: int64, big: 'decimal256(60,0)', frac: 'decimal256(76,10)', small: 'decimal256(20,2)'}}
    script: |
      function process(row) {{
        return {{id: row.id, big: row.id === 0 ? "{BIG}" : String(row.id), frac: "{FRAC}",
                 small: row.id === 2 ? null : "1.5"}};
      }}
  picked:
    type: sql
    primary_key: id
    sql: SELECT id, big, frac, small FROM js WHERE big = '{BIG}' OR id > 0
sinks:
  db: {{type: postgres, from: picked, schema: {unique_name}, table: wide}}
""")
    types = pg.execute("SELECT column_name, data_type, numeric_precision, numeric_scale FROM "
                       "information_schema.columns WHERE table_schema = %s AND table_name = 'wide' ORDER BY 1",
                       (unique_name,)).fetchall()
    assert types == [("big", "numeric", 60, 0), ("frac", "numeric", 76, 10), ("id", "bigint", 64, 0),
                     ("small", "numeric", 20, 2)]
    got = pg.execute(f"SELECT id, big::text, frac::text, small::text FROM {unique_name}.wide ORDER BY id").fetchall()
    assert got == [(0, BIG, FRAC, "1.50"), (1, "1", FRAC, "1.50"), (2, "2", FRAC, None)]
    # Postgres holds them as numbers: arithmetic there is exact.
    assert pg.execute(f"SELECT (big - 1)::text FROM {unique_name}.wide WHERE id = 0").fetchone()[0] == BIG[:-1] + "1"


def test_a_value_too_wide_for_its_declared_type_is_refused_not_narrowed(spark: Any, tmp_path: Path,
                                                                          pg_environ: dict[str, str], pg: Any,
                                                                          unique_name: str) -> None:
    runner = Runner(spark, tmp_path, environ=pg_environ)
    with pytest.raises(Exception, match=r"column 'big': .* has more than 40 digits before the point"):
        runner.run(f"""
sources:
  s: {{type: generate, rows: 1, profile: orders, partitions: 1}}
transforms:
  js:
    type: script
    from: s
    primary_key: id
    schema: {{id: int64, big: 'decimal256(40,0)'}}
    script: |
      function process(row) {{ return {{id: row.id, big: "{U256_MAX}"}}; }}
sinks:
  db: {{type: postgres, from: js, schema: {unique_name}, table: wide}}
""")
    exists = pg.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                        (unique_name,)).fetchone()[0]
    if exists:
        assert pg.execute(f"SELECT count(*) FROM {unique_name}.wide").fetchone()[0] == 0
