"""Notebooks as Databricks runs them in a job: every cell in order in the driver, on real Spark.

One bundle, deployed once: a Databricks source notebook mixing Python, ``%run``, ``%sql``, ``%sh``,
``%%streamling`` cells and ``dbutils`` hands a task value to the next task and exits with a value;
a notebook failing in its second cell fails its run naming the cell; a notebook blocked in a cell
with a streaming query running is cancelled and stops at once.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jobs
import pytest
from jobs import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark]
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLING__", "BUNDLE_VAR_"))}

HELPERS = """\
# Databricks notebook source
REGIONS = {"US": "americas", "CA": "americas", "BR": "americas", "DE": "europe", "FR": "europe",
           "GB": "europe", "ES": "europe", "JP": "asia", "IN": "asia", "AU": "asia"}

# COMMAND ----------

def lookup(spark):
    return spark.createDataFrame(sorted(REGIONS.items()), "country STRING, region STRING")

# COMMAND ----------

SOURCE = dbutils.widgets.get("source")  # %run's argument
"""

CHILD = """\
# Databricks notebook source
child_only = int(dbutils.widgets.get("x"))
# its own SparkSession: this view does not replace the caller's "regions"
spark.range(child_only).createOrReplaceTempView("regions")

# COMMAND ----------

# MAGIC %sql
# MAGIC SELECT count(*) * 2 AS doubled FROM regions WHERE ${x} >= 0

# COMMAND ----------

dbutils.notebook.exit(str(_sqldf.first().doubled))
"""

MIXED = """\
# Databricks notebook source
# MAGIC %md
# MAGIC # Orders by region

# COMMAND ----------

# MAGIC %run ./lib/helpers $source="generated orders"

# COMMAND ----------

assert SOURCE == "generated orders", SOURCE
dbutils.widgets.text("min_amount", "0")
lake = dbutils.widgets.get("lake")
lookup(spark).createOrReplaceTempView("regions")

# COMMAND ----------

# MAGIC %load_ext streamling

# COMMAND ----------

# MAGIC %%streamling source orders
# MAGIC type: generate
# MAGIC rows: 40

# COMMAND ----------

# MAGIC %%streamling transform by_region --from orders
# MAGIC SELECT id, amount, country FROM orders WHERE amount >= {{min_amount}}

# COMMAND ----------

# MAGIC %%streamling sink lake --from by_region
# MAGIC type: delta
# MAGIC path: {{lake}}
# MAGIC primary_key: [id]

# COMMAND ----------

# MAGIC %streamling run --wait

# COMMAND ----------

# MAGIC %sql
# MAGIC -- the table the pipeline wrote, with the Python cell's lookup; a ';' in a string does not split it
# MAGIC SELECT r.region, count(*) AS n, 'a;b' AS s FROM delta.`${lake}` o JOIN regions r ON o.country = r.country
# MAGIC GROUP BY r.region ORDER BY r.region

# COMMAND ----------

counts = {row.region: row.n for row in _sqldf.collect()}
dbutils.jobs.taskValues.set("counts", counts)
doubled = dbutils.notebook.run("./lib/child", 120, {"x": "21"})
assert doubled == "42" and "child_only" not in globals(), (doubled, sorted(globals()))
# Databricks' way to run notebooks in parallel: threads. Each child has its own namespace, widgets and
# SparkSession; the caller's globals (which the threads' function reads) stay as they are.
from concurrent.futures import ThreadPoolExecutor
child_path = "./lib/child"
with ThreadPoolExecutor(3) as pool:
    doubles = list(pool.map(lambda x: dbutils.notebook.run(child_path, 120, {"x": str(x)}), range(1, 7)))
assert doubles == [str(2 * x) for x in range(1, 7)], doubles
assert spark.table("regions").columns == ["country", "region"], spark.table("regions").columns

# COMMAND ----------

# MAGIC %sh
# MAGIC echo "shell cell in $(basename "$PWD")"

# COMMAND ----------

from databricks.sdk.runtime import dbutils as sdk_dbutils
assert sdk_dbutils is dbutils
dbutils.notebook.exit(f"{sum(counts.values())} rows")

# COMMAND ----------

raise RuntimeError("cells after dbutils.notebook.exit do not run")
"""

FAILING = """\
# Databricks notebook source
print("first cell")

# COMMAND ----------

ratio = 1 / 0

# COMMAND ----------

open("{marker}", "w").write("ran")
"""

BLOCKED = """\
# Databricks notebook source
query = spark.readStream.format("rate").option("rowsPerSecond", 5).load().writeStream.format("noop").start()

# COMMAND ----------

import time
print("sleeping", flush=True)
time.sleep(3600)
"""

REPORT = """\
-- a SQL task: statements of a file, with job parameters as ${legacy} references and :markers
CREATE OR REPLACE TABLE report USING delta LOCATION '${report}' AS
SELECT country, count(*) AS n FROM delta.`${lake}` WHERE amount >= ${floor} GROUP BY country;
SELECT count(*) AS countries, :floor AS floor FROM report
"""

ORDERS_VIEW = """\
from pyspark import pipelines as dp
from pyspark.sql import functions as F


@dp.materialized_view
def orders():
    return spark.range(10).withColumn("amount", F.col("id") * 10)
"""

BIG_ORDERS_VIEW = "CREATE MATERIALIZED VIEW big_orders AS SELECT id, amount FROM orders WHERE amount >= 50;\n"

CONF = """\
import json, os, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()  # as a Databricks Python file builds it
conf = spark.sparkContext.getConf()
json.dump({"partitions": spark.conf.get("spark.sql.shuffle.partitions"), "master": spark.sparkContext.master,
           "region": os.environ.get("REGION"), "executor_region": conf.get("spark.executorEnv.REGION")},
          open(sys.argv[1], "w"))
"""

CHECK = """\
import json, sys
from streamling.notebook.dbutils import dbutils
open(sys.argv[1], "w").write(json.dumps(dbutils.jobs.taskValues.get("prep", "counts")))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("notebook_jobs")
    root = base / "project"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "helpers.py").write_text(HELPERS)
    (root / "lib" / "child.py").write_text(CHILD)
    (root / "mixed.py").write_text(MIXED)
    (root / "failing.py").write_text(FAILING.format(marker=base / "marker"))
    (root / "blocked.py").write_text(BLOCKED)
    (root / "check.py").write_text(CHECK)
    (root / "conf.py").write_text(CONF)
    (root / "transformations").mkdir()
    (root / "transformations" / "orders.py").write_text(ORDERS_VIEW)
    (root / "transformations" / "big_orders.sql").write_text(BIG_ORDERS_VIEW)
    (root / "sql").mkdir()
    (root / "sql" / "report.sql").write_text(REPORT)
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: notebooks}}
        workspace: {{root_path: {base / 'root'}}}
        resources:
          jobs:
            regions:
              parameters: [{{name: lake, default: {base / 'lake'}}}, {{name: min_amount, default: "100"}}]
              tasks:
                - {{task_key: prep, notebook_task: {{notebook_path: ./mixed.py}}}}
                - task_key: report
                  depends_on: [{{task_key: prep}}]
                  sql_task:
                    file: {{path: ./sql/report.sql}}
                    parameters: {{floor: "{{{{job.parameters.min_amount}}}}", report: "{base / 'report'}"}}
                    warehouse_id: abc123
                - task_key: check
                  depends_on: [{{task_key: prep}}]
                  spark_python_task: {{python_file: ./check.py, parameters: ["{base / 'check.json'}"]}}
            failing:
              tasks: [{{task_key: main, notebook_task: {{notebook_path: ./failing.py}}}}]
            blocked:
              tasks: [{{task_key: main, notebook_task: {{notebook_path: ./blocked.py}}}}]
            clustered:
              job_clusters:
                - job_cluster_key: small
                  new_cluster:
                    spark_version: 15.4.x-scala2.12
                    num_workers: 2
                    spark_conf: {{spark.sql.shuffle.partitions: "7"}}
                    spark_env_vars: {{REGION: eu}}
              tasks:
                - task_key: main
                  job_cluster_key: small
                  spark_python_task: {{python_file: ./conf.py, parameters: ["{base / 'conf.json'}"]}}
            refresh:
              tasks:
                - task_key: update
                  pipeline_task: {{pipeline_id: "${{resources.pipelines.orders.id}}", full_refresh: true}}
          pipelines:
            orders:
              name: orders
              libraries: [{{glob: {{include: ./transformations/**}}}}]
        targets: {{dev: {{default: true, config: {{spark: {{master: "local[2]"}}}}}}}}
    """))
    deployed = jobs.bundle(root, ENV, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    yield root
    jobs.bundle(root, ENV, "destroy", "--auto-approve")


def _runs(root: Path, job: str) -> list[dict[str, Any]]:
    return jobs.runs(root, ENV, job)


def test_a_mixed_notebook_runs_every_cell_and_hands_its_values_on(project: Path, spark: Any) -> None:
    summary = jobs.bundle(project, ENV, "summary", "-o", "json")
    assert json.loads(summary.stdout)["jobs"]["regions"]["on_redeploy"] == {
        "prep": "restarts its driver", "report": "restarts its driver", "check": "restarts its driver"}
    run = jobs.bundle(project, ENV, "run", "regions", timeout=300)
    [latest] = _runs(project, "regions")
    logs = jobs.bundle(project, ENV, "logs", str(latest["run_id"]), "--task", "prep").stdout
    assert run.returncode == 0, run.stderr + logs
    lake = project.parent / "lake"
    rows = spark.read.format("delta").load(str(lake)).collect()
    # the widget's job parameter applied in the %%streamling transform; the lookup joined in the %sql cell
    regions = {"US": "americas", "CA": "americas", "BR": "americas", "DE": "europe", "FR": "europe",
               "GB": "europe", "ES": "europe", "JP": "asia", "IN": "asia", "AU": "asia"}
    assert rows and all(r.amount >= 100 for r in rows) and len({r.id for r in rows}) == len(rows)
    counts = json.loads((project.parent / "check.json").read_text())
    assert counts == {region: sum(1 for r in rows if regions[r.country] == region)
                      for region in {regions[r.country] for r in rows}}
    tasks = {t["task_key"]: t for t in latest["tasks"]}
    assert tasks["prep"]["message"] == f"exited: {len(rows)} rows"
    assert "shell cell in files" in logs  # %sh runs in the notebook's folder of the deployed files
    assert "already loaded" not in logs  # the driver's own loading of the magics is not the notebook's
    report_log = jobs.bundle(project, ENV, "logs", str(latest["run_id"]), "--task", "report").stdout
    assert "|countries|floor|" in report_log.replace(" ", ""), report_log
    report = {r.country: r.n for r in spark.read.format("delta").load(str(project.parent / "report")).collect()}
    assert report == {c: sum(1 for r in rows if r.country == c) for c in {r.country for r in rows}}
    assert "cells after dbutils.notebook.exit do not run" not in logs


def test_a_failing_cell_fails_the_task_naming_the_cell(project: Path) -> None:
    run = jobs.bundle(project, ENV, "run", "failing", timeout=300)
    assert run.returncode == 1
    assert "notebook failing.py: cell 2 (line 6) failed: ZeroDivisionError: division by zero" in run.stderr, run.stderr
    assert not (project.parent / "marker").exists()
    [failed] = _runs(project, "failing")
    assert failed["state"] == "failed" and failed["attempts"][0]["exit_code"] == 1


def test_a_cancelled_notebook_stops_its_running_cell_and_queries(project: Path) -> None:
    assert jobs.bundle(project, ENV, "run", "blocked", "--no-wait").returncode == 0
    [run] = _runs(project, "blocked")
    wait_for(lambda: "sleeping" in jobs.bundle(project, ENV, "logs", str(run["run_id"])).stdout, 180,
             "the notebook to reach its blocking cell")
    began = time.monotonic()
    assert jobs.bundle(project, ENV, "cancel", str(run["run_id"])).returncode == 0
    run = wait_for(lambda: next((r for r in _runs(project, "blocked") if r["state"] not in ("running", "pending")),
                                None), 120, "the cancelled run to end")
    assert run["state"] == "cancelled", run
    assert time.monotonic() - began < 60
    assert run["attempts"][0]["exit_code"] == 0


def test_a_declarative_pipeline_is_refreshed_by_its_task(project: Path, spark: Any) -> None:
    run = jobs.bundle(project, ENV, "run", "refresh", timeout=300)
    [latest] = _runs(project, "refresh")
    logs = jobs.bundle(project, ENV, "logs", str(latest["run_id"])).stdout
    assert run.returncode == 0, run.stderr + logs
    assert "Run is COMPLETED" in logs
    # Delta tables, as a Lakeflow pipeline makes them
    big = spark.read.format("delta").load(str(project.parent / "root" / "warehouse" / "big_orders")).collect()
    assert sorted((r.id, r.amount) for r in big) == [(i, i * 10) for i in range(5, 10)]


def test_a_job_clusters_spark_settings_reach_the_tasks_own_session(project: Path) -> None:
    run = jobs.bundle(project, ENV, "run", "clustered", timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads((project.parent / "conf.json").read_text()) == {
        "partitions": "7", "master": "local[2]", "region": "eu", "executor_region": "eu"}
    validated = jobs.bundle(project, ENV, "validate")
    assert "'num_workers' has no effect here: a cluster's size and runtime come from the target's Spark master" \
        in validated.stderr + validated.stdout
