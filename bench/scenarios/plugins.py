"""``plugins``: what running a node as a Python plugin costs.

Three pipelines over the same generate source and SQL, in-process on the shared session:
``baseline`` (→ blackhole), ``identity`` (→ an identity transform plugin → blackhole) and
``plugin sink`` (→ a plugin sink that receives every batch and keeps nothing). The plugin
pipelines' rows/s next to the baseline's say what the plugin boundary (Arrow batches out of the
JVM into Python workers and back) costs per row; ``hand-written mapInArrow`` (a ``foreachBatch``
running the SQL, an identity ``mapInArrow`` and a ``noop`` write) says how much of that is Spark's
own Python round trip rather than streamling's adapter; ``hand-written sink mapInArrow`` (a
``foreachBatch`` running the SQL and a ``mapInArrow`` that takes every batch and returns a count,
collected) is what the plugin sink does, written by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scenarios.common import (
    Options,
    ScenarioResult,
    Side,
    interleaved,
    log,
    paired_ratio,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.inprocess import run_handwritten, run_streamling

NAME = "plugins"
SQL = "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders WHERE amount > 100"
DEFAULT_ROWS = 2_000_000
PLUGIN_FILE = Path(__file__).resolve().parents[1] / "plugins" / "bench_plugins.py"


def _yaml(rows: int, plugin_transform: bool, sink: dict[str, Any]) -> str:
    import yaml

    transforms: dict[str, Any] = {"filtered": {"type": "sql", "sql": SQL}}
    last = "filtered"
    if plugin_transform:
        transforms["same"] = {"type": "bench.identity", "from": "filtered"}
        last = "same"
    doc = {"sources": {"orders": {"type": "generate", "primary_key": "id", "rows": rows,
                                  "rows_per_batch": min(500_000, rows), "partitions": 2}},
           "transforms": transforms, "sinks": {"out": {**sink, "from": last}}}
    return yaml.safe_dump(doc, sort_keys=False)


def run(opts: Options) -> ScenarioResult:
    from streamling.plugins.discovery import load_plugins

    failures = load_plugins(str(PLUGIN_FILE))
    assert not failures, failures
    rows = opts.rows or DEFAULT_ROWS
    spark = shared_session()
    pipelines = {"baseline": _yaml(rows, False, {"type": "blackhole"}),
                 "identity transform plugin": _yaml(rows, True, {"type": "blackhole"}),
                 "plugin sink": _yaml(rows, False, {"type": "bench.discard"})}

    def side(name: str) -> Any:
        def go() -> dict[str, Any]:
            with temp_dir(f"plugins-{name.split()[0]}") as workdir:
                return run_streamling(spark, pipelines[name], workdir, rows)
        return go

    source = {"rows": rows, "rows_per_batch": min(500_000, rows), "partitions": 2, "profile": "orders"}

    def identity_batch(batch: Any, _batch_id: int) -> None:
        batch.createOrReplaceTempView("orders")
        out = batch.sparkSession.sql(SQL)
        out.mapInArrow(lambda batches: (b for b in batches), out.schema).write.format("noop").mode("overwrite").save()

    def handwritten() -> dict[str, Any]:
        with temp_dir("plugins-hw") as workdir:
            return run_handwritten(spark, source, identity_batch, workdir, rows)

    def consume(batches: Any) -> Any:
        import pyarrow as pa

        rows = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})

    def sink_batch(batch: Any, _batch_id: int) -> None:
        batch.createOrReplaceTempView("orders")
        batch.sparkSession.sql(SQL).mapInArrow(consume, "rows bigint").collect()

    def handwritten_sink() -> dict[str, Any]:
        with temp_dir("plugins-hws") as workdir:
            return run_handwritten(spark, source, sink_batch, workdir, rows)

    runs = {name: side(name) for name in pipelines}
    runs["hand-written mapInArrow"] = handwritten
    runs["hand-written sink mapInArrow"] = handwritten_sink
    sides = {name: Side(name) for name in runs}
    log(f"{NAME}: {rows:,} rows, {opts.runs} runs")
    interleaved(opts.runs, runs, sides, log)
    result = ScenarioResult(NAME, {"rows": rows, "sql": SQL, "spark": session_facts(spark)}, sides)
    result.figures = {f"{name} rows/s": (s.median("rows_per_s"), "rows/s") for name, s in sides.items()}
    base = sides["baseline"]
    result.ratios = {f"{name} / baseline (paired per round)": paired_ratio(s, base, "rows_per_s")
                     for name, s in sides.items() if name != "baseline"}
    result.ratios["identity transform plugin / hand-written mapInArrow (paired)"] = paired_ratio(
        sides["identity transform plugin"], sides["hand-written mapInArrow"], "rows_per_s")
    result.ratios["plugin sink / hand-written sink mapInArrow (paired)"] = paired_ratio(
        sides["plugin sink"], sides["hand-written sink mapInArrow"], "rows_per_s")
    return result
