"""Built-in ``hybrid`` source: backfill history from ClickHouse, then continue from the live topic.

Each phase is its own source (a ``clickhouse`` scan per entry of ``bounded_sources``, then a
``kafka`` source) and the flow runs one Spark query per phase, each on its own checkpoint. A
bounded phase ends when its query drained and Spark committed its last epoch; only then does the
source record the next phase under ``hybrid_source_<name>_v1`` in the state backend, together with
the Kafka offsets the history reaches (read from ``offset_table``), which the Kafka phase starts
from. Persisting the switch any earlier would open a window in which a crash skips the rest of the
history (Streamling's issue #118); persisting it at finalization means a crash before the record
re-runs an already drained backfill (zero epochs) and switches again.

The Kafka phase starts *at* each partition's recorded offset, so the message the history ends with
may be read once more: with ``_gs_op`` upserts downstream that overlap is harmless, where a gap
would not be. In ``job_mode`` only the bounded phases run, and the run ends.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from streamling.errors import StreamlingError
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Source
from streamling.sources.clickhouse import START_AT_ON_RESTART, ClickHouseSource
from streamling.spec.nodes import REGISTRY
from streamling.spec.sources import ClickHouseSourceOptions, HybridSourceOptions
from streamling.state import is_durable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from streamling.config import Settings


log = logging.getLogger(__name__)

LIVE = "live"


class HybridSource(Source[HybridSourceOptions]):
    bounded = True
    exclusive_in_flow = ("a hybrid source switches its flow's query from the backfill to the live topic, so it must "
                         "be the only source its transforms and sinks read")

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.phases = [f"backfill-{i}" for i in range(len(self.options.bounded_sources))] + [LIVE]
        self._index: int | None = None
        self._children: dict[int, Source] = {}
        self._phases_checked = False

    def ineffective_keys(self) -> dict[str, str]:
        out = super().ineffective_keys()
        for i, bounded in enumerate(self.options.bounded_sources):
            if bounded.start_at is not None and is_durable(self.ctx.settings):
                out[f"bounded_sources[{i}].start_at"] = START_AT_ON_RESTART
        return out

    @classmethod
    def ineffective_settings(cls, settings: Settings) -> list[str]:
        """The Kafka source's: the live phase reads the topic through it."""
        from streamling.sources.kafka import KafkaSource

        return KafkaSource.ineffective_settings(settings)

    # --- phases ---------------------------------------------------------------------------------

    def state_key(self) -> str:
        return f"hybrid_source_{self.name}_v1"

    def _sources(self) -> str:
        """What a recorded phase is a phase of: the history's tables and filters, then the topic."""
        opts = self.options
        return json.dumps([[b.table_name, b.filter] for b in opts.bounded_sources] + [opts.unbounded_source.topic])

    def _current(self) -> int:
        if self._index is None:
            state = self.ctx.state
            stored = state.get(self.state_key()) if state is not None else None
            phase = (stored or {}).get("phase")
            recorded = (stored or {}).get("sources")
            if phase is not None and recorded is not None and recorded != self._sources():
                # Recorded while the node read other tables or another topic (the same node name in
                # one kernel or one durable backend): resuming that phase would skip this history.
                log.warning("hybrid source '%s': the state backend records phase %s of other sources (%s); it is "
                            "not used: the source starts with its first backfill", self.name, phase, recorded)
                phase = None
            index = self.phases.index(phase) if phase in self.phases else 0
            if self.ctx.settings.job_mode:
                index = min(index, len(self.phases) - 2)  # job mode: the history only
            self._index = index
            self.bounded = self.phases[index] != LIVE
            if index:
                log.info("hybrid source '%s': resuming in phase %s", self.name, self.phases[index])
        return self._index

    def phase(self) -> str:
        return self.phases[self._current()]

    def child(self) -> Source:
        """The source of the current phase."""
        index = self._current()
        if index not in self._children:
            self._children[index] = self._make(index)
        return self._children[index]

    def _make(self, index: int) -> Source:
        opts = self.options
        if index < len(opts.bounded_sources):
            bounded = opts.bounded_sources[index]
            scan = ClickHouseSourceOptions(type="clickhouse", table_name=bounded.table_name, columns=bounded.columns,
                                           filter=bounded.filter, start_at=bounded.start_at,
                                           primary_key=opts.primary_key, telemetry=opts.telemetry)
            return ClickHouseSource(self.ctx, options=scan, state_suffix=f":{index}")
        from streamling.sources.kafka import KafkaSource

        spec = dataclasses.replace(self.ctx.spec, node_type=REGISTRY["source"]["kafka"],
                                   options=opts.unbounded_source.kafka_options(opts))
        return KafkaSource(dataclasses.replace(self.ctx, spec=spec))

    def next_phase(self) -> bool:
        index = self._current()
        following = index + 1
        if following >= len(self.phases) or (self.ctx.settings.job_mode and self.phases[following] == LIVE):
            return False
        entries: dict[str, dict[str, Any]] = {self.state_key(): {"phase": self.phases[following],
                                                                 "sources": self._sources()}}
        if self.phases[following] == LIVE:
            entries.update(self._live_offsets())
        state = self.ctx.state
        if state is not None:
            state.put_many(entries)
        log.info("hybrid source '%s': %s done, switching to %s%s", self.name, self.phases[index],
                 self.phases[following], f" at offsets {self._offsets_text(entries)}" if len(entries) > 1 else "")
        self.child().close()
        self._index = following
        self.bounded = self.phases[following] != LIVE
        return True

    def _live_offsets(self) -> dict[str, dict[str, Any]]:
        """Per partition, the offset the history reaches, as the Kafka phase's state entries."""
        table = self.options.offset_table
        if table is None:
            return {}
        from streamling.clickhouse import connect, error, quote_identifier, split_table

        conn = self.ctx.settings.clickhouse_source
        database, name = split_table(table.table_name, conn.database)
        query = (f"SELECT toInt64({quote_identifier(table.partition_column)}), "
                 f"max(toInt64({quote_identifier(table.offset_column)})) "
                 f"FROM {quote_identifier(database)}.{quote_identifier(name)} "
                 f"WHERE {quote_identifier(table.topic_column)} = {{topic:String}} GROUP BY 1")
        try:
            client = connect(conn)
            try:
                rows = client.query(query, parameters={"topic": table.topic_name}).result_rows
            finally:
                client.close()
        except Exception as exc:
            raise error("hybrid source", self.name, f"reading the Kafka offsets in {database}.{name}", exc,
                        conn) from exc
        topic = self.options.unbounded_source.topic
        return {f"{self.name}:{topic}:{int(p)}": {"offset": int(o), "from": "offset_table"} for p, o in rows}

    @staticmethod
    def _offsets_text(entries: dict[str, dict[str, Any]]) -> str:
        return ", ".join(f"{k.rsplit(':', 1)[-1]}={v['offset']}" for k, v in entries.items() if "offset" in v)

    # --- the current phase does the work ----------------------------------------------------------

    def read_stream(self, spark: SparkSession) -> DataFrame:
        df = self.child().read_stream(spark)
        if not self._phases_checked:
            self._check_phase_schemas(spark, self.child().decode(df, None).schema)
            self._phases_checked = True
        return df

    def _check_phase_schemas(self, spark: SparkSession, current: StructType) -> None:
        """Every phase still to come must give the columns and types of the current one: the
        flow's transforms and sinks were analysed (and tables created) on the first phase's rows,
        so a column the live topic lacks would silently become NULL after the switch."""
        for index in range(self._current() + 1, len(self.phases)):
            later = self._make(index)
            try:
                schema = later.decode(later.read_stream(spark), None).schema
            finally:
                later.close()
            problems = schema_differences(current, schema)
            if problems:
                raise StreamlingError(
                    f"phase {self.phases[index]} gives other columns than phase {self.phase()}: "
                    + "; ".join(problems), node=self.name, node_kind="hybrid source", code="hybrid_schema_mismatch",
                    hint="give every phase the same column names and types (the bounded source's 'columns', a "
                         "ClickHouse view with casts, or the topic's schema)")

    def read_sample(self, spark: SparkSession, rows: int) -> DataFrame:
        return self.child().read_sample(spark, rows)

    def decode(self, df: DataFrame, epoch: Epoch | None) -> DataFrame:
        return self.child().decode(df, epoch)

    def inferred_primary_key(self) -> list[str]:
        return self.child().inferred_primary_key()

    def state_entries(self, end_offset: Any) -> dict[str, dict[str, Any]]:
        return self.child().state_entries(end_offset)

    def on_finalized(self, epoch: Epoch, end_offset: Any) -> None:
        self.child().on_finalized(epoch, end_offset)

    def explain_failure(self, raw: DataFrame, exc: BaseException) -> StreamlingError | None:
        return self.child().explain_failure(raw, exc)

    def close(self) -> None:
        for child in self._children.values():
            child.close()


def schema_differences(first: StructType, second: StructType) -> list[str]:
    """Columns only one side has and columns whose types differ (nullability aside). ``_gs_op``
    and Kafka's ``_kafka_*`` metadata are the live phase's own and may be missing from history."""
    def types(schema: StructType) -> dict[str, str]:
        return {f.name: f.dataType.simpleString() for f in schema.fields
                if f.name != GS_OP and not f.name.startswith("_kafka_")}

    a, b = types(first), types(second)
    out = []
    if sorted(set(a) - set(b)):
        out.append(f"missing {sorted(set(a) - set(b))}")
    if sorted(set(b) - set(a)):
        out.append(f"extra {sorted(set(b) - set(a))}")
    out += [f"'{name}' is {b[name]}, not {a[name]}" for name in a if name in b and a[name] != b[name]]
    return out
