"""Kafka behaviour that must match Streamling: writer-schema ordering, the start position on a fresh
state backend, and what a bad source ``filter`` reports. Real broker and registry; one topic each."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import Runner
from test_kafka_pipelines import Producer

from streamling.errors import StreamlingError, ValidationError
from streamling.runtime import events as ev
from streamling.runtime.pipeline import PipelineRun

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORD_V1 = {"type": "record", "name": "TestRecord", "fields": [
    {"name": "id", "type": "long"}, {"name": "data", "type": "string"}]}
RECORD_V2 = {"type": "record", "name": "TestRecord", "fields": [
    {"name": "id", "type": "long"}, {"name": "data", "type": "string"},
    {"name": "version", "type": "int", "default": 1}]}


@pytest.fixture
def kafka_runner(spark: Any, tmp_path: Path, kafka_environ: dict[str, str]) -> Runner:
    return Runner(spark, tmp_path, kafka_environ)


@pytest.fixture
def produce(kafka_bootstrap: str, schema_registry_url: str, unique_topic: str, kafka_admin: Any) -> Producer:
    return Producer(kafka_bootstrap, schema_registry_url, unique_topic, kafka_admin, partitions=1)


def _wait(run: PipelineRun, done: Callable[[], bool], timeout_secs: float = 90) -> None:
    """Until ``done()`` holds; a flow failure is raised as the pipeline reports it."""
    deadline = time.monotonic() + timeout_secs
    while not done():
        failed = [r.failure for r in run.runners if r.failure is not None]
        if failed:
            raise failed[0]
        assert time.monotonic() < deadline, "the pipeline did not get there in time"
        time.sleep(0.2)


def _register(produce: Producer, schema: dict[str, Any]) -> int:
    from confluent_kafka.schema_registry import Schema

    return int(produce.registry.register_schema(f"{produce.topic}-value", Schema(json.dumps(schema), "AVRO")))


def _start_then_evolve(runner: Runner, produce: Producer, pipeline: str, **overrides: Any) -> tuple[PipelineRun, int]:
    """Start on v1 (the reader), let one epoch commit, then register v2 and produce one v2 record."""
    produce.avro(RECORD_V1, {"id": 1, "data": "v1-baseline"})
    produce.flush()
    run = runner.pipeline(pipeline, checkpoint_interval_sec=0.5, **overrides)
    run.start()
    try:
        _wait(run, lambda: runner.input_rows() >= 1)
        v2 = _register(produce, RECORD_V2)
        produce.avro(RECORD_V2, {"id": 2, "data": "v2-after-startup", "version": 99})
        produce.flush()
    except BaseException:
        run.stop("test failed")
        raise
    return run, v2


def test_a_writer_schema_newer_than_the_reader_fails_fast_naming_its_id(kafka_runner: Runner,
                                                                       produce: Producer) -> None:
    run, v2 = _start_then_evolve(kafka_runner, produce, f"""
        sources:
          src: {{type: kafka, topic: {produce.topic}, primary_key: id}}
        sinks:
          out: {{type: blackhole, from: src}}
    """)
    try:
        with pytest.raises(StreamlingError) as info:
            _wait(run, lambda: False, timeout_secs=60)
    finally:
        run.stop("test finished")
    message = info.value.headline()
    assert message.startswith(f"kafka source 'src': schema resolution failed: writer schema id {v2} "), message
    assert f"topic {produce.topic} partition 0 offset 1" in message
    assert "validate_writer_schema_ordering: false" in message
    assert kafka_runner.input_rows() == 1  # the epoch holding the v2 record never committed


@pytest.mark.parametrize("option", ["validate_writer_schema_ordering: false",
                                    "skip_schema_resolution_for_reader_schema_ids: [{reader}]"])
def test_with_ordering_validation_off_the_new_field_is_dropped_and_rows_keep_flowing(
        kafka_runner: Runner, produce: Producer, pg: Any, unique_name: str, pg_environ: dict[str, str],
        option: str) -> None:
    kafka_runner.environ.update({k: v for k, v in pg_environ.items() if k.startswith("STREAMLING__POSTGRES_SINK__")})
    option = option.format(reader=_register(produce, RECORD_V1))
    run, _ = _start_then_evolve(kafka_runner, produce, f"""
        sources:
          src:
            type: kafka
            topic: {produce.topic}
            primary_key: id
            {option}
        sinks:
          db: {{type: postgres, from: src, schema: {unique_name}, table: records}}
    """)
    try:
        _wait(run, lambda: kafka_runner.input_rows() >= 2)
        produce.avro(RECORD_V1, {"id": 3, "data": "v1-again"})  # and rows keep flowing after it
        produce.flush()
        _wait(run, lambda: kafka_runner.input_rows() >= 3)
    finally:
        run.stop("test finished")
    assert run.plan.schemas["src"].fieldNames() == ["id", "data", "_gs_op"]  # the reader stays v1
    rows = pg.execute(f'SELECT * FROM "{unique_name}".records ORDER BY id').fetchall()
    assert rows == [(1, "v1-baseline"), (2, "v2-after-startup"), (3, "v1-again")]


def test_a_fresh_state_backend_starts_at_starting_offsets_not_at_the_groups_commits(
        kafka_runner: Runner, produce: Producer, kafka_bootstrap: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    for i in range(4):
        produce.avro(RECORD_V1, {"id": i, "data": f"row {i}"})
    produce.flush()
    # Someone (an earlier deployment, a tool) committed the group's offsets at the end of the topic.
    group = "test_app.src"  # <application_id>.<node>, the group the source commits to
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(produce.topic, 0, 4)], asynchronous=False)
    consumer.close()
    kafka_runner.run_until(f"""
        sources:
          src: {{type: kafka, topic: {produce.topic}, primary_key: id, starting_offsets: earliest}}
        sinks:
          out: {{type: blackhole, from: src}}
    """, lambda r: r.input_rows() >= 4, timeout_secs=60, checkpoint_interval_sec=0.5)
    assert kafka_runner.input_rows() == 4  # read from the beginning


def test_a_filter_naming_a_missing_column_names_the_source_and_the_column_once(kafka_runner: Runner,
                                                                               produce: Producer) -> None:
    produce.avro(RECORD_V1, {"id": 1, "data": "x"})
    produce.flush()
    with pytest.raises(ValidationError) as info:
        kafka_runner.run_until(f"""
            sources:
              orders: {{type: kafka, topic: {produce.topic}, primary_key: id, filter: "dta = 'x'"}}
            sinks:
              out: {{type: blackhole, from: orders}}
        """, lambda r: False, timeout_secs=60)
    assert [p.headline() for p in info.value.problems] == [
        "kafka source 'orders': filter fails: column 'dta' does not exist (did you mean 'data'?) — fix 'filter'; "
        "it may use the decoded columns"]
    assert not info.value.problems[0].internal
    assert not kafka_runner.of_type(ev.EpochFinalized)
