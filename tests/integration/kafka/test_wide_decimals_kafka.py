"""Avro decimals wider than Spark's 38 digits, from a real topic to Postgres and to another topic, exactly."""

from __future__ import annotations

import io
import json
import struct
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from harness import Runner
from test_kafka_pipelines import Producer

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.spark]

BIG = Decimal("-123456789012345678901234567890123456789012345678901234567890")  # 60 digits
U256 = Decimal(2**256 - 1)  # 78 digits
WIDE_V1 = {"type": "record", "name": "Wide", "namespace": "chain", "doc": json.dumps({"primaryKeys": ["id"]}),
           "fields": [{"name": "id", "type": "long"},
                      {"name": "big", "type": {"type": "bytes", "logicalType": "decimal", "precision": 60,
                                               "scale": 0}},
                      {"name": "supply", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                                           "precision": 78, "scale": 0}], "default": None},
                      {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20,
                                                 "scale": 4}}]}


def _consume(bootstrap: str, registry_url: str, topic: str, count: int) -> list[dict[str, Any]]:
    import fastavro
    from confluent_kafka import Consumer
    from confluent_kafka.schema_registry import SchemaRegistryClient

    registry = SchemaRegistryClient({"url": registry_url})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            value = msg.value()
            schema = json.loads(registry.get_schema(struct.unpack(">I", value[1:5])[0]).schema_str)
            parsed = fastavro.parse_schema(schema)
            out.append({"schema": schema, "row": fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed, parsed)})
    finally:
        consumer.close()
    return out


def test_wide_avro_decimals_reach_postgres_and_kafka_exactly(
        spark: Any, tmp_path: Path, kafka_environ: dict[str, str], pg_environ: dict[str, str], pg: Any,
        unique_name: str, unique_topic: str, kafka_admin: Any, kafka_bootstrap: str,
        schema_registry_url: str) -> None:
    produce = Producer(kafka_bootstrap, schema_registry_url, unique_topic, kafka_admin)
    produce.avro(WIDE_V1, {"id": 1, "big": BIG, "supply": U256, "price": Decimal("12.3400")})
    produce.avro(WIDE_V1, {"id": 2, "big": Decimal(7), "supply": None, "price": Decimal("-0.0001")})
    produce.flush()
    out_topic = f"{unique_topic}_out"
    runner = Runner(spark, tmp_path, {**kafka_environ, **{k: v for k, v in pg_environ.items()
                                                          if k.startswith("STREAMLING__")}})
    runner.run_until(f"""
        sources:
          chain: {{type: kafka, topic: {unique_topic}}}
        transforms:
          picked: {{type: sql, sql: "SELECT id, big, supply, price FROM chain WHERE big <> '0'"}}
        sinks:
          db: {{type: postgres, from: picked, schema: {unique_name}, table: wide}}
          topic: {{type: kafka, from: picked, topic: {out_topic}}}
    """, lambda r: r.input_rows() >= 2, application_id=unique_name, checkpoint_interval_sec=0.5)
    try:
        types = pg.execute("SELECT column_name, numeric_precision, numeric_scale FROM information_schema.columns "
                           "WHERE table_schema = %s AND table_name = 'wide' ORDER BY 1", (unique_name,)).fetchall()
        assert types == [("big", 60, 0), ("id", 64, 0), ("price", 20, 4), ("supply", 78, 0)]
        got = pg.execute(f"SELECT id, big::text, supply::text, price::text FROM {unique_name}.wide ORDER BY id")
        assert got.fetchall() == [(1, str(BIG), str(U256), "12.3400"), (2, "7", None, "-0.0001")]

        messages = _consume(kafka_bootstrap, schema_registry_url, out_topic, 2)
        fields = {f["name"]: f["type"] for f in messages[0]["schema"]["fields"]}
        assert fields["big"] == ["null", {"type": "bytes", "logicalType": "decimal", "precision": 60, "scale": 0}]
        assert fields["supply"] == ["null", {"type": "bytes", "logicalType": "decimal", "precision": 78, "scale": 0}]
        rows = sorted((m["row"] for m in messages), key=lambda r: r["id"])
        assert rows == [{"id": 1, "big": BIG, "supply": U256, "price": Decimal("12.3400")},
                        {"id": 2, "big": Decimal(7), "supply": None, "price": Decimal("-0.0001")}]
    finally:
        kafka_admin.delete_topics([out_topic], operation_timeout=10)


def test_wide_json_numbers_are_read_from_the_payload_text_exactly(
        spark: Any, tmp_path: Path, kafka_environ: dict[str, str], pg_environ: dict[str, str], pg: Any,
        unique_name: str, unique_topic: str, kafka_admin: Any, kafka_bootstrap: str,
        schema_registry_url: str) -> None:
    frac = "1234567890123456789012345678901234567890.1234"  # Spark's JSON reader alone gives 1.2345…E39
    produce = Producer(kafka_bootstrap, schema_registry_url, unique_topic, kafka_admin)
    produce.raw(f'{{"id": 1, "big": {BIG}, "frac": {frac}}}'.encode(), key="1")
    produce.raw(b'{"id": 2, "big": "7", "frac": 0.5}', key="2")
    produce.flush()
    runner = Runner(spark, tmp_path, {**kafka_environ, **{k: v for k, v in pg_environ.items()
                                                          if k.startswith("STREAMLING__")}})
    runner.run_until(f"""
        sources:
          chain:
            type: kafka
            topic: {unique_topic}
            data_format: json
            primary_key: id
            schema: {{id: int64, big: 'decimal256(60,0)', frac: 'decimal256(50,4)'}}
        sinks:
          db: {{type: postgres, from: chain, schema: {unique_name}, table: wide}}
    """, lambda r: r.input_rows() >= 2, application_id=unique_name, checkpoint_interval_sec=0.5)
    got = pg.execute(f"SELECT id, big::text, frac::text FROM {unique_name}.wide ORDER BY id").fetchall()
    assert got == [(1, str(BIG), frac), (2, "7", "0.5000")]
