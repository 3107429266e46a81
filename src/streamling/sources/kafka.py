"""``kafka`` source: Spark's own Kafka connector, Avro decoded in the JVM by schema id.

Values are in the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro body).
The reader schema is the subject's latest version when the flow starts, and stays so for the
run (the node's columns must not change under its sinks). Each epoch decodes every writer schema
registered under ``<topic>-value`` into it with ``from_avro`` — fields matched by name, defaults
filling added fields, removed fields dropped, int→long and float→double promoted. As in
Streamling, a record written with a *newer* version than the reader fails the flow with a
schema-resolution error naming its writer schema id (``validate_writer_schema_ordering``, on by
default): a restart reads with the newer schema. Turned off, such records are resolved into the
reader schema and their new fields dropped. ``skip_schema_resolution`` (or a reader schema id in
``skip_schema_resolution_for_reader_schema_ids``) reads every body with the reader schema itself.
``_gs_op`` comes from the ``dbz.op`` header. A record that cannot be decoded stops the flow with
its topic, partition and offset: nothing after it is processed or skipped (there is no
dead-letter topic; see the README).

Offsets: Spark's checkpoint is the truth. After each committed epoch the end offsets are
committed to the consumer group (so lag shows in standard tooling) and copied to the state
backend as ``{node}:{topic}:{partition}`` (the next offset to read). On a fresh checkpoint the
start is Streamling's: the state backend's offsets, else ``starting_offsets``. Offsets committed
to the group are never read back, so a fresh state backend starts where the pipeline says.
"""

from __future__ import annotations

import io
import json
import logging
import re
import struct
from typing import TYPE_CHECKING, Any

from streamling.config.sections import KafkaSourceSettings
from streamling.errors import StreamlingError, chain_text, spark_sql_message
from streamling.functions.catalog import register_udfs
from streamling.kafka.avro import (
    WideDecimalError,
    exact_json_decimals,
    primary_keys_from_doc,
    readable_wide_decimals,
    unwrap_root,
    wide_decimal_columns,
)
from streamling.kafka.registry import RegisteredSchema, Registry
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Source
from streamling.spec.sources import KafkaSourceOptions
from streamling.spec.sql import spark_expression
from streamling.spec.types import ColumnType, spark_ddl, wide_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from streamling.config import Settings

log = logging.getLogger(__name__)
POISON = "streamling-poison: "
#: marks a record whose writer schema is newer than the reader (``validate_writer_schema_ordering``)
WRITER_AHEAD = "streamling-writer-ahead: "


class KafkaSource(Source[KafkaSourceOptions]):
    bounded = False
    new_application_note = ("a Kafka source then starts at its starting_offsets, since its state-backend offsets "
                            "are kept per application_id")

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.conn = ctx.settings.kafka_source
        self.topic = self.options.topic
        self.subject = f"{self.topic}-value"
        # Streamling gives each source its own group: ``<consumer_group_id>-<node>``.
        self.group_id = (f"{self.conn.consumer_group_id}-{self.name}" if self.conn.consumer_group_id
                         else f"{ctx.settings.application_id}.{self.name}")
        self._registry: Registry | None = None
        self._reader: RegisteredSchema | None = None
        self._consumer: Any = None
        self._wide: dict[str, ColumnType] = {}  # wide decimal columns, exact text
        # The per-record decode columns, built once per set of known schemas: building them costs ~40
        # round trips to the JVM, which every epoch paid before (unresolved columns are reusable).
        self._decoders: tuple[Any, list[Column]] | None = None
        self._filter: Column | None = None
        self._filter_sql = ""  # the filter translated for Spark (the text of ``_filter``)

    @classmethod
    def ineffective_settings(cls, settings: Settings) -> list[str]:
        """The ``kafka_source`` keys Streamling's consumer reads and Spark's Kafka reader has no use for."""
        src = settings.kafka_source
        out: list[str] = []
        default_lag = KafkaSourceSettings.model_fields["lag_report_interval_ms"].default
        if src.lag_report_interval_ms != default_lag:
            out.append("kafka_source.lag_report_interval_ms has no effect on Spark: the lag metric "
                       "(streamling_kafka_consumer_messages_lag) is computed from every epoch's progress, where "
                       "Spark already holds each partition's latest offset, so there is no interval to set")
        if src.consumer_fetch_timeout_sec is not None:
            out.append("kafka_source.consumer_fetch_timeout_sec has no effect on Spark: there is no consumer "
                       "waiting for a partition assignment; Spark assigns the topic's partitions itself")
        if src.stall_watchdog_timeout_sec is not None:
            out.append("kafka_source.stall_watchdog_timeout_sec has no effect on Spark: there is no stall "
                       "watchdog; a flow that stops advancing shows in Spark's progress (epochs with no input)")
        if src.consumer_group_id:
            out.append(f"kafka_source.consumer_group_id is used only to commit offsets (as "
                       f"'{src.consumer_group_id}-<node>') for lag tooling: Spark assigns partitions itself, so "
                       "two pipelines sharing the group both read every partition instead of splitting them; "
                       "scale out with spark.master and the topic's partitions")
        return out

    # --- schema ---------------------------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = Registry(self.conn, self.name, "kafka source")
        return self._registry

    def _schemas(self) -> tuple[RegisteredSchema, dict[int, dict[str, Any]]]:
        """The reader schema (latest version at the first call, then pinned) and every writer schema by id."""
        reader, writers, _ = self._resolution()
        return reader, writers

    def _resolution(self) -> tuple[RegisteredSchema, dict[int, dict[str, Any]], dict[int, RegisteredSchema]]:
        """Reader, writer schemas by id (``schema_id_overrides`` applied), and the registered version
        each writer id resolves to (an override's ``from`` id takes its ``to`` id's version)."""
        versions = self.registry.versions(self.subject)
        if self._reader is None:
            self._reader = max(versions.values(), key=lambda s: s.version)
        # Writers stay as registered: a Debezium ["null", record] root puts a union branch index
        # before the record on the wire, which Avro resolution strips when reading into the record.
        writers = {sid: s.schema for sid, s in versions.items()}
        registered = dict(versions)
        for override in self.options.schema_id_overrides or []:
            if override.to in writers:
                writers[override.from_] = writers[override.to]
                registered[override.from_] = versions[override.to]
        return self._reader, writers, registered

    def _skips_resolution(self, reader: RegisteredSchema) -> bool:
        """Streamling: unconditionally, or when the reader schema id is listed."""
        return self.options.skip_schema_resolution or reader.schema_id in (
            self.options.skip_schema_resolution_for_reader_schema_ids or [])

    def inferred_primary_key(self) -> list[str]:
        if self.options.data_format != "avro":
            return []
        reader, _ = self._schemas()
        return primary_keys_from_doc(unwrap_root(reader.schema))

    # --- offsets --------------------------------------------------------------------------------

    def _admin_conf(self) -> dict[str, str | int | float | bool]:
        return self.conn.librdkafka()

    def _partitions(self) -> list[int]:
        from confluent_kafka.admin import AdminClient

        meta = AdminClient(self._admin_conf()).list_topics(self.topic, timeout=15)
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise self.ctx.error(f"topic '{self.topic}' does not exist on {self.conn.brokers}",
                                 hint="create the topic or fix 'topic'", code="topic_missing")
        return sorted(topic.partitions)

    def starting_offsets(self) -> dict[str, str]:
        """Spark options that place a brand-new checkpoint (ignored by Spark when resuming).

        Streamling's order: this node's offsets in the state backend, else ``starting_offsets``
        (also for partitions the state backend does not know yet).
        """
        state = self.ctx.state
        stored: dict[int, int] = {}
        if state is not None:
            prefix = f"{self.name}:{self.topic}:"
            stored = {int(k[len(prefix):]): int(v["offset"]) for k, v in state.list(prefix).items()}
        if stored:
            fallback = -1 if self.options.starting_offsets == "latest" else -2
            offsets = {str(p): stored.get(p, fallback) for p in self._partitions()}
            log.info("kafka source '%s': starting from the state backend's offsets %s", self.name, offsets)
            return {"startingOffsets": json.dumps({self.topic: offsets})}
        if self.options.starting_offsets.isdigit():
            return {"startingTimestamp": self.options.starting_offsets,
                    "startingOffsetsByTimestampStrategy": "latest"}
        return {"startingOffsets": self.options.starting_offsets}

    # --- reading --------------------------------------------------------------------------------

    def read_stream(self, spark: SparkSession) -> DataFrame:
        reader = (spark.readStream.format("kafka").options(**self.conn.spark_options())
                  .option("subscribe", self.topic).option("includeHeaders", "true")
                  .option("failOnDataLoss", "true"))
        if self.conn.max_offsets_per_epoch:
            reader = reader.option("maxOffsetsPerTrigger", str(self.conn.max_offsets_per_epoch))
        reader = reader.options(**self.starting_offsets())
        return reader.load()

    def _where(self) -> Column:
        from pyspark.sql import functions as F

        return F.concat(F.lit("topic "), F.col("topic"), F.lit(" partition "), F.col("partition").cast("string"),
                        F.lit(" offset "), F.col("offset").cast("string"))

    def _poison(self, message: Column) -> Column:
        from pyspark.sql import functions as F

        return F.raise_error(F.concat(F.lit(POISON), message))

    def decode(self, df: DataFrame, epoch: Epoch | None) -> DataFrame:
        from pyspark.sql import functions as F

        key: Any = "json"
        if self.options.data_format != "json":
            # New writer schemas are picked up each epoch; ids and versions name them (an id's schema
            # never changes in a registry).
            reader, _, registered = self._resolution()
            key = (reader.schema_id, sorted((sid, r.version) for sid, r in registered.items()))
        if self._decoders is None or self._decoders[0] != key:
            self._decoders, self._filter = (key, self._decode_columns()), None
        columns = self._decoders[1]
        out = df.select(*columns).select("__v.*", GS_OP, *_names(columns[2:]))
        out = wide_decimal_columns(out, self._wide, from_bytes=self.options.data_format == "avro")
        if self.options.filter:
            try:
                if self._filter is None:
                    # the filter is DataFusion SQL, as in Streamling: translated for Spark
                    types = {f.name: f.dataType.simpleString() for f in out.schema.fields}
                    self._filter_sql = spark_expression(self.options.filter, types)
                    self._filter = F.expr(self._filter_sql)
                register_udfs(out.sparkSession, self._filter_sql)  # it may call Streamling's SQL functions
                out = out.where(self._filter)
            except Exception as exc:  # noqa: BLE001 - Spark raises parse and analysis errors as several types
                raise self._filter_error(exc, out.columns) from exc
        return out

    def _decode_columns(self) -> list[Column]:
        """The decoded record (``__v``), the op and the metadata columns, as unresolved columns."""
        from pyspark.sql import functions as F

        where = self._where()
        if self.options.data_format == "json":
            ddl = spark_ddl(self.options.schema_ or {})
            body = exact_json_decimals(F.from_json(F.col("value").cast("string"), ddl, {"mode": "FAILFAST"}),
                                       F.col("value"), self.options.schema_ or {})
            self._wide = wide_columns(self.options.schema_)
            decoded = F.when(F.col("value").isNull(), self._poison(F.concat(F.lit("tombstone (null value) at "),
                                                                                where))).otherwise(body)
        else:
            decoded = self._avro(where)
        # The first dbz.op header's value, found without a lambda: a higher-order function (filter)
        # cannot be code-generated, so Spark would interpret the whole decode projection per record.
        op = F.expr("CASE lower(cast(get(headers, array_position(headers.key, 'dbz.op') - 1).value AS STRING)) "
                    "WHEN 'u' THEN 'u' WHEN 'd' THEN 'd' ELSE 'i' END")
        meta = []
        if self.options.include_metadata:
            meta = [F.col("topic").alias("_kafka_topic"), F.col("partition").alias("_kafka_partition"),
                    F.col("offset").alias("_kafka_offset"), F.col("timestamp").alias("_kafka_timestamp"),
                    F.col("key").cast("string").alias("_kafka_key")]
        return [decoded.alias("__v"), op.alias(GS_OP), *meta]

    def _filter_error(self, exc: BaseException, columns: list[str]) -> StreamlingError:
        """The filter as the user wrote it failed to resolve: say which column, once, without a plan dump."""
        hint = "fix 'filter'; it may use the decoded columns" + (" and the _kafka_* metadata columns"
                                                                 if self.options.include_metadata else "")
        # the columns the filter can use, not Spark's guesses among the raw Kafka record's
        message = spark_sql_message(exc, columns)
        return self.ctx.error(f"filter fails: {message}", hint=hint, code="filter_invalid")

    def _avro(self, where: Column) -> Column:
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        reader, writers, registered = self._resolution()
        skip = self._skips_resolution(reader)
        reader_text = json.dumps(self._readable(reader.schema))
        value = F.col("value")
        payload = F.expr("substring(value, 6)")
        # A good record's first five bytes (magic 0 + schema id) equal one known prefix: one binary
        # comparison per writer schema. The checks that name a poison record come after, so they
        # cost nothing on good records.
        header = F.substring(value, 1, 5)
        expr = F.when(value.isNull(), self._poison(F.concat(F.lit("tombstone (null value) at "), where)))
        for sid, writer in sorted(writers.items()):
            prefix = header == F.lit(b"\x00" + int(sid).to_bytes(4, "big"))
            version = registered[sid].version
            if not skip and self.options.validate_writer_schema_ordering and version > reader.version:
                expr = expr.when(prefix, F.raise_error(F.concat(F.lit(
                    f"{WRITER_AHEAD}writer schema id {sid} (version {version} of subject '{self.subject}') is newer "
                    f"than the reader schema id {reader.schema_id} (version {reader.version}) this flow started "
                    "with, at "), where)))
                continue
            writer_text = reader_text if skip else json.dumps(writer)
            expr = expr.when(prefix, from_avro(payload, writer_text, {"avroSchema": reader_text, "mode": "FAILFAST"}))
        expr = expr.when((F.length(value) < 5) | (F.substring(value, 1, 1) != F.lit(b"\x00")),
                         self._poison(F.concat(F.lit("not in the Confluent Avro wire format (bad magic byte or too "
                                                     "short) at "), where)))
        schema_id = F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")
        return expr.otherwise(self._poison(F.concat(
            F.lit("unknown schema id "), schema_id.cast("string"),
            F.lit(f" (not registered under subject '{self.subject}') at "), where)))

    def _readable(self, schema: Any) -> dict[str, Any]:
        """The reader record with its wide decimals read as bytes, which ``decode`` turns into exact
        text: ``from_avro`` refuses decimals beyond 38 digits."""
        try:
            record, self._wide = readable_wide_decimals(unwrap_root(schema))
        except WideDecimalError as exc:
            raise self.ctx.error(f"the value schema of subject '{self.subject}' cannot be read exactly: {exc}",
                                 code="wide_decimal_nested",
                                 hint="make the decimal a top-level field, or narrow it to 38 digits in the producer"
                                 ) from None
        return record

    # --- failures -------------------------------------------------------------------------------

    def explain_failure(self, raw: DataFrame, exc: BaseException) -> StreamlingError | None:
        text = chain_text(exc)
        hint = ("nothing after this record was processed; fix the producer, then move the consumer past it "
                "(or reset the flow's checkpoint)")
        if WRITER_AHEAD in text:
            message = text.split(WRITER_AHEAD, 1)[1].split("\n", 1)[0]
            message = re.sub(r"\s*SQLSTATE: \w+\.?$", "", message).rstrip(". ")
            return self.ctx.error(
                f"schema resolution failed: {message}", code="schema_resolution",
                hint="restart the pipeline to read with the newer schema (its new fields then reach the sinks), or "
                     "set validate_writer_schema_ordering: false to keep the reader schema and drop them")
        if POISON in text:
            message = text.split(POISON, 1)[1].split("\n", 1)[0]
            message = re.sub(r"\s*SQLSTATE: \w+\.?$", "", message).rstrip(". ")
            return self.ctx.error(f"poison record: {message}", hint=hint, code="poison_record")
        if "malformed" in text.lower() and self.options.data_format == "avro":
            found = self._find_undecodable(raw)
            if found:
                return self.ctx.error(f"poison record: {found}", hint=hint, code="poison_record")
        if "malformed" in text.lower():
            return self.ctx.error(f"poison record: a value on topic '{self.topic}' is not valid JSON for 'schema'",
                                  hint=hint, code="poison_record")
        return None

    def _find_undecodable(self, raw: DataFrame) -> str | None:
        """Decode the failed epoch record by record (only on failure) to name the culprit."""
        import fastavro

        reader, writers = self._schemas()
        parsed_reader = fastavro.parse_schema(unwrap_root(reader.schema))
        parsed: dict[int, Any] = {}
        rows = raw.select("topic", "partition", "offset", "value").orderBy("partition", "offset").toLocalIterator()
        for row in rows:
            value = bytes(row["value"] or b"")
            sid = struct.unpack(">I", value[1:5])[0]
            if sid not in writers:
                continue
            if sid not in parsed:
                parsed[sid] = fastavro.parse_schema(writers[sid])
            try:
                fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed[sid], parsed_reader)
            except Exception as exc:  # noqa: BLE001 - any decode failure identifies the record
                return (f"cannot decode the Avro value with schema id {sid} at topic {row['topic']} partition "
                        f"{row['partition']} offset {row['offset']}: {exc or type(exc).__name__}")
        return None

    # --- finalization ---------------------------------------------------------------------------

    def state_entries(self, end_offset: Any) -> dict[str, dict[str, Any]]:
        per_partition = (end_offset or {}).get(self.topic, {}) if isinstance(end_offset, dict) else {}
        return {f"{self.name}:{self.topic}:{p}": {"offset": int(o)} for p, o in per_partition.items()}

    def on_finalized(self, epoch: Epoch, end_offset: Any) -> None:
        from confluent_kafka import Consumer, TopicPartition

        per_partition = (end_offset or {}).get(self.topic, {}) if isinstance(end_offset, dict) else {}
        if not per_partition:
            return
        if self._consumer is None:
            self._consumer = Consumer({**self._admin_conf(), "group.id": self.group_id, "enable.auto.commit": False})
        self._consumer.commit(offsets=[TopicPartition(self.topic, int(p), int(o)) for p, o in per_partition.items()],
                              asynchronous=False)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _names(columns: list[Column]) -> list[str]:
    return ["_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key"][:len(columns)]
