"""Kafka source and sink on a real broker and a real schema registry (Apicurio), end to end."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Runner

from streamling.errors import StreamlingError, ValidationError
from streamling.runtime import events as ev

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "shop", "doc": json.dumps({"primaryKeys": ["id"]}),
            "fields": [{"name": "id", "type": "int"}, {"name": "amount", "type": "float"},
                       {"name": "note", "type": "string"}]}
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "shop", "doc": json.dumps({"primaryKeys": ["id"]}),
            "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
                       {"name": "status", "type": "string", "default": "new"}]}


class Producer:
    """Produces Confluent-Avro (or raw) messages the way a real application does."""

    def __init__(self, bootstrap: str, registry_url: str, topic: str, admin: Any, partitions: int = 1) -> None:
        from confluent_kafka import Producer as KafkaProducer
        from confluent_kafka.admin import NewTopic
        from confluent_kafka.schema_registry import SchemaRegistryClient

        admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(timeout=30)
        self.topic = topic
        self.registry = SchemaRegistryClient({"url": registry_url})
        self.producer = KafkaProducer({"bootstrap.servers": bootstrap})
        self._serializers: dict[str, Any] = {}

    def avro(self, schema: dict[str, Any], record: dict[str, Any], op: str | None = "c", partition: int = 0) -> None:
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        key = json.dumps(schema)
        if key not in self._serializers:
            self._serializers[key] = AvroSerializer(self.registry, key)
        value = self._serializers[key](record, SerializationContext(self.topic, MessageField.VALUE))
        self.raw(value, op, partition, key=str(record.get("id")))

    def raw(self, value: bytes | None, op: str | None = "c", partition: int = 0, key: str | None = None) -> None:
        headers = [("dbz.op", op.encode())] if op else []
        self.producer.produce(self.topic, key=key, value=value, headers=headers, partition=partition)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0


@pytest.fixture
def kafka_runner(spark: Any, tmp_path: Path, kafka_environ: dict[str, str]) -> Runner:
    return Runner(spark, tmp_path, kafka_environ)


@pytest.fixture
def produce(kafka_bootstrap: str, schema_registry_url: str, unique_topic: str, kafka_admin: Any) -> Producer:
    return Producer(kafka_bootstrap, schema_registry_url, unique_topic, kafka_admin, partitions=2)


def _read_rows(runner: Runner) -> list[dict[str, Any]]:
    return [row for e in runner.of_type(ev.RowsSampled) if e.node == "out_rows" for row in e.rows]


def test_schema_evolution_ops_and_key_from_the_record_doc(kafka_runner: Runner, produce: Producer,
                                                          tmp_path: Path, spark: Any) -> None:
    produce.avro(ORDER_V1, {"id": 1, "amount": 1.5, "note": "first"}, op="c", partition=0)
    produce.avro(ORDER_V1, {"id": 2, "amount": 2.5, "note": "second"}, op="r", partition=1)
    produce.avro(ORDER_V2, {"id": 1, "amount": 10.25, "status": "paid"}, op="u", partition=0)
    produce.avro(ORDER_V2, {"id": 2, "amount": 2.5, "status": "gone"}, op="d", partition=1)
    produce.avro(ORDER_V2, {"id": 3, "amount": 3.0, "status": "new"}, op=None, partition=0)
    produce.flush()
    out = tmp_path / "lake"
    run = kafka_runner.run_until(f"""
        sources:
          orders: {{type: kafka, topic: {produce.topic}}}
        transforms:
          shaped: {{type: sql, sql: "SELECT id, amount, status FROM orders WHERE amount > 0"}}
        sinks:
          lake: {{type: delta, from: shaped, path: "{out}"}}
    """, lambda r: r.input_rows() >= 5, checkpoint_interval_sec=0.5)
    assert run.plan.keys["lake"] == ["id"]  # inferred from the Avro doc {"primaryKeys": ["id"]}
    schema = run.plan.schemas["orders"].simpleString()
    assert schema == "struct<id:bigint,amount:double,status:string,_gs_op:string>"  # the latest (reader) schema
    rows = sorted((r.asDict() for r in spark.read.format("delta").load(str(out)).collect()), key=lambda r: r["id"])
    assert rows == [{"id": 1, "amount": 10.25, "status": "paid"}, {"id": 3, "amount": 3.0, "status": "new"}]


def test_ops_from_dbz_header_reach_postgres_and_restart_loses_nothing(
        kafka_runner: Runner, produce: Producer, pg: Any, unique_name: str, pg_environ: dict[str, str],
        kafka_admin: Any) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    kafka_runner.environ.update({k: v for k, v in pg_environ.items() if k.startswith("STREAMLING__")})
    pipeline = f"""
        sources:
          orders: {{type: kafka, topic: {produce.topic}, primary_key: id}}
        transforms:
          paid: {{type: sql, sql: "SELECT id, amount, status FROM orders WHERE status != 'ignored'"}}
        sinks:
          db: {{type: postgres, from: paid, schema: {unique_name}, table: orders}}
    """
    for i in range(20):
        produce.avro(ORDER_V2, {"id": i, "amount": float(i), "status": "new"}, op="c", partition=i % 2)
    produce.avro(ORDER_V2, {"id": 99, "amount": 1.0, "status": "ignored"}, op="c")
    produce.flush()
    kafka_runner.run_until(pipeline, lambda r: r.input_rows() >= 21, application_id=unique_name,
                           checkpoint_interval_sec=0.5, state_backend={"backend_type": "Postgres"})
    assert pg.execute(f'SELECT count(*) FROM "{unique_name}".orders').fetchone()[0] == 20

    # While the pipeline is down: updates, deletes and new rows arrive.
    for i in range(5):
        produce.avro(ORDER_V2, {"id": i, "amount": 100.0 + i, "status": "paid"}, op="u", partition=i % 2)
    for i in range(5, 10):
        produce.avro(ORDER_V2, {"id": i, "amount": 0.0, "status": "x"}, op="d", partition=i % 2)
    for i in range(20, 25):
        produce.avro(ORDER_V2, {"id": i, "amount": float(i), "status": "new"}, op="c", partition=i % 2)
    produce.flush()
    kafka_runner.events.clear()
    kafka_runner.run_until(pipeline, lambda r: r.input_rows() >= 15, application_id=unique_name,
                           checkpoint_interval_sec=0.5, state_backend={"backend_type": "Postgres"})
    assert kafka_runner.input_rows() == 15  # resumed after the first run's offsets: no replay, no gap
    rows = pg.execute(f'SELECT id, amount, status FROM "{unique_name}".orders ORDER BY id').fetchall()
    assert [r[0] for r in rows] == [*range(5), *range(10, 25)]
    assert rows[0] == (0, 100.0, "paid") and rows[5] == (10, 10.0, "new")

    # Offsets are visible to standard Kafka tooling (consumer group) and in the state backend.
    group = f"{unique_name}.orders"
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(produce.topic, p) for p in (0, 1)])
    committed = kafka_admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    assert sum(tp.offset for tp in committed.topic_partitions) == 36
    state = pg.execute("SELECT key, data FROM streamling.state WHERE namespace = %s ORDER BY key",
                       (unique_name,)).fetchall()
    # Partition 0 got ids 0,2,…,18 and 99, then 3 updates, 2 deletes, 3 inserts; partition 1 the rest.
    assert [(k, d["offset"]) for k, d in state] == [(f"orders:{produce.topic}:0", 19),
                                                  (f"orders:{produce.topic}:1", 17)]


def test_json_format_and_start_by_timestamp(kafka_runner: Runner, produce: Producer, tmp_path: Path,
                                            spark: Any) -> None:
    for i in range(3):
        produce.raw(json.dumps({"id": i, "price": "1.50", "ok": True}).encode(), key=str(i))
    produce.flush()
    time.sleep(1.0)
    start_ms = int(time.time() * 1000)
    time.sleep(0.2)
    for i in range(3, 6):
        produce.raw(json.dumps({"id": i, "price": f"{i}.25", "ok": i % 2 == 0, "extra": "ignored"}).encode(),
                    op="u", key=str(i))
    produce.flush()
    out = tmp_path / "lake"
    kafka_runner.run_until(f"""
        sources:
          events:
            type: kafka
            topic: {produce.topic}
            data_format: json
            starting_offsets: "{start_ms}"
            primary_key: id
            schema: {{id: int64, price: "decimal128(10,2)", ok: boolean}}
        sinks:
          lake: {{type: delta, from: events, path: "{out}"}}
    """, lambda r: r.input_rows() >= 3, checkpoint_interval_sec=0.5)
    rows = sorted((r.asDict() for r in spark.read.format("delta").load(str(out)).collect()), key=lambda r: r["id"])
    assert [(r["id"], str(r["price"]), r["ok"]) for r in rows] == [(3, "3.25", False), (4, "4.25", True),
                                                                (5, "5.25", False)]


def test_kafka_to_kafka_is_readable_by_a_plain_confluent_consumer(
        kafka_runner: Runner, produce: Producer, kafka_bootstrap: str, schema_registry_url: str,
        kafka_admin: Any) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    out_topic = f"{produce.topic}_out"
    produce.avro(ORDER_V2, {"id": 1, "amount": 5.0, "status": "new"}, op="c")
    produce.avro(ORDER_V2, {"id": 2, "amount": 7.0, "status": "new"}, op="c")
    produce.avro(ORDER_V2, {"id": 2, "amount": 8.0, "status": "paid"}, op="u")
    produce.avro(ORDER_V2, {"id": 3, "amount": 9.0, "status": "x"}, op="d")
    produce.flush()
    try:
        kafka_runner.run_until(f"""
            sources:
              orders: {{type: kafka, topic: {produce.topic}}}
            transforms:
              doubled: {{type: sql, sql: "SELECT id, amount * 2 AS amount, upper(status) AS status FROM orders"}}
            sinks:
              out: {{type: kafka, from: doubled, topic: {out_topic}, topic_partitions: 3, compression: zstd,
                     batch_size: 2, batch_flush_interval: 5ms}}
        """, lambda r: r.input_rows() >= 4, checkpoint_interval_sec=0.5)
        assert len(kafka_admin.list_topics(out_topic, timeout=10).topics[out_topic].partitions) == 3
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"reader-{out_topic}",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([out_topic])
        decode = AvroDeserializer(SchemaRegistryClient({"url": schema_registry_url}))
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            value = decode(msg.value(), SerializationContext(out_topic, MessageField.VALUE))
            got.append((msg.key().decode(), dict(msg.headers())["dbz.op"].decode(), value))
        consumer.close()
        assert sorted(got, key=lambda g: g[0]) == [
            ("1", "c", {"id": 1, "amount": 10.0, "status": "NEW"}),
            ("2", "u", {"id": 2, "amount": 16.0, "status": "PAID"}),  # last row per key within the epoch
            ("3", "d", {"id": 3, "amount": 18.0, "status": "X"}),
        ]
    finally:
        kafka_admin.delete_topics([out_topic])


def test_kafka_sink_without_a_key_is_refused_once_the_registry_is_read(kafka_runner: Runner,
                                                                       produce: Producer) -> None:
    # The static checks let an Avro source through (its registered doc may name primaryKeys); this one
    # does not, which the schema check (--validate, and every start) finds before any epoch.
    produce.avro({"type": "record", "name": "V", "fields": [{"name": "v", "type": "int"}]}, {"v": 1})
    produce.flush()
    with pytest.raises(ValidationError) as info:
        kafka_runner.run_until(f"""
            sources:
              s: {{type: kafka, topic: {produce.topic}}}
            sinks:
              out: {{type: kafka, from: s, topic: {produce.topic}_never}}
        """, lambda r: False, timeout_secs=30)
    assert [p.headline() for p in info.value.problems] == [
        "kafka sink 'out' requires a primary key — set primary_key on the sink or on a node upstream; it becomes "
        "the message key"]
    assert not kafka_runner.of_type(ev.EpochPlanned)


@pytest.mark.parametrize("poison, expected", [
    (b"\x01\x00\x00\x00\x01garbage", "not in the Confluent Avro wire format (bad magic byte or too short) at"),
    (None, "tombstone (null value) at"),
    (b"\x00" + struct.pack(">I", 987654) + b"\x02", "unknown schema id 987654 (not registered under subject"),
    ("truncated", "cannot decode the Avro value with schema id"),
])
def test_poison_records_stop_the_flow_with_their_position(kafka_runner: Runner, produce: Producer,
                                                          poison: Any, expected: str) -> None:
    produce.avro(ORDER_V2, {"id": 1, "amount": 1.0, "status": "ok"})
    produce.flush()
    if poison == "truncated":
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        good = AvroSerializer(produce.registry, json.dumps(ORDER_V2))(
            {"id": 2, "amount": 2.0, "status": "a long enough status"},
            SerializationContext(produce.topic, MessageField.VALUE))
        poison = good[:9]
    produce.raw(poison)
    produce.avro(ORDER_V2, {"id": 3, "amount": 3.0, "status": "after"})
    produce.flush()
    with pytest.raises(StreamlingError) as info:
        kafka_runner.run_until(f"""
            sources:
              orders: {{type: kafka, topic: {produce.topic}}}
            sinks:
              out: {{type: blackhole, from: orders}}
        """, lambda r: False, timeout_secs=120)
    message = info.value.headline()
    assert message.startswith("kafka source 'orders': poison record: "), message
    assert expected in message
    assert f"topic {produce.topic} partition 0 offset 1" in message
    assert "nothing after this record was processed" in message
    assert not kafka_runner.of_type(ev.EpochFinalized)  # the epoch holding the poison never committed


DEBEZIUM_ROOT = ["null", {"type": "record", "name": "Value", "namespace": "dbserver.inventory.customers",
                          "fields": [{"name": "id", "type": "long"}, {"name": "email", "type": ["null", "string"],
                                                                       "default": None}]}]


def test_debezium_union_root_metadata_quoted_filter_and_json_sink(
        kafka_runner: Runner, produce: Producer, kafka_bootstrap: str, kafka_admin: Any) -> None:
    from confluent_kafka import Consumer

    produce.avro(DEBEZIUM_ROOT, {"id": 1, "email": "a@x.io"}, op="r", partition=0)
    produce.avro(DEBEZIUM_ROOT, {"id": 2, "email": "it's; -- not a comment"}, op="c", partition=1)
    produce.avro(DEBEZIUM_ROOT, {"id": 3, "email": None}, op="u", partition=0)
    produce.flush()
    out_topic = f"{produce.topic}_json"
    try:
        run = kafka_runner.run_until(f"""
            sources:
              customers:
                type: kafka
                topic: {produce.topic}
                include_metadata: true
                primary_key: id
                filter: "email IS NULL OR email <> 'it''s; -- not a comment'"
            sinks:
              out: {{type: kafka, from: customers, topic: {out_topic}, data_format: json}}
        """, lambda r: r.input_rows() >= 3, checkpoint_interval_sec=0.5)
        columns = run.plan.schemas["customers"].fieldNames()
        assert columns == ["id", "email", "_gs_op", "_kafka_topic", "_kafka_partition", "_kafka_offset",
                           "_kafka_timestamp", "_kafka_key"]
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"reader-{out_topic}",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([out_topic])
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(got) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and not msg.error():
                got.append({**json.loads(msg.value()), "op": dict(msg.headers())["dbz.op"].decode()})
        consumer.close()
        got.sort(key=lambda g: g["id"])
        assert [(g["id"], g.get("email"), g["op"], g["_kafka_partition"], g["_kafka_key"]) for g in got] == [
            (1, "a@x.io", "c", 0, "1"), (3, None, "u", 0, "3")]  # the quoted literal filtered row 2 out
    finally:
        kafka_admin.delete_topics([out_topic])


def test_consumer_lag_is_reported_per_partition_and_falls_to_zero(kafka_runner: Runner, produce: Producer) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    for i in range(2000):
        produce.raw(json.dumps({"id": i}).encode(), key=str(i), partition=i % 2)
    produce.flush()
    kafka_runner.with_telemetry = True

    def caught_up(r: Runner) -> bool:
        lags = [e.lag.get("events") for e in r.of_type(ev.EpochFinalized) if e.lag.get("events")]
        return r.input_rows() >= 2000 and bool(lags) and not any(lags[-1].values())

    try:
        kafka_runner.run_until(f"""
            sources:
              events:
                type: kafka
                topic: {produce.topic}
                data_format: json
                starting_offsets: earliest
                primary_key: id
                schema: {{id: int64}}
            sinks:
              out: {{type: blackhole, from: events}}
        """, caught_up, checkpoint_interval_sec=0.5, admin_api_port=0, kafka_source={"max_offsets_per_epoch": 400})
        text = kafka_runner.telemetry.metrics.prometheus_text().decode()
    finally:
        kafka_runner.close_telemetry()
    lags = [e.lag["events"] for e in kafka_runner.of_type(ev.EpochFinalized) if e.lag.get("events")]
    assert sum(lags[0].values()) > 0  # 400 of 2,000 read in the first epoch: the rest is lag
    assert set(lags[-1]) == {f"{produce.topic}/0", f"{produce.topic}/1"}
    gauge = {(s.labels["topic"], s.labels["partition"]): s.value for f in text_string_to_metric_families(text)
             for s in f.samples if s.name == "streamling_kafka_consumer_messages_lag"}
    assert gauge == {(produce.topic, "0"): 0, (produce.topic, "1"): 0}
