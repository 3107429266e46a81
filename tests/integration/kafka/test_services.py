"""The Kafka broker and the schema registry started by fixtures/services/up work together the way
streamling uses them: Avro values in Confluent's wire format, schemas registered per subject."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

pytestmark = pytest.mark.kafka

TRADE_SCHEMA = {
    "type": "record",
    "name": "Trade",
    "namespace": "dev.streamling.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "symbol", "type": "string"},
        {"name": "price", "type": "double"},
    ],
}


def test_avro_round_trip_through_broker_and_registry(
    kafka_bootstrap: str, schema_registry_url: str, kafka_admin: Any, unique_topic: str
) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import NewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    kafka_admin.create_topics([NewTopic(unique_topic, num_partitions=2, replication_factor=1)])[unique_topic].result(
        timeout=15)
    assert unique_topic in kafka_admin.list_topics(topic=unique_topic, timeout=10).topics

    registry = SchemaRegistryClient({"url": schema_registry_url})
    ctx = SerializationContext(unique_topic, MessageField.VALUE)
    serialize = AvroSerializer(registry, json.dumps(TRADE_SCHEMA))
    rows = [{"id": i, "symbol": f"S{i}", "price": i * 1.25} for i in range(10)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    encoded = [serialize(row, ctx) for row in rows]
    for row, value in zip(rows, encoded, strict=True):
        producer.produce(unique_topic, key=str(row["id"]).encode(), value=value)
    assert producer.flush(15) == 0

    # Confluent wire format: magic byte 0, then the 4-byte big-endian schema id, then Avro binary.
    schema_ids = {int.from_bytes(value[1:5], "big") for value in encoded}
    assert all(value[0] == 0 for value in encoded)
    assert len(schema_ids) == 1
    schema_id = schema_ids.pop()

    # A consumer group (not assign()): the group coordinator and offsets topic must work too.
    consumer = Consumer({
        "bootstrap.servers": kafka_bootstrap,
        "group.id": f"g_{unique_topic}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    deserialize = AvroDeserializer(registry)
    received: list[dict[str, Any]] = []
    try:
        consumer.subscribe([unique_topic])
        deadline = time.monotonic() + 30
        while len(received) < len(rows) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received.append(deserialize(msg.value(), ctx))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert sorted(received, key=lambda r: r["id"]) == rows

    subject = f"{unique_topic}-value"
    assert subject in registry.get_subjects()
    assert registry.get_versions(subject) == [1]
    latest = registry.get_latest_version(subject)
    assert latest.schema_id == schema_id
    assert latest.schema.schema_str is not None
    assert json.loads(latest.schema.schema_str)["name"] == "Trade"
    # The same facts over the plain Confluent REST API that other clients (and Spark jobs) use.
    with urllib.request.urlopen(f"{schema_registry_url}/subjects/{subject}/versions/1", timeout=10) as resp:
        body = json.load(resp)
    assert (body["subject"], body["version"], body["id"]) == (subject, 1, schema_id)
