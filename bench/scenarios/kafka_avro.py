"""``kafka_avro``: Streamling's published Kafka benchmarks (``avro_cdc_projection``, ``avro_cdc_filter``).

Streamling's harness reads a single-partition topic of Confluent-Avro CDC records (1,000 distinct
~76-byte payloads cycled, 5,000,000 records) through a SQL transform into ``blackhole`` and
publishes input rec/s, output rec/s, MB/s and compute µs per record. This scenario reproduces
that on a real broker and schema registry so the figures can be put next to the published
baseline, and, as every scenario here, next to the hand-written PySpark job doing the same work
on the same SparkSession: ``readStream.format("kafka")`` with the same options →
``from_avro(substring(value, 6), schema)`` → the same SQL → ``foreachBatch`` into ``noop``.

Kafka sources never end, so both sides are stopped once Spark reports as many input records
committed as the topic holds; wall time runs from ``start()`` to that report. CPU time is the
driver's process tree (JVM, Python driver and workers) before/after, see ``cpu.py``.

The topic is produced once per record count (its name says so) and reused while it still holds
exactly the expected records with the schema id the registry gives today (the registry keeps
its schemas in memory, so a restarted registry may renumber them).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scenarios.common import (
    ROOT,
    Options,
    ScenarioResult,
    Side,
    bench_settings,
    ensure_services,
    interleaved,
    log,
    paired_ratio,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.cpu import CpuSnapshot, jvm_pid_of, snapshot
from scenarios.inprocess import RUNTIME_PHASES, _spark_phases
from scenarios.profiling import phase_timers, summarize_timings

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from streamling.runtime import events as ev

NAME = "kafka_avro"
DEFAULT_ROWS = 5_000_000
#: Streamling's harness measures 5 iterations after 1 warm-up; run.py's default (3) is for the
#: short scenarios, so this one uses 5 unless ``--runs`` is given.
DEFAULT_RUNS = 5
#: records per epoch on both sides (Spark's ``maxOffsetsPerTrigger``): bounded epochs, as a
#: production job would run, and several of them per run so per-epoch figures mean something.
MAX_OFFSETS_PER_EPOCH = 1_000_000
DISTINCT_PAYLOADS = 1000
CONFLUENT_HEADER = 5
TIMEOUT_SECS = 1800
SERVICE_UP = ROOT / "fixtures" / "services" / "up"

RECORD_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "CdcEvent", "namespace": "bench.streamling",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user_id", "type": "string"},
        {"name": "email", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 4}},
        {"name": "ts", "type": "long"},
        {"name": "sel_key", "type": "int"},
    ],
}
COUNTRIES = ("US", "DE", "FR", "GB", "JP", "BR", "IN", "CA", "AU", "ES")
DEVICES = ("ios", "android", "web", "desktop")


@dataclass(frozen=True)
class Query:
    """One of Streamling's two scenarios: its SQL over source ``src`` and its selectivity."""

    name: str
    sql: str
    selectivity: float

    def output_rows(self, rows: int) -> int:
        """Rows the SQL keeps: all of them, or those with ``sel_key = index mod 10 = 0``."""
        return rows if self.selectivity == 1.0 else (rows + 9) // 10


QUERIES = (
    Query("avro_cdc_projection",
          "SELECT id, user_id, email, lower(country) AS country, device, amount, amount * 1.1 AS amount_with_fee, "
          "price, ts FROM src", 1.0),
    Query("avro_cdc_filter", "SELECT id, user_id, email, country, ts FROM src WHERE sel_key = 0", 0.1),
)

#: Streamling's CI baseline (``bench/baselines/blacksmith-8vcpu``: 8 vCPU runner, 5,000,000 records,
#: commit 9abfd93). Its MB/s counts the 76-byte Avro body only; its µs/record is the sum of its
#: operators' ``elapsed_compute``, not process CPU time.
BASELINE: dict[str, dict[str, float]] = {
    "avro_cdc_projection": {"wall_median_s": 46.333442308, "wall_min_s": 46.240698559, "input_rps": 107913.42,
                            "output_rps": 107913.42, "mb_per_s": 8.20141955941807, "cpu_us_per_record": 29.0184},
    "avro_cdc_filter": {"wall_median_s": 46.404246092, "wall_min_s": 46.24034357, "input_rps": 107748.76,
                        "output_rps": 10774.88, "mb_per_s": 8.18890580070239, "cpu_us_per_record": 29.0062},
}


# --- data -------------------------------------------------------------------------------------------


def records() -> list[dict[str, Any]]:
    """The 1,000 distinct records: 10 countries, 4 devices, ``sel_key = index mod 10``.

    Strings and numbers are sized so the Avro bodies average ~76 bytes, as in Streamling's data;
    the country does not follow ``sel_key``, so the filter keeps every country.
    """
    return [{"id": j, "user_id": f"user-{j:08d}", "email": f"user{j:08d}@example-mail.com",
             "country": COUNTRIES[(j // 10) % 10], "device": DEVICES[j % 4], "amount": (j * 37 % 10000) / 100,
             "price": Decimal(j * 7919 % 1_000_000) / Decimal(10000) + Decimal("100.0000"),
             "ts": 1_700_000_000_000_000 + j * 1_000_003, "sel_key": j % 10}
            for j in range(DISTINCT_PAYLOADS)]


def payloads(schema_id: int) -> list[bytes]:
    """The records pre-encoded in the Confluent wire format: magic 0, 4-byte schema id, Avro body."""
    import fastavro

    parsed = fastavro.parse_schema(RECORD_SCHEMA)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    out = []
    for record in records():
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(header + buf.getvalue())
    return out


@dataclass(frozen=True)
class TopicData:
    """What was produced: where, with which schema id, and how many bytes the values hold."""

    topic: str
    schema_id: int
    rows: int
    value_bytes: int  # Confluent header included
    body_bytes: int  # Avro body only (what Streamling's MB/s counts)
    produce_s: float | None  # None when an earlier run's topic was reused


def ensure_kafka() -> str | None:
    """Make the broker and registry exports visible to this process; returns why not, if impossible."""
    return ensure_services("kafka", "registry", present=("STREAMLING__KAFKA_SOURCE__BROKERS",
                                                         "STREAMLING__KAFKA_SOURCE__SCHEMA_REGISTRY_URL"))


def _register(registry_url: str, subject: str) -> int:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    return int(client.register_schema(subject, Schema(json.dumps(RECORD_SCHEMA), "AVRO")))


def _topic_holds(bootstrap: str, topic: str, rows: int, values: list[bytes]) -> bool:
    """The topic exists with one partition holding exactly ``rows`` records, first and last as expected."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=15).topics.get(topic)
    if meta is None or meta.error is not None or len(meta.partitions) != 1:
        return False
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "streamling-bench-check",
                         "enable.auto.commit": False})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
        if (low, high) != (0, rows):
            return False
        for offset in (0, rows - 1):
            consumer.assign([TopicPartition(topic, 0, offset)])
            msg = consumer.poll(15)
            if msg is None or msg.error() is not None or msg.value() != values[offset % DISTINCT_PAYLOADS]:
                return False
        return True
    finally:
        consumer.close()


def _recreate(bootstrap: str, topic: str) -> None:
    """Delete the topic if present, then create it with one partition (retrying while a delete settles)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=15).topics:
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result(timeout=60)
    deadline = time.monotonic() + 120
    while True:
        try:
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
            return
        except Exception:  # the previous topic of that name may still be being deleted
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def prepare_topic(rows: int) -> TopicData:
    """Produce ``rows`` pre-encoded records once (as fast as librdkafka takes them); reuse them after."""
    from confluent_kafka import Producer

    bootstrap = os.environ["STREAMLING__KAFKA_SOURCE__BROKERS"]
    registry_url = os.environ["STREAMLING__KAFKA_SOURCE__SCHEMA_REGISTRY_URL"]
    topic = f"bench.avro_cdc.{rows}"
    schema_id = _register(registry_url, f"{topic}-value")
    values = payloads(schema_id)
    sizes = [len(v) for v in values]
    full, rest = divmod(rows, DISTINCT_PAYLOADS)
    value_bytes = full * sum(sizes) + sum(sizes[:rest])
    body_bytes = value_bytes - rows * CONFLUENT_HEADER
    if _topic_holds(bootstrap, topic, rows, values):
        log(f"  reusing topic {topic} ({rows:,} records, schema id {schema_id})")
        return TopicData(topic, schema_id, rows, value_bytes, body_bytes, None)
    log(f"  producing {rows:,} records to {topic} (schema id {schema_id})")
    _recreate(bootstrap, topic)
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
                         "compression.type": "none", "acks": "1", "enable.idempotence": False,
                         "error_cb": lambda err: errors.append(str(err))})
    t0 = time.perf_counter()
    produce = producer.produce
    for i in range(rows):
        value = values[i % DISTINCT_PAYLOADS]
        while True:
            try:
                produce(topic, value, partition=0)
                break
            except BufferError:  # the local queue is full: let librdkafka send some
                producer.poll(0.05)
    if producer.flush(300) != 0:
        raise RuntimeError(f"producing to {topic}: messages still queued after 300 s ({errors[-3:]})")
    produce_s = time.perf_counter() - t0
    if not _topic_holds(bootstrap, topic, rows, values):
        raise RuntimeError(f"producing to {topic} left a topic without exactly {rows} records ({errors[-3:]})")
    log(f"  produced in {produce_s:.1f}s ({rows / produce_s:,.0f} records/s)")
    return TopicData(topic, schema_id, rows, value_bytes, body_bytes, produce_s)


# --- both sides ---------------------------------------------------------------------------------------


class _Clock:
    """When the committed input reached the topic's size, with the process tree's CPU at that moment.

    Fed by Spark's progress reports (through streamling's events or a query listener) on the
    listener thread; the CPU snapshot is taken right there so idle polling after the last epoch
    is not counted.
    """

    def __init__(self, rows: int, jvm_pid: int | None) -> None:
        self.rows = rows
        self.jvm_pid = jvm_pid
        self.seen = 0
        self.done = threading.Event()
        self.t_done = float("nan")
        self.cpu_done: CpuSnapshot | None = None
        self.cpu_start = snapshot(jvm_pid)
        self.t0 = time.perf_counter()

    def committed(self, input_rows: int) -> None:
        self.seen += input_rows
        if self.seen >= self.rows and not self.done.is_set():
            self.t_done = time.perf_counter()
            self.cpu_done = snapshot(self.jvm_pid)
            self.done.set()


def _summary(clock: _Clock, rows: int, data: TopicData, output_rows: int, finalized: list[dict[str, Any]],
             flushed: list[dict[str, Any]], stopped: float) -> dict[str, Any]:
    """One run's figures: the published metrics plus what explains them (epochs, CPU split)."""
    wall = clock.t_done - clock.t0
    cpu = (clock.cpu_done or clock.cpu_start) - clock.cpu_start
    data_epochs = [e for e in finalized if e["input_rows"] > 0]
    first = data_epochs[0] if data_epochs else None
    steady_rows = rows - (first["input_rows"] if first else 0)
    steady_s = clock.t_done - first["t"] if first else float("nan")
    return {
        "wall_s": wall,
        "input_rps": rows / wall,
        "output_rows": output_rows,
        "output_rps": output_rows / wall,
        "mb_per_s": data.value_bytes / wall / 1e6,
        "body_mb_per_s": data.body_bytes / wall / 1e6,
        "cpu_s": cpu.total_s,
        "cpu_us_per_record": cpu.total_s / rows * 1e6,
        "cpu_jvm_us_per_record": cpu.jvm_s / rows * 1e6,
        "cpu_python_us_per_record": (cpu.driver_s + cpu.workers_s) / rows * 1e6,
        "cores_busy": cpu.total_s / wall,
        "first_epoch_after_s": first["t"] - clock.t0 if first else float("nan"),
        "steady_rps": steady_rows / steady_s if steady_rows > 0 and steady_s > 0 else float("nan"),
        "total_s": stopped - clock.t0,
        "epochs": len(data_epochs),
        "input_rows": clock.seen,
        "epoch_ms": [round(e["ms"], 1) for e in flushed],
        "spark_ms": [e["spark_ms"] for e in data_epochs],
        "flushed": [{k: v for k, v in e.items() if k != "t"} for e in flushed],
    }


def pipeline_yaml(topic: str, sql: str) -> str:
    """kafka (earliest) → one SQL transform → blackhole: Streamling's benchmark pipeline."""
    import yaml

    doc = {
        "sources": {"src": {"type": "kafka", "topic": topic, "starting_offsets": "earliest"}},
        "transforms": {"result": {"type": "sql", "sql": sql}},
        "sinks": {"out": {"type": "blackhole", "from": "result"}},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def run_streamling(spark: SparkSession, yaml_text: str, workdir: Path, data: TopicData) -> dict[str, Any]:
    """``PipelineRun`` until every record of the topic is committed, then a clean stop.

    Each run has its own application id, so its own checkpoint, state and consumer group: it
    starts from ``earliest`` like Streamling's fresh consumer group per iteration. The runtime's
    and the Kafka source's phases are timed in every run (a wrapper costs microseconds per call),
    so each run carries its own breakdown of the driver's time.
    """
    from streamling.runtime import events as ev
    from streamling.runtime.pipeline import PipelineRun
    from streamling.spec import parse_pipeline

    flushed: list[dict[str, Any]] = []
    finalized: list[dict[str, Any]] = []
    output = 0
    clock_box: list[_Clock] = []

    def on_event(event: ev.Event) -> None:
        nonlocal output
        now = time.perf_counter()
        if isinstance(event, ev.EpochFlushed):
            output += sum(event.rows.values())
            flushed.append({"t": now, "epoch": event.epoch, "ms": event.durations_ms.get("total", 0.0),
                            "durations_ms": {k: round(v, 1) for k, v in event.durations_ms.items()},
                            "rows": event.rows})
        elif isinstance(event, ev.EpochFinalized):
            finalized.append({"t": now, "epoch": event.epoch, "input_rows": event.input_rows,
                              "spark_ms": _spark_phases(event.durations_ms)})
            if clock_box:
                clock_box[0].committed(event.input_rows)

    bus = ev.EventBus()
    bus.subscribe(on_event)
    settings = bench_settings(workdir, f"bench_{workdir.name.replace('-', '_')}",
                              kafka_source={"max_offsets_per_epoch": MAX_OFFSETS_PER_EPOCH})
    run = PipelineRun(parse_pipeline(textwrap.dedent(yaml_text)), settings, spark, bus)
    with phase_timers((*RUNTIME_PHASES, *KAFKA_PHASES)) as timings:
        clock = _Clock(data.rows, jvm_pid_of(spark))
        clock_box.append(clock)
        try:
            run.start()
            deadline = time.monotonic() + TIMEOUT_SECS
            while not clock.done.wait(0.2):
                run.wait(timeout_secs=0)  # raises the flow's error if it failed
                if not any(r.query is not None and r.query.isActive for r in run.runners):
                    raise RuntimeError("the streamling query ended before reading every record")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {clock.seen:,} of {data.rows:,} records after {TIMEOUT_SECS}s")
        finally:
            run.stop("benchmark run finished")
    out = _summary(clock, data.rows, data, output, finalized, flushed, time.perf_counter())
    out["phases"] = summarize_timings(timings)
    return out


def kafka_options(topic: str, workdir: Path) -> dict[str, str]:
    """The hand-written job's reader options: the same connection (read from the same settings),
    topic, start and epoch bound. Headers are read: the CDC op travels in ``dbz.op``."""
    conn = bench_settings(workdir, "bench_hw").kafka_source
    return {**conn.spark_options(), "subscribe": topic, "startingOffsets": "earliest", "includeHeaders": "true",
            "maxOffsetsPerTrigger": str(MAX_OFFSETS_PER_EPOCH), "failOnDataLoss": "true"}


class _ProgressListener:
    """The hand-written side's view of Spark's progress reports: each data epoch goes to the clock
    on the listener thread, exactly where streamling's ``EpochFinalized`` events are produced."""

    def __init__(self, clock: _Clock) -> None:
        from pyspark.sql.streaming import StreamingQueryListener

        #: the query's name, set before it starts, so even its first report is recognised.
        self.name = f"bench_hw_{uuid.uuid4().hex[:12]}"
        self.finalized: list[dict[str, Any]] = []
        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                return None

            def onQueryProgress(self, event: Any) -> None:
                now = time.perf_counter()
                progress = event.progress
                if progress.name != outer.name:
                    return
                outer.finalized.append({"t": now, "epoch": progress.batchId, "input_rows": progress.numInputRows,
                                        "spark_ms": _spark_phases(dict(progress.durationMs))})
                clock.committed(int(progress.numInputRows))

            def onQueryIdle(self, event: Any) -> None:
                return None

            def onQueryTerminated(self, event: Any) -> None:
                return None

        self.listener = Listener()


def executed_plan(df: DataFrame) -> str:
    """The physical plan Spark runs for ``df`` (``*(n)`` marks whole-stage-codegen stages)."""
    return str(df._jdf.queryExecution().executedPlan().toString())


def write_noop(out: DataFrame, _batch_id: int) -> None:
    """The hand-written blackhole: run the micro-batch's plan, keep nothing."""
    out.write.format("noop").mode("overwrite").save()


def run_handwritten(spark: SparkSession, query: Query, workdir: Path, data: TopicData,
                    plans: list[str] | None = None,
                    write: Callable[[DataFrame, int], None] = write_noop) -> dict[str, Any]:
    """What a PySpark user writes: Kafka → ``from_avro`` past the 5-byte header → SQL → ``write``
    (``noop`` unless given; the SQL may read the record's ``_kafka_offset``).

    Same trigger as streamling's (none: the next micro-batch starts when the last one ends) and
    stopped the same way, once every record is committed. ``plans`` (profile runs only) receives
    the first micro-batch's physical plan.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    schema_json = json.dumps(RECORD_SCHEMA)
    flushed: list[dict[str, Any]] = []

    def batch_fn(batch: DataFrame, batch_id: int) -> None:
        t = time.perf_counter()
        # The same output as streamling's: the query's columns plus the CDC op from the dbz.op header,
        # looked up as streamling does (no lambda, so the projection stays in generated code).
        op = F.expr("CASE lower(cast(get(headers, array_position(headers.key, 'dbz.op') - 1).value AS STRING)) "
                    "WHEN 'u' THEN 'u' WHEN 'd' THEN 'd' ELSE 'i' END")
        decoded = (batch.select(from_avro(F.expr("substring(value, 6)"), schema_json).alias("v"), op.alias("_gs_op"),
                                F.col("offset").alias("_kafka_offset"))
                   .select("v.*", "_gs_op", "_kafka_offset"))
        decoded.createOrReplaceTempView("src")
        out = batch.sparkSession.sql(query.sql.replace(" FROM src", ", _gs_op FROM src"))
        if plans is not None and not plans:
            plans.append(executed_plan(out))
        write(out, batch_id)
        now = time.perf_counter()
        flushed.append({"t": now, "epoch": batch_id, "ms": (now - t) * 1000})

    clock = _Clock(data.rows, jvm_pid_of(spark))
    progress = _ProgressListener(clock)
    spark.streams.addListener(progress.listener)
    sq = None
    try:
        reader = spark.readStream.format("kafka").options(**kafka_options(data.topic, workdir))
        writer = (reader.load().writeStream.foreachBatch(batch_fn)
                  .option("checkpointLocation", str(workdir / "checkpoint")).queryName(progress.name))
        sq = writer.start()
        deadline = time.monotonic() + TIMEOUT_SECS
        while not clock.done.wait(0.2):
            if not sq.isActive:
                raise RuntimeError(f"hand-written query ended: {sq.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {clock.seen:,} of {data.rows:,} records after {TIMEOUT_SECS}s")
    finally:
        if sq is not None:
            sq.stop()
        spark.streams.removeListener(progress.listener)
    stopped = time.perf_counter()
    return _summary(clock, data.rows, data, query.output_rows(data.rows), progress.finalized, flushed, stopped)


# --- the scenario -------------------------------------------------------------------------------------


def runs_wanted(opts: Options) -> int:
    """``--runs`` when given on the command line, else Streamling's 5 iterations."""
    given = any(a == "--runs" or a.startswith("--runs=") for a in sys.argv[1:])
    return opts.runs if given else DEFAULT_RUNS


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    runs = runs_wanted(opts)
    reason = ensure_kafka()
    if reason:
        return ScenarioResult(NAME, {"rows": rows}, {}, skipped=reason)
    spark = shared_session()
    data = prepare_topic(rows)
    sides: dict[str, Side] = {}
    for query in QUERIES:
        yaml_text = pipeline_yaml(data.topic, query.sql)

        def streamling_side(yaml_text: str = yaml_text) -> dict[str, Any]:
            with temp_dir("kafka") as workdir:
                return run_streamling(spark, yaml_text, workdir, data)

        def handwritten_side(query: Query = query) -> dict[str, Any]:
            with temp_dir("kafka-hw") as workdir:
                return run_handwritten(spark, query, workdir, data)

        pair = {"streamling": Side(f"{query.name}/streamling"), "handwritten": Side(f"{query.name}/handwritten")}
        log(f"{NAME} {query.name}: {rows:,} records from {data.topic}, {runs} runs")
        interleaved(runs, {"streamling": streamling_side, "handwritten": handwritten_side}, pair, log)
        sides.update({f"{query.name}/{k}": v for k, v in pair.items()})
    params = {"rows": rows, "runs_wanted": runs, "topic": data.topic, "schema_id": data.schema_id,
              "distinct_payloads": DISTINCT_PAYLOADS, "avg_value_bytes": data.value_bytes / rows,
              "avg_body_bytes": data.body_bytes / rows, "produce_s": data.produce_s,
              "max_offsets_per_epoch": MAX_OFFSETS_PER_EPOCH, "queries": {q.name: q.sql for q in QUERIES},
              "spark": session_facts(spark), "baseline": BASELINE}
    result = summarize(rows, sides, params)
    if opts.profile:
        result.params["profile"] = {}
        for query in QUERIES:
            log(f"  profile runs {query.name} (streamling phases timed, plans of both sides)")
            result.params["profile"][query.name] = profile(spark, query, data)
            add_profile_notes(result, query.name, result.params["profile"][query.name])
    print_comparison(result)
    return result


#: where a streamling Kafka epoch spends its Python-side time, on top of the runtime's phases.
KAFKA_PHASES = (
    "streamling.runtime.flow:FlowRunner._process",
    "streamling.sources.kafka:KafkaSource.read_stream",
    "streamling.sources.kafka:KafkaSource.starting_offsets",
    "streamling.sources.kafka:KafkaSource._partitions",
    "streamling.sources.kafka:KafkaSource._group_offsets",
    "streamling.sources.kafka:KafkaSource.decode",
    "streamling.sources.kafka:KafkaSource._schemas",
    "streamling.sources.kafka:KafkaSource.on_finalized",
    "streamling.sinks.blackhole:BlackholeSink.write",
)


def profile(spark: SparkSession, query: Query, data: TopicData) -> dict[str, Any]:
    """One more run per side with the physical plan of its first micro-batch captured.

    The plans show what Spark runs per record (the decode expression, which operators fall out
    of whole-stage codegen); the measured runs already carry the driver's phase timings.
    """
    from streamling.sinks.blackhole import BlackholeSink

    sl_plans: list[str] = []
    original = BlackholeSink.write

    def write(self: BlackholeSink, df: DataFrame, epoch: Any) -> int:
        if not sl_plans:
            sl_plans.append(executed_plan(df))
        return original(self, df, epoch)

    BlackholeSink.write = write  # type: ignore[method-assign]
    try:
        with temp_dir("kafka-profile") as workdir:
            sl_run = run_streamling(spark, pipeline_yaml(data.topic, query.sql), workdir, data)
    finally:
        BlackholeSink.write = original  # type: ignore[method-assign]
    hw_plans: list[str] = []
    with temp_dir("kafka-profile-hw") as workdir:
        hw_run = run_handwritten(spark, query, workdir, data, plans=hw_plans)
    return {"streamling": {"run": {k: v for k, v in sl_run.items() if k != "flushed"},
                           "plan": sl_plans[0] if sl_plans else ""},
            "handwritten": {"run": {k: v for k, v in hw_run.items() if k != "flushed"},
                            "plan": hw_plans[0] if hw_plans else ""}}


def _codegen_stages(plan: str) -> str:
    """How many operators run inside whole-stage codegen (``*(n)``) and how many outside it."""
    lines = [ln.strip(" +-:") for ln in plan.splitlines() if ln.strip()]
    inside = sum(1 for ln in lines if ln.startswith("*("))
    return f"{inside} of {len(lines)} operators in whole-stage codegen"


def add_profile_notes(result: ScenarioResult, name: str, prof: dict[str, Any]) -> None:
    """Whether each side's per-record work stays in whole-stage codegen; the plans stay in the JSON."""
    for side in ("streamling", "handwritten"):
        result.notes.append(f"{name} {side} plan: {_codegen_stages(prof[side]['plan'])}")


FIGURES = (("wall_s", "wall median", "s"), ("input_rps", "input rec/s", "rows/s"),
           ("output_rps", "output rec/s", "rows/s"), ("mb_per_s", "MB/s (value incl. header)", "MB/s"),
           ("cpu_us_per_record", "CPU µs/record", "µs"), ("steady_rps", "input rec/s after 1st epoch", "rows/s"))


def summarize(rows: int, sides: dict[str, Side], params: dict[str, Any]) -> ScenarioResult:
    """Medians per side, the wall minimum, and the streamling / hand-written ratios per query."""
    result = ScenarioResult(NAME, params, sides)
    for query in QUERIES:
        sl, hw = sides[f"{query.name}/streamling"], sides[f"{query.name}/handwritten"]
        for side_name, side in (("streamling", sl), ("hand-written", hw)):
            for key, label, unit in FIGURES:
                result.figures[f"{query.name} {side_name} {label}"] = (side.median(key), unit)
            walls = [float(r["wall_s"]) for r in side.runs]
            result.figures[f"{query.name} {side_name} wall min"] = (min(walls) if walls else float("nan"), "s")
        result.ratios[f"{query.name} input rec/s"] = sl.median("input_rps") / hw.median("input_rps")
        result.ratios[f"{query.name} input rec/s (paired per round)"] = paired_ratio(sl, hw, "input_rps")
        result.ratios[f"{query.name} CPU/record"] = (hw.median("cpu_us_per_record")
                                                     / sl.median("cpu_us_per_record"))
        for side_name, side in (("streamling", sl), ("hand-written", hw)):
            phases = epoch_phases(side)
            result.params.setdefault("epoch_phase_medians_ms", {})[f"{query.name}/{side_name}"] = phases
            result.notes.append(f"{query.name} {side_name} per epoch (median, a run's 1st left out): "
                                + ", ".join(f"{k} {v:.0f} ms" for k, v in phases.items()))
        for label, (calls, total, per_call) in driver_phases(sl).items():
            result.notes.append(f"{query.name} streamling driver phase {label}: {calls:.0f} call(s) per run, "
                                f"{total:.0f} ms per run, {per_call:.0f} ms per call (medians)")
        expected = query.output_rows(rows)
        wrong = sorted({r["output_rows"] for r in sl.runs if r["output_rows"] != expected})
        if wrong:
            result.notes.append(f"{query.name}: streamling wrote {wrong} rows, expected {expected}")
    return result


def epoch_phases(side: Side) -> dict[str, float]:
    """Median ms per epoch of Spark's trigger phases and of the batch function's own parts.

    ``addBatch`` is the whole ``foreachBatch``; inside it streamling reports ``transforms`` (the
    driver building the epoch's plan: decode expression, registry lookup, temp views, SQL
    analysis) and the sink's write (the Spark job). The first epoch of a run also pays for
    query start-up and JIT warm-up, so it is left out when runs have more than one.
    """
    skip = 1 if side.runs and all(len(run["spark_ms"]) > 1 for run in side.runs) else 0
    values: dict[str, list[float]] = {}
    for run in side.runs:
        for phases in run["spark_ms"][skip:]:
            for key in ("triggerExecution", "addBatch", "latestOffset", "queryPlanning", "walCommit",
                        "commitOffsets"):
                if key in phases:
                    values.setdefault(key, []).append(float(phases[key]))
        for epoch in run["flushed"][skip:]:
            for key, ms in (epoch.get("durations_ms") or {"batch function": epoch["ms"]}).items():
                if key != "total":
                    values.setdefault(f"sink {key}" if key not in ("transforms", "batch function") else key,
                                      []).append(float(ms))
    return {k: statistics.median(v) for k, v in values.items() if v}


def driver_phases(side: Side) -> dict[str, tuple[float, float, float]]:
    """Per streamling phase: median calls per run, median ms per run, median ms per call (all runs)."""
    labels = dict.fromkeys(label for run in side.runs for label in run.get("phases", {}))
    out = {}
    for label in labels:
        timed = [run["phases"][label] for run in side.runs if label in run.get("phases", {})]
        out[label] = (statistics.median(t["calls"] for t in timed), statistics.median(t["total_ms"] for t in timed),
                      statistics.median(t["median_ms"] for t in timed))
    return out


def print_comparison(result: ScenarioResult) -> None:
    """Both sides of both queries next to Streamling's published 8-vCPU baseline."""
    head = (f"{'scenario':<20} {'side':<22} {'wall med':>9} {'wall min':>9} {'input rec/s':>12} "
            f"{'output rec/s':>12} {'MB/s':>7} {'CPU µs/rec':>10} {'(JVM/Py)':>11}")
    lines = [f"\n== {NAME}: Kafka (Avro, 1 partition) → SQL → blackhole, {result.params['rows']:,} records, "
             f"medians of {result.params['runs_wanted']} runs", head, "-" * len(head)]
    for query in QUERIES:
        for label, key in (("streamling", "streamling"), ("hand-written PySpark", "handwritten")):
            side = result.sides[f"{query.name}/{key}"]
            walls = [float(r["wall_s"]) for r in side.runs]
            split = f"{side.median('cpu_jvm_us_per_record'):.1f}/{side.median('cpu_python_us_per_record'):.1f}"
            lines.append(f"{query.name:<20} {label:<22} {side.median('wall_s'):>8.2f}s {min(walls):>8.2f}s "
                         f"{side.median('input_rps'):>12,.0f} {side.median('output_rps'):>12,.0f} "
                         f"{side.median('mb_per_s'):>7.2f} {side.median('cpu_us_per_record'):>10.1f} {split:>11}")
        base = BASELINE[query.name]
        lines.append(f"{query.name:<20} {'Streamling (8 vCPU)':<22} {base['wall_median_s']:>8.2f}s "
                     f"{base['wall_min_s']:>8.2f}s {base['input_rps']:>12,.0f} {base['output_rps']:>12,.0f} "
                     f"{base['mb_per_s']:>7.2f} {base['cpu_us_per_record']:>10.1f} {'':>11}")
        ratio = result.ratios[f"{query.name} input rec/s"]
        paired = result.ratios[f"{query.name} input rec/s (paired per round)"]
        cpu = result.ratios[f"{query.name} CPU/record"]
        lines.append(f"{'':<20} ratio streamling/hand-written: input rec/s {ratio:.3f} (paired {paired:.3f}), "
                     f"CPU per record {cpu:.3f}")
    lines.append("Streamling's MB/s counts the 76-byte Avro body only and its µs/record is operator compute time; "
                 "here MB/s includes the 5-byte header and CPU is the whole process tree.")
    print("\n".join(lines))
    sys.stdout.flush()
