"""The floor of ``cold_start``: a fresh Python process that builds a bare SparkSession and runs one
tiny job, printing its result on stdout.

Nothing any Spark program can print a row faster than this on the same machine, so the README's
command is judged as a multiple of it. Kept free of the benchmark package and of streamling so the
process imports only PySpark.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    rows = spark.range(1).collect()
    sys.stdout.write(f"{rows[0][0]}\n")
    sys.stdout.flush()
    # No spark.stop(), like the CLI and the hand-written job: every exit measures the same teardown.
    return 0


if __name__ == "__main__":
    sys.exit(main())
