"""A bundle's declarative pipeline refreshed by a job on the cluster of two hosts.

The pipeline task's driver runs on host A, with the target's master: executors on both hosts compute
its materialized views — a Python one with a Python UDF, so host B's executors run the job's shipped
Python environment — and write them as Delta tables under the pipeline's ``storage`` on HDFS, which
a fresh session reads back.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import bundle, runs

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ORDERS = """\
from pyspark import pipelines as dp
from pyspark.sql import functions as F


@F.udf("long")
def tenfold(x):  # Python on the executors
    return x * 10


@dp.materialized_view
def orders():
    return spark.range(0, 20, 1, 4).withColumn("amount", tenfold("id"))
"""

BIG_ORDERS = "CREATE MATERIALIZED VIEW big_orders AS SELECT id, amount FROM orders WHERE amount >= 100;\n"


@pytest.fixture
def project(tmp_path: Path, two_hosts: dict[str, str], unique_name: str) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path / "project"
    (root / "transformations").mkdir(parents=True)
    (root / "transformations" / "orders.py").write_text(ORDERS)
    (root / "transformations" / "big_orders.sql").write_text(BIG_ORDERS)
    driver = two_hosts["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: lake}}
        resources:
          jobs:
            refresh:
              tasks:
                - task_key: update
                  pipeline_task: {{pipeline_id: "${{resources.pipelines.orders.id}}", full_refresh: true}}
          pipelines:
            orders:
              name: orders
              libraries: [{{glob: {{include: ./transformations/**}}}}]
              storage: {two_hosts['STREAMLING_TEST_HDFS_URL']}/tests/{unique_name}/orders
        targets:
          cluster:
            default: true
            workspace: {{root_path: {tmp_path / 'root'}}}
            config:
              spark:
                master: {two_hosts['STREAMLING_TEST_MULTIHOST_MASTER']}
                conf:
                  spark.app.name: {unique_name}
                  spark.driver.host: {driver}
                  spark.driver.bindAddress: {driver}
                  spark.hadoop.dfs.replication: "1"
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLING__", "BUNDLE_VAR_"))}
    yield root, env
    bundle(root, env, "destroy", "--auto-approve")


def _host_b_executors(state: Path, app_name: str, since: float) -> list[Path]:
    """Executor folders of this test's application in worker b's work dir (host B's own disk)."""
    work = state / "hostb" / "work"
    return [executor for app in (work.glob("app-*") if work.exists() else []) if app.stat().st_mtime >= since
            for executor in app.iterdir()
            if (executor / "stderr").exists() and app_name in (executor / "stderr").read_text(errors="replace")]


def test_a_pipeline_is_refreshed_by_a_job_on_two_hosts_with_its_tables_on_hdfs(
        project: tuple[Path, dict[str, str]], two_hosts: dict[str, str], unique_name: str, spark: Any) -> None:
    root, env = project
    started = time.time()
    deployed = bundle(root, env, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    run = bundle(root, env, "run", "refresh", timeout=300)
    [latest] = runs(root, env, "refresh")
    logs = bundle(root, env, "logs", str(latest["run_id"])).stdout
    assert run.returncode == 0, run.stderr + logs[-4000:]
    assert "Run is COMPLETED" in logs, logs[-4000:]
    print(f"two hosts: pipeline deploy + run {time.time() - started:.1f}s")

    # Delta tables under the pipeline's storage on HDFS, read by another session
    tables = f"{two_hosts['STREAMLING_TEST_HDFS_URL']}/tests/{unique_name}/orders/tables"
    big = spark.read.format("delta").load(f"{tables}/big_orders").collect()
    assert sorted((r.id, r.amount) for r in big) == [(i, i * 10) for i in range(10, 20)]
    # host B's executors worked for it, with the shipped Python (nothing of ours is installed there)
    executors = _host_b_executors(Path(two_hosts["STREAMLING_TEST_MULTIHOST_STATE"]), unique_name, started)
    assert executors, "no executor of the pipeline's application ran on host B"
    assert any((e / "streamling_env" / "bin" / "streamling-python").exists() for e in executors)
