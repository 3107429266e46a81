"""``cluster_jars``: what an application's connector jars cost its start on the two-host cluster.

A fresh process starts a session on the cluster of ``fixtures/services/up spark_multihost`` (worker a
on this host, worker b in its own namespaces) with the connector jars and s3a's (hadoop-aws and the
AWS SDK bundle, ~700 MB together) and writes 4 partitions of 1,000 rows as Parquet to the S3 store
of ``up s3``, so executors on both hosts load s3a's classes. Timed from process launch to the write's
end, and the bytes the application left in the workers' work folders (what Spark copies per
executor per application):

- **hand-written**: PySpark as a user writes it without streamling, every jar on ``spark.jars``:
  every executor copies each jar into its work folder before its first task.
- **host cache**: streamling's ``build_session``; executors take the jars from their host's cache
  (``HostJars``), filled by an earlier run; on worker a's host they use the driver's files in place.
- **host cache, new host**: the same with an empty cache for each run (a host new to these jars).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from scenarios.common import (
    VENV_BIN,
    Options,
    ScenarioResult,
    Side,
    ensure_services,
    interleaved,
    log,
    paired_ratio,
)

NAME = "cluster_jars"
TIMEOUT_SECS = 600

_WRITE = """
import json, sys, time
conf = json.loads(sys.argv[1])
{session}
spark.range(0, 4000, numPartitions=4).selectExpr("id", "uuid() AS u").write.parquet(sys.argv[2])
print(json.dumps({{"executors": sorted({{e.host() for e in
      spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()}})}}))
spark.stop()
"""
_HANDWRITTEN = """
from pyspark.sql import SparkSession
b = SparkSession.builder.master(conf.pop("master")).appName(conf.pop("app"))
for k, v in conf.items():
    b = b.config(k, v)
spark = b.getOrCreate()
"""
_STREAMLING = """
from streamling.config import load_settings
from streamling.runtime.session import build_session
master, app = conf.pop("master"), conf.pop("app")
conf["spark.app.name"] = app
spark = build_session(load_settings(None, overrides={"spark": {"master": master, "conf": conf}}))
"""


def _app_bytes(work_dirs: list[Path], app: str) -> int:
    """Bytes in the workers' work folders of the application named ``app``."""
    total = 0
    for work in work_dirs:
        for folder in work.glob("app-*") if work.exists() else []:
            executors = [e for e in folder.iterdir() if (e / "stderr").exists()]
            if any(app in (e / "stderr").read_text(errors="replace") for e in executors):
                total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return total


def _run(session: str, conf: dict[str, str], work_dirs: list[Path]) -> dict[str, Any]:
    app = f"bench_jars_{uuid.uuid4().hex[:8]}"
    target = f"s3a://{os.environ['STREAMLING_TEST_S3_BUCKET']}/bench/{app}"
    conf = {**conf, "master": os.environ["STREAMLING_TEST_MULTIHOST_MASTER"], "app": app}
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    launched = time.time()
    proc = subprocess.run([str(VENV_BIN / "python"), "-c", _WRITE.format(session=session), json.dumps(conf), target],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_SECS)
    secs = time.time() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"the write failed:\n{proc.stderr[-2000:]}")
    hosts = json.loads(proc.stdout.strip().splitlines()[-1])["executors"]
    return {"write_secs": secs, "hosts": len(hosts), "work_mb": _app_bytes(work_dirs, app) / 1e6}


def run(options: Options) -> ScenarioResult:
    sides = {n: Side(n) for n in ("handwritten", "host_cache", "host_cache_new_host")}
    why = ensure_services("spark_multihost", "s3", present=("STREAMLING_TEST_MULTIHOST_MASTER",
                                                            "STREAMLING_TEST_S3A_JARS"))
    if why:
        return ScenarioResult(NAME, {}, sides, skipped=why)
    from streamling.runtime.jars import ensure_jars

    driver = os.environ["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]
    s3a_jars = os.environ["STREAMLING_TEST_S3A_JARS"]
    conf = {"spark.driver.host": driver, "spark.driver.bindAddress": driver,
            "spark.hadoop.fs.s3a.endpoint": os.environ["STREAMLING_TEST_S3_ENDPOINT"],
            "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.access.key": os.environ["STREAMLING_TEST_S3_ACCESS_KEY"],
            "spark.hadoop.fs.s3a.secret.key": os.environ["STREAMLING_TEST_S3_SECRET_KEY"]}
    every_jar = ",".join([*(str(j) for j in ensure_jars()), s3a_jars])
    state = Path(os.environ["STREAMLING_TEST_MULTIHOST_STATE"])
    work_dirs = [state / "worker_a", state / "hostb" / "work"]

    def handwritten() -> dict[str, Any]:
        # the driver's class path gets them as spark-submit --jars would give them
        return _run(_HANDWRITTEN, {**conf, "spark.jars": every_jar}, work_dirs)

    def host_cache() -> dict[str, Any]:
        return _run(_STREAMLING, {**conf, "spark.jars": s3a_jars}, work_dirs)

    def new_host() -> dict[str, Any]:
        # A cache folder of its own on every host: worker b's is inside its own /tmp.
        name = f"streamling-bench-jars-{uuid.uuid4().hex[:8]}"
        try:
            return _run(_STREAMLING, {**conf, "spark.jars": s3a_jars,
                                      "spark.executorEnv.STREAMLING_WORKER_CACHE": f"/tmp/{name}"}, work_dirs)
        finally:
            subprocess.run(["rm", "-rf", str(state / "hostb" / "systmp" / name), f"/tmp/{name}"], check=False)

    interleaved(options.runs, {"handwritten": handwritten, "host_cache": host_cache,
                               "host_cache_new_host": new_host}, sides, log)
    s = sides
    result = ScenarioResult(NAME, {"runs": options.runs, "jars_mb": sum(
        Path(j).stat().st_size for j in every_jar.split(",")) / 1e6}, sides)
    result.figures = {
        "hand-written (spark.jars): launch → written": (s["handwritten"].median("write_secs"), "s"),
        "host cache: launch → written": (s["host_cache"].median("write_secs"), "s"),
        "host cache, new host: launch → written": (s["host_cache_new_host"].median("write_secs"), "s"),
        "hand-written: work folders per application": (s["handwritten"].median("work_mb"), "MB"),
        "host cache: work folders per application": (s["host_cache"].median("work_mb"), "MB"),
    }
    result.ratios = {
        "host cache/hand-written launch → written": paired_ratio(s["host_cache"], s["handwritten"], "write_secs",
                                                                 False),
        "host cache new host/hand-written launch → written": paired_ratio(
            s["host_cache_new_host"], s["handwritten"], "write_secs", False),
    }
    result.notes.append("ratios are speed: hand-written seconds / ours (higher = faster)")
    return result
