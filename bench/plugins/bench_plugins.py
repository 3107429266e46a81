"""Plugins the ``plugins`` bench scenario measures, loaded as a plugin file (shipped to Spark's
workers by value, as any plugin from STREAMLING__PLUGIN__PATH)."""

from __future__ import annotations

import pyarrow as pa

from streamling.plugins import PluginEpoch, SinkPlugin, TransformPlugin, sink, transform


@transform("bench.identity")
class Identity(TransformPlugin):
    """Every batch unchanged: what the plugin boundary itself costs."""

    def process_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch


@sink("bench.discard")
class Discard(SinkPlugin):
    """Receives every batch and keeps nothing: the plugin sink path next to the blackhole sink."""

    def write_batch(self, batch: pa.RecordBatch, epoch: PluginEpoch) -> None:
        self.ctx.metrics.record_count("rows", batch.num_rows)
