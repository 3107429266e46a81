"""``kafka_source.*``/``kafka_sink.*`` keys with no meaning on Spark: accepted, named in a warning.

A ``config.yaml`` or pipeline written for Streamling must load unchanged, but a key that silently
does nothing invites tuning that changes nothing. Each warning says which key, why it has no
effect here and, where one exists, what to use instead. The planner logs them with every other
key without effect when a plan is built, so ``--validate`` lists them (its ``warnings`` are the
WARN lines it saw) and a run logs them once at start. No Spark, no connections. Node keys
(``batch_size`` …) are reported by the nodes themselves (``Node.ineffective_keys``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.config.settings import KafkaSourceSettings, Settings

if TYPE_CHECKING:
    from streamling.spec.pipeline import PipelineSpec


def kafka_warnings(spec: PipelineSpec, settings: Settings) -> list[str]:
    """One line per ``kafka_source``/``kafka_sink`` key set for this pipeline that has no effect on Spark."""
    sources = [n for n in spec.sources if n.type in ("kafka", "hybrid")]  # hybrid: its live phase
    sinks = [n for n in spec.sinks if n.type == "kafka"]
    out: list[str] = []
    if sources:
        src = settings.kafka_source
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
    if sinks:
        snk = settings.kafka_sink
        for key in ("consumer_group_id", "lag_report_interval_ms"):
            if getattr(snk, key) is not None:
                out.append(f"kafka_sink.{key} has no effect: it is a consumer setting and the sink only produces "
                           "(Streamling ignores it there too)")
    return out

