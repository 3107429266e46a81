"""``kafka`` sink: rows to a topic in the Confluent Avro wire format (or JSON), via Spark's writer.

The Spark schema (without ``_gs_op``) becomes an Avro record registered under ``<topic>-value``;
each value is ``0x00 + schema id + to_avro(row)``. The key is the primary key (its value as text,
or a JSON object for a composite key) and the ``dbz.op`` header carries the operation (insert →
``c``, ``u``, ``d``), so a Streamling or Debezium consumer reads changes back. Delivery is
at-least-once: a replayed epoch may publish its messages again.

Producer batching: ``batch_flush_interval`` is the producer's ``linger.ms``, as in Streamling.
``batch_size`` is a message count there (librdkafka's ``batch.num.messages``); Spark writes with
the Java producer, whose only batch limit is ``batch.size`` in *bytes*, so passing the count
would cap every batch at a few messages. It is reported as having no effect instead. Streamling
flushes its producer at the end of every batch; Spark's writer flushes at the end of each write
task, so an epoch's messages are all acknowledged before the epoch commits either way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from streamling.errors import StreamlingError
from streamling.kafka.avro import avro_row, record_schema
from streamling.kafka.registry import Registry
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink
from streamling.sinks.common import last_row_per_key, op_column
from streamling.spec.options import FromNodeOptions, OptionProblem
from streamling.util import parse_duration_secs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamling.config import Settings

log = logging.getLogger(__name__)


class KafkaSinkOptions(FromNodeOptions):
    primary_key_required: ClassVar[str | None] = ("set primary_key on the sink or on a node upstream; it becomes "
                                                  "the message key")

    type: Literal["kafka"] = "kafka"
    topic: str
    data_format: Literal["avro", "json"] = "avro"
    topic_partitions: int = Field(default=1, ge=1)
    compression: Literal["none", "gzip", "lz4", "zstd", "snappy"] = "lz4"
    message_max_bytes: int | None = Field(default=None, ge=1)
    deduplicate: bool = True

    def option_problems(self) -> list[OptionProblem]:
        """``batch_flush_interval`` must read as a duration: it becomes the producer's ``linger.ms``."""
        if self.batch_flush_interval is not None:
            try:
                parse_duration_secs(self.batch_flush_interval)
            except ValueError as exc:
                return [OptionProblem("batch_flush_interval", f"batch_flush_interval: {exc}")]
        return []


class KafkaSink(Sink[KafkaSinkOptions]):
    #: Spark's writer produces from the executors: ``parallelism`` sets how many write at once, rows
    #: of a key on one writer (Streamling: producers, chosen by key hash); ``batch_flush_interval``
    #: becomes the producer's ``linger.ms``
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"parallelism", "batch_flush_interval"})

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.conn = ctx.settings.kafka_sink
        self.topic = self.options.topic
        self.subject = f"{self.topic}-value"
        self._schema_id: int | None = None
        self._avro_text: str | None = None
        self._columns: list[str] = []

    def common_key_reason(self, key: str) -> str:
        if key == "batch_size":
            return ("a message count per producer batch in Streamling (librdkafka's batch.num.messages); Spark's "
                    "Kafka writer uses the Java producer, which has no count limit (its batch.size is in bytes). "
                    "Each epoch is still flushed before it commits, and batch_flush_interval (linger.ms) applies")
        return super().common_key_reason(key)

    @classmethod
    def ineffective_settings(cls, settings: Settings) -> list[str]:
        """The consumer keys ``kafka_sink`` accepts (Streamling shares one connection model) and never reads."""
        return [f"kafka_sink.{key} has no effect: it is a consumer setting and the sink only produces "
                "(Streamling ignores it there too)"
                for key in ("consumer_group_id", "lag_report_interval_ms")
                if getattr(settings.kafka_sink, key) is not None]

    primary_key_reason = "it becomes the message key"

    def missing_key_error(self) -> StreamlingError:
        # Streamling's own words, without the node prefix: scripts grep for them
        return StreamlingError(f"kafka sink '{self.name}' requires a primary key", code="primary_key_required",
                               hint=KafkaSinkOptions.primary_key_required)

    @property
    def key(self) -> list[str]:
        # Validation already refuses a sink no key can reach; this catches an Avro source whose
        # registered record names no primaryKeys (only known once the registry is read).
        if not self.ctx.primary_key:
            raise self.missing_key_error()
        return list(self.ctx.primary_key)

    def producer_options(self) -> dict[str, str]:
        """The sink's keys as Java producer settings for Spark's Kafka writer."""
        opts: dict[str, str] = {"kafka.compression.type": self.options.compression}
        if self.options.message_max_bytes:
            opts["kafka.max.request.size"] = str(self.options.message_max_bytes)
        if self.options.batch_flush_interval is not None:
            linger_ms = round(parse_duration_secs(self.options.batch_flush_interval) * 1000)
            opts["kafka.linger.ms"] = str(linger_ms)
        return opts

    def open(self, spark: SparkSession) -> None:
        self.key  # noqa: B018 - fail before the first epoch when no key resolves
        self._create_topic()
        schema = self.ctx.input_schema
        if schema is not None:
            self._prepare(schema)

    def _create_topic(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.conn.librdkafka())
        meta = admin.list_topics(timeout=15)
        if self.topic in meta.topics:
            log.info("kafka sink '%s': topic '%s' already exists, skipping creation", self.name, self.topic)
            return
        futures = admin.create_topics([NewTopic(self.topic, num_partitions=self.options.topic_partitions)])
        try:
            futures[self.topic].result(timeout=30)
            log.info("kafka sink '%s': created topic '%s' with %d partition(s)", self.name, self.topic,
                     self.options.topic_partitions)
        except Exception as exc:  # noqa: BLE001 - a concurrent creation is fine
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise self.ctx.error(f"cannot create topic '{self.topic}' on {self.conn.brokers}: {exc}",
                                     retriable=True, hint="check the brokers and the ACLs",
                                     code="topic_create_failed") from exc

    def _prepare(self, schema: StructType) -> None:
        from pyspark.sql.types import StructType as ST

        data = ST([f for f in schema.fields if f.name != GS_OP])
        self._columns = [f.name for f in data.fields]
        if self.options.data_format == "avro":
            avro = record_schema(data, name=self.topic.replace(".", "_").replace("-", "_"), namespace="streamling",
                                 doc=None)
            import json

            self._avro_text = json.dumps(avro)
            registry = Registry(self.conn, self.name, "kafka sink")
            self._schema_id = registry.register(self.subject, avro)

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import to_avro

        if self._schema_id is None and self.options.data_format == "avro" or not self._columns:
            self._prepare(df.schema)
        key = self.key
        staged = df.withColumn("__op", op_column(df))
        if self.options.deduplicate:
            staged = last_row_per_key(staged, key)
        row = F.struct(*[F.col(f"`{c}`") for c in self._columns])
        if self.options.data_format == "avro":
            header = F.unhex(F.lit(f"00{self._schema_id:08x}"))
            value = F.concat(header, to_avro(avro_row(staged.schema, self._columns), self._avro_text or ""))
        else:
            value = F.to_json(row).cast("binary")
        key_col = (F.col(f"`{key[0]}`").cast("string") if len(key) == 1
                   else F.to_json(F.struct(*[F.col(f"`{k}`") for k in key])))
        dbz = F.when(F.col("__op") == "d", "d").when(F.col("__op") == "u", "u").otherwise("c")
        headers = F.array(F.struct(F.lit("dbz.op").alias("key"), dbz.cast("binary").alias("value")))
        out = staged.select(key_col.cast("binary").alias("key"), value.alias("value"), headers.alias("headers"))
        out = out.persist()
        try:
            rows = out.count()
            (out.write.format("kafka").options(**self.conn.spark_options()).option("topic", self.topic)
             .option("includeHeaders", "true").options(**self.producer_options()).save())
        finally:
            out.unpersist()
        return rows
