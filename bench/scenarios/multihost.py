"""``multihost``: what running beyond one machine costs — shared storage, a second host, a shipped
Python environment. Every side is the ``streamling`` CLI as a user runs it (fresh process), timed
from its own log: ``epoch N finalized`` lines carry the driver's clock.

- **checkpoint on HDFS vs local disk**: generate (40 epochs of 1,000 rows, as fast as it goes) →
  SQL → blackhole on ``local[2]``, ``state_dir`` on the local disk or on the HDFS of
  ``fixtures/services/up hdfs``. Seconds per epoch = (last finalized − first finalized) / epochs
  between them: the offsets and commit files, ``flow.json`` and the planned-offsets read per epoch.
- **two hosts vs local[2]**: generate (8 epochs of 50,000 rows) → SQL → append-only Delta on HDFS,
  checkpoints on HDFS, on ``local[2]`` and on the two-host cluster of ``up spark_multihost`` (worker
  a here, worker b in its own network and mount namespaces). Rows/s over the epochs after the first.
  The machine has 2 cores: both "hosts" share them with the driver and HDFS, so the ratio shows the
  cost of distribution, not scaling.
- **Kafka → Postgres, two hosts vs local[2]**: 200,000 Avro records (the ``kafka_avro`` scenario's
  topic) read from the broker's listener on host A's address (both hosts reach it) in epochs of
  25,000 → SQL projection → a Postgres table, written from the executors to the server's address on
  the same pair; rows/s over the epochs after the first.
- **cold start, shipped environment vs same path**: on the loopback cluster of ``up spark`` (both
  workers on this host, so the same-path start works there), a one-epoch pipeline whose SQL calls a
  Python UDF (executors must start Python workers with streamling and pyarrow): process launch → first
  epoch finalized and → exit, with ``spark.python_environment: shipped`` (the packed parts are in
  the driver's cache and the workers' host cache: what every start after a host's first pays), the
  same on a new host (an empty host cache: the workers fetch and unpack the parts from the driver)
  and ``local`` (executors run the driver's interpreter by path). The one-off pack of the parts is
  timed separately with an empty cache.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import tempfile
import time
import uuid
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
    temp_dir,
)

NAME = "multihost"
TIMEOUT_SECS = 600
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO streamling: flow \S+: epoch (\d+) finalized "
                    r"\((\d+) input rows\)", re.M)
KAFKA_ROWS = 200_000
HDFS_CLIENT = {"spark.hadoop.dfs.replication": "1",
               "spark.hadoop.dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "20"}


def _pipeline(rows: int, per_epoch: int, sql: str, sink: str) -> str:
    return (f"sources:\n  orders: {{type: generate, rows: {rows}, rows_per_batch: {per_epoch}}}\n"
            f"transforms:\n  shaped: {{type: sql, sql: \"{sql}\"}}\n"
            f"sinks:\n  out: {sink}\n")


def run_cli(pipeline: str, conf: dict[str, str], settings: dict[str, str]) -> dict[str, Any]:
    """One CLI run in a fresh folder; figures from its log's finalized epochs."""
    with temp_dir(NAME) as work:
        (work / "pipeline.yaml").write_text(pipeline)
        env = {**os.environ, "STREAMLING__ADMIN_API_PORT": "0",
               "STREAMLING__APPLICATION_ID": f"bench_{uuid.uuid4().hex[:8]}",
               **{f"STREAMLING__{k.upper().replace('.', '__')}": v for k, v in settings.items()},
               **{f"STREAMLING__SPARK__CONF__{k}": v for k, v in conf.items()}}
        launched = time.time()
        with (work / "stderr.txt").open("w") as err:
            code = subprocess.run([str(VENV_BIN / "streamling"), "pipeline.yaml"], cwd=work, env=env,
                                  stdout=subprocess.DEVNULL, stderr=err, timeout=TIMEOUT_SECS).returncode
        ended = time.time()
        text = (work / "stderr.txt").read_text(errors="replace")
    if code != 0:
        raise RuntimeError(f"streamling exited {code}:\n{text[-2000:]}")
    epochs = [(dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), int(m.group(3)))
              for m in _STAMP.finditer(text)]
    out: dict[str, Any] = {"exit_secs": ended - launched, "epochs": len(epochs)}
    if epochs:
        out["first_epoch_secs"] = epochs[0][0] - launched
    if len(epochs) > 1:
        span = epochs[-1][0] - epochs[0][0]
        out["secs_per_epoch"] = span / (len(epochs) - 1)
        out["rows_per_sec"] = sum(r for _, r in epochs[1:]) / span if span > 0 else float("nan")
    return out


def cold_on_a_new_host(pipeline: str, settings: dict[str, str]) -> dict[str, Any]:
    """A shipped cold start whose workers' host cache is empty (as on a host new to the job)."""
    with temp_dir(f"{NAME}-host-cache") as cache:
        return run_cli(pipeline, {"spark.executorEnv.STREAMLING_WORKER_CACHE": str(cache)},
                       {**settings, "spark__python_environment": "shipped",
                        "state_dir": tempfile.mkdtemp(prefix="sl-cold-")})


def _pack_secs() -> float:
    """The archive's one-off pack, with an empty cache (what the first job of a new environment pays)."""
    with tempfile.TemporaryDirectory(prefix="streamling-bench-pack-") as cache:
        code = ("import time; t = time.perf_counter(); from streamling.runtime import environment; "
                "p = environment.packed_environment(); "
                "print(time.perf_counter() - t, sum(f.stat().st_size for f in p.parts.values()))")
        out = subprocess.run([str(VENV_BIN / "python"), "-c", code], env={**os.environ, "STREAMLING_CACHE_DIR": cache},
                             capture_output=True, text=True, check=True).stdout.split()
    log(f"  packed environment: {float(out[0]):.2f} s, {int(out[1]) / 1e6:.0f} MB")
    return float(out[0])


def run(options: Options) -> ScenarioResult:
    why = ensure_services("hdfs", "spark_multihost", "spark", present=(
        "STREAMLING_TEST_HDFS_URL", "STREAMLING_TEST_MULTIHOST_MASTER", "STREAMLING_TEST_SPARK_MASTER"))
    sides = {n: Side(n) for n in ("ckpt_local", "ckpt_hdfs", "local2_delta", "twohost_delta", "local2_kafka_pg",
                                  "twohost_kafka_pg", "cold_local", "cold_shipped",
                                  "cold_shipped_new_host")}
    why = why or ensure_services("postgres", "kafka", "registry", present=(
        "STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS", "STREAMLING_TEST_KAFKA_HOSTS_BOOTSTRAP",
        "STREAMLING__KAFKA_SOURCE__SCHEMA_REGISTRY_URL"))
    if why:
        return ScenarioResult(NAME, {}, sides, skipped=why)
    hdfs = os.environ["STREAMLING_TEST_HDFS_URL"]
    base = f"{hdfs}/bench/{uuid.uuid4().hex[:8]}"
    driver = os.environ["STREAMLING_TEST_MULTIHOST_DRIVER_HOST"]
    cluster = {"spark.driver.host": driver, "spark.driver.bindAddress": driver}
    local2 = {"spark__master": "local[2]"}

    def state(kind: str) -> str:
        return f"{base}/{kind}/{uuid.uuid4().hex[:8]}"

    blackhole = _pipeline(40_000, 1_000, "SELECT id, customer, amount * quantity AS total FROM orders",
                          "{type: blackhole, from: shaped}")
    interleaved(options.runs, {
        "ckpt_local": lambda: run_cli(blackhole, {}, {**local2, "state_dir": tempfile.mkdtemp(prefix="sl-ckpt-")}),
        "ckpt_hdfs": lambda: run_cli(blackhole, HDFS_CLIENT, {**local2, "state_dir": state("ckpt")}),
    }, sides, log)

    def delta(settings: dict[str, str], conf: dict[str, str]) -> dict[str, Any]:
        lake = state("lake")
        text = _pipeline(400_000, 50_000, "SELECT id, customer, country, amount * quantity AS total FROM orders",
                         f"{{type: delta, from: shaped, path: {lake}}}")
        return run_cli(text, {**HDFS_CLIENT, **conf}, {**settings, "state_dir": state("ckpt")})

    interleaved(options.runs, {
        "local2_delta": lambda: delta(local2, {}),
        "twohost_delta": lambda: delta({"spark__master": os.environ["STREAMLING_TEST_MULTIHOST_MASTER"]}, cluster),
    }, sides, log)

    from scenarios.kafka_avro import prepare_topic

    topic = prepare_topic(KAFKA_ROWS).topic
    shared = {"kafka_source__brokers": os.environ["STREAMLING_TEST_KAFKA_HOSTS_BOOTSTRAP"],
              "kafka_source__max_offsets_per_epoch": str(KAFKA_ROWS // 8),
              "postgres_sink__host": os.environ["STREAMLING_TEST_POSTGRES_HOSTB_ADDRESS"],
              "num_records_before_stop": str(KAFKA_ROWS)}

    def kafka_pg(settings: dict[str, str], conf: dict[str, str]) -> dict[str, Any]:
        table = f"mh_{uuid.uuid4().hex[:10]}"
        text = (f"sources:\n  src: {{type: kafka, topic: {topic}, starting_offsets: earliest}}\n"
                "transforms:\n  shaped: {type: sql, sql: \"SELECT id, user_id, lower(country) AS country, "
                "amount * 1.1 AS amount_with_fee, ts FROM src\"}\n"
                f"sinks:\n  out: {{type: postgres, from: shaped, schema: bench, table: {table}}}\n")
        try:
            return run_cli(text, conf, {**settings, **shared, "state_dir": tempfile.mkdtemp(prefix="sl-kpg-")})
        finally:
            import psycopg

            with psycopg.connect(os.environ["STREAMLING_TEST_POSTGRES_DSN"], autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS bench.{table}")

    interleaved(options.runs, {
        "local2_kafka_pg": lambda: kafka_pg(local2, {}),
        "twohost_kafka_pg": lambda: kafka_pg({"spark__master": os.environ["STREAMLING_TEST_MULTIHOST_MASTER"]},
                                             cluster),
    }, sides, log)

    udf = _pipeline(2_000, 2_000, "SELECT id, _gs_xxhash(customer) AS h FROM orders",
                    "{type: blackhole, from: shaped}")
    loopback = {"spark__master": os.environ["STREAMLING_TEST_SPARK_MASTER"]}
    interleaved(options.runs, {
        "cold_local": lambda: run_cli(udf, {}, {**loopback, "spark__python_environment": "local",
                                                "state_dir": tempfile.mkdtemp(prefix="sl-cold-")}),
        "cold_shipped": lambda: run_cli(udf, {}, {**loopback, "spark__python_environment": "shipped",
                                                  "state_dir": tempfile.mkdtemp(prefix="sl-cold-")}),
        "cold_shipped_new_host": lambda: cold_on_a_new_host(udf, loopback),
    }, sides, log)
    pack = _pack_secs()

    s = sides
    result = ScenarioResult(NAME, {"runs": options.runs, "hdfs": hdfs}, sides)
    result.figures = {
        "checkpoint local: s/epoch": (s["ckpt_local"].median("secs_per_epoch"), "s"),
        "checkpoint hdfs: s/epoch": (s["ckpt_hdfs"].median("secs_per_epoch"), "s"),
        "delta local[2]": (s["local2_delta"].median("rows_per_sec"), "rows/s"),
        "delta two hosts": (s["twohost_delta"].median("rows_per_sec"), "rows/s"),
        "kafka → postgres local[2]": (s["local2_kafka_pg"].median("rows_per_sec"), "rows/s"),
        "kafka → postgres two hosts": (s["twohost_kafka_pg"].median("rows_per_sec"), "rows/s"),
        "cold same-path: first epoch": (s["cold_local"].median("first_epoch_secs"), "s"),
        "cold shipped: first epoch": (s["cold_shipped"].median("first_epoch_secs"), "s"),
        "cold same-path: exit": (s["cold_local"].median("exit_secs"), "s"),
        "cold shipped: exit": (s["cold_shipped"].median("exit_secs"), "s"),
        "cold shipped, new host: first epoch": (s["cold_shipped_new_host"].median("first_epoch_secs"), "s"),
        "pack (empty cache, once)": (pack, "s"),
    }
    result.ratios = {
        "hdfs/local s per epoch": paired_ratio(s["ckpt_hdfs"], s["ckpt_local"], "secs_per_epoch", False) ** -1,
        "two hosts/local[2] rows/s": paired_ratio(s["twohost_delta"], s["local2_delta"], "rows_per_sec"),
        "two hosts/local[2] kafka → postgres rows/s": paired_ratio(s["twohost_kafka_pg"], s["local2_kafka_pg"],
                                                                  "rows_per_sec"),
        "shipped/same-path first epoch": paired_ratio(s["cold_shipped"], s["cold_local"], "first_epoch_secs",
                                                      False) ** -1,
    }
    result.notes.append("ratios: hdfs/local and shipped/same-path are cost multiples (1.0 = no cost, higher = "
                        "slower); two hosts/local[2] is throughput (higher = faster)")
    return result
