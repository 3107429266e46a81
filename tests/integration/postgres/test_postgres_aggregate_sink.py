"""The postgres_aggregate sink on a real Postgres: trigger-maintained aggregates over CDC epochs,
replays that do not count twice, totals without group_by, and the DDL of a dry run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness import Runner

from streamling.config import load_settings
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.runtime.planner import analyze, build_plan
from streamling.sinks.postgres_aggregate import PostgresAggregateSink
from streamling.sources.generate import generate_batch
from streamling.spec import parse_pipeline

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

ROWS, PER_EPOCH = 3_000, 700
AGGREGATES = """
            group_by: {customer: {}}
            aggregate:
              n: {fn: count}
              total: {fn: sum, from: amount}
              mean: {fn: avg, from: amount}
              biggest: {fn: max, from: amount}
              first_version: {fn: min, from: version, type: bigint}
"""


def _pipeline(landing: str, agg: str) -> str:
    return f"""
        sources:
          changes: {{type: generate, profile: cdc, rows: {ROWS}, rows_per_batch: {PER_EPOCH}, primary_key: id}}
        transforms: {{}}
        sinks:
          agg:
            type: postgres_aggregate
            from: changes
            landing_table: {landing}
            agg_table: {agg}
{AGGREGATES}"""


def _expected() -> dict[str, tuple[Any, ...]]:
    """Streamling's rules over the rows the trigger sees: the last row per (id, op) of each epoch,
    minus the (id, op) pairs the previous epoch already landed (those are updates of the landing
    table, not inserts)."""
    landed: list[dict[str, Any]] = []
    previous: set[tuple[int, str]] = set()
    for start in range(0, ROWS, PER_EPOCH):
        last: dict[tuple[int, str], dict[str, Any]] = {}
        for row in generate_batch("cdc", start, min(start + PER_EPOCH, ROWS), 0, 0).to_pylist():
            last[(row["id"], row["_gs_op"])] = row
        landed += [row for key, row in last.items() if key not in previous]
        previous = set(last)
    acc: dict[str, list[Any]] = defaultdict(lambda: [0, 0.0, 0, None, None])
    for row in landed:
        a, op = acc[row["customer"]], row["_gs_op"]
        a[0] += {"i": 1, "d": -1}.get(op, 0)
        a[1] += -row["amount"] if op == "d" else row["amount"]
        a[2] += {"i": 1, "d": -1}.get(op, 0)
        if op == "i":
            a[3] = row["amount"] if a[3] is None else max(a[3], row["amount"])
            a[4] = row["version"] if a[4] is None else min(a[4], row["version"])
    return {c: (n, round(t, 6), round(t / k, 6) if k else None, m, v) for c, (n, t, k, m, v) in acc.items()}


def _actual(pg: Any, agg: str) -> dict[str, tuple[Any, ...]]:
    rows = pg.execute(f"SELECT customer, n, total, mean, biggest, first_version FROM {agg}").fetchall()
    return {r[0]: (r[1], round(float(r[2]), 6), None if r[3] is None else round(float(r[3]), 6), r[4], r[5])
            for r in rows}


def test_aggregates_follow_the_op_rules_and_landing_keeps_the_last_two_epochs(
        spark: Any, tmp_path: Path, pg_environ: Mapping[str, str], pg: Any, unique_name: str) -> None:
    landing, agg = f"{unique_name}_l", f"{unique_name}_a"
    Runner(spark, tmp_path, pg_environ).run(_pipeline(landing, agg))
    assert _actual(pg, agg) == _expected()
    epochs = pg.execute(f"SELECT DISTINCT _gs_checkpoint_epoch FROM {landing} ORDER BY 1").fetchall()
    last = ROWS // PER_EPOCH
    assert epochs == [(last - 1,), (last,)]  # older epochs' rows are gone once a later one landed


def _sink(spark: Any, environ: Mapping[str, str], landing: str, agg: str, body: str) -> PostgresAggregateSink:
    doc = yaml.safe_load(f"""
        sources: {{gen: {{type: generate, rows: 1}}}}
        sinks:
          agg:
            type: postgres_aggregate
            from: gen
            primary_key: id
            landing_table: {landing}
            agg_table: {agg}
{body}""")
    spec = parse_pipeline(yaml.safe_dump(doc)).nodes["agg"]
    schema = spark.createDataFrame([], "id long, amount double, _gs_op string").schema
    ctx = NodeContext(spec=spec, settings=load_settings(environ=environ), primary_key=["id"],
                      input_schema=schema)
    sink = PostgresAggregateSink(ctx)
    sink.open(spark)
    return sink


def test_replays_and_repeats_in_consecutive_epochs_count_once_and_totals_need_no_group_by(
        spark: Any, pg_environ: Mapping[str, str], pg: Any, unique_name: str) -> None:
    landing, agg = f"{unique_name}_l", f"{unique_name}_a"
    sink = _sink(spark, pg_environ, landing, agg, """
            aggregate:
              n: {fn: count}
              amount: {fn: sum}
""")
    try:
        ddl = "long, amount double, _gs_op string"
        first = spark.createDataFrame([(1, 10.0, "i"), (2, 5.0, "i"), (3, 1.0, "I")], f"id {ddl}")
        second = spark.createDataFrame([(2, 5.0, "d"), (1, 2.5, "u")], f"id {ddl}")
        # id 1's update repeats the previous epoch's (not counted: Streamling's landing window);
        # id 3's insert repeats epoch 0's, two epochs back (counted again)
        third = spark.createDataFrame([(1, 2.5, "u"), (3, 1.0, "i")], f"id {ddl}")
        for epoch_id, batch in ((0, first), (1, second), (1, second), (2, third)):  # epoch 1 re-run after a crash
            sink.write(batch, Epoch(epoch_id, "f0", "test", sink_token="tok-1"))
        assert pg.execute(f"SELECT key, n, amount::float FROM {agg}").fetchall() == [(1, 3, 14.5)]
    finally:
        sink.close()


def test_dry_run_shows_the_ddl_without_connecting(spark: Any) -> None:
    settings = load_settings(environ={}, overrides={"postgres_sink": {"port": 9}})  # nothing listens there
    plan = build_plan(parse_pipeline(_pipeline("orders_landing", "orders_by_customer")), settings, dry_run=True)
    analyze(plan, spark)
    ddl = "\n".join(plan.describe()["ddl"]["agg"])
    assert 'CREATE OR REPLACE FUNCTION "public"."orders_landing_to_orders_by_customer_fn"()' in ddl
    assert ('CREATE OR REPLACE TRIGGER "orders_landing_to_orders_by_customer_trigger" AFTER INSERT ON '
            '"public"."orders_landing" REFERENCING NEW TABLE AS new_table FOR EACH STATEMENT') in ddl
    assert '"mean" NUMERIC GENERATED ALWAYS AS' in ddl


@pytest.mark.slow
def test_killed_between_flush_and_commit_the_rerun_counts_each_row_once(
        tmp_path: Path, pg_environ: Mapping[str, str], pg: Any, unique_name: str) -> None:
    import os
    import signal
    import subprocess
    import sys

    landing, agg = f"{unique_name}_l", f"{unique_name}_a"
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_pipeline(landing, agg))
    root = Path(__file__).resolve().parents[3]
    env = {**pg_environ, "STREAMLING_CACHE_DIR": str(root / ".cache"), "STREAMLING__APPLICATION_ID": unique_name,
           "STREAMLING__STATE_DIR": str(tmp_path / "state"),
           # the rerun resumes the killed run's checkpoint: a backend that keeps positions
           "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "Sqlite",
           "STREAMLING__STATE_BACKEND__SQLITE__DATABASE_PATH": str(tmp_path / "state" / "state.db")}
    cmd = [sys.executable, "-m", "streamling.cli", str(pipeline)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "epoch 1 flushed" in line:  # the sink committed epoch 1; Spark may not have yet
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert any("epoch 1 flushed" in line for line in seen), "".join(seen[-30:])
    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _actual(pg, agg) == _expected()
