"""Script transform throughput: rows/s per core of a trivial JS transform over 10-column rows.

Two measurements, each against what a PySpark user would write by hand (the same transform in
pyarrow compute, no sandbox):

* ``core``: the executor-side batch function alone, in this process, over 10,000-row Arrow batches
  (Spark's default ``maxRecordsPerBatch``). Wall and CPU time are both reported: on a shared box
  the CPU figure is the one that says what one core does.
* ``spark``: a whole bounded pipeline (generate → SQL to 10 columns → script → blackhole) through
  ``PipelineRun`` against a hand-written streaming query (same source and SQL, ``mapInArrow`` with
  the pyarrow function, ``noop`` writer), rows/s divided by the partitions that ran in parallel.

Prints a table and writes ``bench/results/script_throughput.json``.

    STREAMLING_CACHE_DIR=$PWD/.cache .venv/bin/python bench/script_throughput.py [--rows N] [--no-spark]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "script_throughput.json"
SCRIPT = "function process(r) { r.customer = r.customer.toUpperCase(); r.total = r.amount * r.quantity; return r; }"
SQL = ("SELECT id, customer, country, amount, quantity, created_at, amount * 0 AS total, id % 10 AS bucket, "
       "concat(country, '-', id % 7) AS tag, _gs_op FROM orders")
BATCH_ROWS = 10_000


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ten_column_batch(rows: int) -> Any:
    """The ``orders`` profile widened to 10 columns, as the SQL step of the pipeline does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from streamling.sources.generate import generate_batch

    batch = generate_batch("orders", 0, rows, 0, 0)
    ids = batch.column("id")
    columns = {name: batch.column(name) for name in ("id", "customer", "country", "amount", "quantity", "created_at")}
    columns["total"] = pc.multiply(batch.column("amount"), 0.0)
    columns["bucket"] = pc.remainder(ids, 10)
    columns["tag"] = pc.binary_join_element_wise(batch.column("country"), pc.cast(pc.remainder(ids, 7), pa.string()),
                                                 "-")
    columns["_gs_op"] = batch.column("_gs_op")
    return pa.RecordBatch.from_pydict(columns)


def handwritten_transform(batches: Iterator[Any]) -> Iterator[Any]:
    """The same transform in pyarrow: what the script does, written by hand."""
    import pyarrow.compute as pc

    for batch in batches:
        batch = batch.set_column(batch.schema.get_field_index("customer"), "customer",
                                 pc.utf8_upper(batch.column("customer")))
        total = pc.multiply(batch.column("amount"), pc.cast(batch.column("quantity"), "double"))
        yield batch.set_column(batch.schema.get_field_index("total"), "total", total)


def measure_core(total_rows: int) -> dict[str, Any]:
    """Both batch functions over the same batches in this process: wall and CPU rows/s."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from streamling.transforms import quickjs
    from streamling.transforms.script import ScriptJob, coercion_kind, run_script_batches

    batch = ten_column_batch(BATCH_ROWS)
    spark_schema = from_arrow_schema(batch.schema)
    columns = [(f.name, coercion_kind(f.dataType)) for f in spark_schema.fields]
    job = ScriptJob("bench", quickjs.driver_source(SCRIPT, columns), quickjs.driver_source(SCRIPT, columns, True),
                    quickjs.default_runtime_path(), 256, 60_000, to_arrow_schema(spark_schema, timezone="UTC"), ())
    batches = max(1, total_rows // BATCH_ROWS)
    out: dict[str, Any] = {"batch_rows": BATCH_ROWS, "batches": batches}
    for label, fn in (("script", lambda it: run_script_batches(job, it)), ("handwritten", handwritten_transform)):
        list(fn(iter([batch])))  # warm-up: module compile / cache load, first instance
        load = os.getloadavg()
        wall, cpu = time.perf_counter(), time.process_time()
        rows = sum(b.num_rows for b in fn(iter([batch] * batches)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out[label] = {"rows": rows, "wall_s": wall, "cpu_s": cpu, "rows_per_s_wall": rows / wall,
                      "rows_per_s_cpu": rows / cpu, "load_before": load, "load_after": os.getloadavg()}
        log(f"  core {label}: {rows / wall:,.0f} rows/s wall, {rows / cpu:,.0f} rows/s per CPU second")
    return out


def measure_spark(total_rows: int, partitions: int) -> dict[str, Any]:
    """The pipeline end to end vs the hand-written streaming query on the same session."""
    from streamling.config import load_settings
    from streamling.runtime.pipeline import PipelineRun
    from streamling.runtime.session import build_session
    from streamling.sources.generate import generate_stream
    from streamling.spec import parse_pipeline

    spark = build_session(load_settings(environ={}, cwd=ROOT), app_name="bench-script")
    per_batch = min(total_rows, 1_000_000)
    source = {"rows": total_rows, "rows_per_batch": per_batch, "partitions": partitions, "profile": "orders"}
    yaml_text = textwrap.dedent(f"""
        sources:
          orders: {json.dumps({"type": "generate", **source})}
        transforms:
          wide: {{type: sql, from: orders, sql: "{SQL}"}}
          js:
            type: script
            from: wide
            script: "{SCRIPT}"
        sinks:
          out: {{type: blackhole, from: js}}
    """)

    def streamling_side(workdir: Path) -> float:
        settings = load_settings(environ={}, cwd=workdir, overrides={
            "state_dir": str(workdir / "state"), "application_id": f"bench_{workdir.name.replace('-', '_')}",
            "checkpoint_interval_sec": 0})
        run = PipelineRun(parse_pipeline(yaml_text), settings, spark)
        started = time.perf_counter()
        run.start()
        try:
            run.wait(timeout_secs=3600)
        finally:
            run.stop("benchmark finished")
        return time.perf_counter() - started

    def handwritten_side(workdir: Path) -> float:
        def process(batch: Any, _batch_id: int) -> None:
            batch.createOrReplaceTempView("orders")
            wide = batch.sparkSession.sql(SQL)
            wide.mapInArrow(handwritten_transform, wide.schema).write.format("noop").mode("overwrite").save()

        started = time.perf_counter()
        query = (generate_stream(spark, source).writeStream.foreachBatch(process)
                 .option("checkpointLocation", str(workdir / "cp")).trigger(availableNow=True).start())
        query.awaitTermination()
        return time.perf_counter() - started

    out: dict[str, Any] = {"rows": total_rows, "partitions": partitions, "source": source}
    for label, side in (("script", streamling_side), ("handwritten", handwritten_side)):
        with tempfile.TemporaryDirectory(prefix=f"bench-{label}-warm-") as tmp:
            side(Path(tmp))
        load = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix=f"bench-{label}-") as tmp:
            wall = side(Path(tmp))
        out[label] = {"wall_s": wall, "rows_per_s": total_rows / wall, "rows_per_s_per_core": total_rows / wall /
                      partitions, "load_before": load, "load_after": os.getloadavg()}
        log(f"  spark {label}: {total_rows / wall:,.0f} rows/s, {total_rows / wall / partitions:,.0f} per core")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=200_000, help="rows per measurement (default 200,000)")
    parser.add_argument("--no-spark", action="store_true", help="only the in-process per-core measurement")
    args = parser.parse_args(argv)
    os.environ.setdefault("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))
    cores = os.cpu_count() or 1
    result: dict[str, Any] = {
        "machine": {"cores": cores, "python": platform.python_version(), "load": os.getloadavg(),
                    "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                             text=True).stdout.strip()},
        "script": SCRIPT, "sql": SQL,
    }
    log(f"script_throughput: {args.rows:,} rows, {cores} cores, load {os.getloadavg()[0]:.1f}")
    result["core"] = measure_core(args.rows)
    if not args.no_spark:
        result["spark"] = measure_spark(args.rows, partitions=min(cores, 2))
    core = result["core"]
    print(f"{'measurement':<34}{'script':>14}{'hand-written':>16}{'ratio':>8}")
    rows = [("core rows/s (per CPU second)", core["script"]["rows_per_s_cpu"], core["handwritten"]["rows_per_s_cpu"]),
            ("core rows/s (wall)", core["script"]["rows_per_s_wall"], core["handwritten"]["rows_per_s_wall"])]
    if "spark" in result:
        spark = result["spark"]
        rows.append(("spark rows/s per core", spark["script"]["rows_per_s_per_core"],
                     spark["handwritten"]["rows_per_s_per_core"]))
    for label, ours, theirs in rows:
        print(f"{label:<34}{ours:>14,.0f}{theirs:>16,.0f}{ours / theirs:>8.3f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {cores} cores")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
