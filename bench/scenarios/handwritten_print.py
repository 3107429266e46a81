"""The hand-written counterpart of the ``cold_start`` pipeline, run as its own process.

A PySpark user's script for "generate → SQL → print": build a SparkSession, read the same
``generate`` source (``generate_stream`` from streamling, with the jar of its JVM reader, as the only
piece borrowed: both sides read the very same source), run the SQL inside
``foreachBatch`` and print every row as JSON on stdout. ``--same-conf`` gives the session exactly
the conf streamling's ``build_session`` sets (connector jars, Delta extension, log4j file);
without it the session is a minimal one, which isolates what that conf costs at start-up.

Kept free of the benchmark package so that the process imports only what such a script would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--rows-per-batch", type=int, required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--sql", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--shuffle-partitions", default="2")
    p.add_argument("--jars", default="", help="comma-separated local jar paths (same-conf mode)")
    p.add_argument("--source-jar", default="", help="the generate source's JVM reader (both modes)")
    p.add_argument("--log4j", default="", help="log4j2 properties file (same-conf mode)")
    p.add_argument("--java-options", default="", help="more driver JVM options (same-conf mode: the class archive)")
    p.add_argument("--same-conf", action="store_true")
    args = p.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import DataFrame, SparkSession

    builder = (SparkSession.builder.appName("handwritten").master(args.master)
               .config("spark.sql.shuffle.partitions", args.shuffle_partitions)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1"))
    jars = [j for j in (args.jars.split(",") if args.same_conf and args.jars else []) + [args.source_jar] if j]
    if jars:  # on the JVM's class path, as streamling puts them for a local master
        builder = builder.config("spark.driver.extraClassPath", os.pathsep.join(jars))
    if args.same_conf:
        builder = (builder
                   .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
                   .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
                   .config("spark.databricks.delta.snapshotPartitions", args.shuffle_partitions)
                   .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
                   .config("spark.driver.extraJavaOptions",
                           f"-Dlog4j2.configurationFile=file:{args.log4j} {args.java_options}".strip()))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    from streamling.sources.generate import generate_stream

    stream = generate_stream(spark, {"rows": args.rows, "rows_per_batch": args.rows_per_batch,
                                     "partitions": args.partitions, "profile": "orders"})

    def default(value: Any) -> str:
        return value.isoformat() if hasattr(value, "isoformat") else str(value)

    def print_batch(batch: DataFrame, _batch_id: int) -> None:
        batch.createOrReplaceTempView("orders")
        rows = batch.sparkSession.sql(args.sql).toArrow().to_pylist()
        if rows:
            sys.stdout.write("\n".join(json.dumps(r, default=default, separators=(",", ":")) for r in rows) + "\n")
            sys.stdout.flush()

    query = (stream.writeStream.foreachBatch(print_batch).option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    # No spark.stop(): the streamling CLI leaves the session to process exit too, so both exits
    # measure the same teardown.
    return 0


if __name__ == "__main__":
    sys.exit(main())
