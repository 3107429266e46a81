"""A transform plugin over each epoch: one instance per partition, on executors, batch by batch.

``parallelism`` spreads the input over that many partitions (hashed by the primary key, so one
key's rows meet one instance, in order). The output schema is the plugin's ``output_schema`` of the
input's, asked once on the driver when the pipeline starts; batches that do not fit it fail the
node with the column at fault.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from streamling.plugins.api import TransformPlugin
from streamling.plugins.host import GS_OP, PluginJob, conform, node_job
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.spec.nodes import PluginNodeOptions
from streamling.transforms.arrow import ArrowTransform, BatchFunction

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


def _run(job: PluginJob, output: pa.Schema, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    task = TaskContext.get()
    plugin: Any = job.create("executor", task.partitionId() if task else -1)
    try:
        for batch in batches:
            out = job.on_executor("process_batch()", lambda b=batch: plugin.process_batch(b))
            if out is not None:
                yield job.on_executor("process_batch()", lambda o=out: conform(job, o, output, "process_batch()"))
    finally:
        job.on_executor("close()", plugin.close)


class PluginTransform(ArrowTransform[PluginNodeOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        #: per input schema (its JSON): the job and the output as declared and as Spark holds it —
        #: resolved once, not at every epoch
        self._resolved: dict[str, tuple[PluginJob, StructType, pa.Schema]] = {}

    def _resolve(self, input_schema: StructType) -> tuple[PluginJob, StructType, pa.Schema]:
        key = input_schema.json()
        if key not in self._resolved:
            import pyarrow as pa
            from pyspark.sql.pandas.types import to_arrow_schema

            from streamling.spec.types import spark_schema_from_arrow

            job = node_job("transform", self.ctx.spec.type, self.name, self.options.plugin_options,
                           self.ctx.primary_key, self.ctx.settings)
            job.input_schema = to_arrow_schema(input_schema, timezone="UTC")
            plugin = job.create("driver")
            assert isinstance(plugin, TransformPlugin)
            try:
                out = job.call("output_schema()", lambda: plugin.output_schema(job.input_schema))
            finally:
                job.call("close()", plugin.close)
            if not isinstance(out, pa.Schema):
                raise job.error(f"output_schema() returned {type(out).__name__}, not a pyarrow.Schema")
            if job.input_schema.get_field_index(GS_OP) >= 0 and out.get_field_index(GS_OP) < 0:
                raise job.error("output_schema() drops the _gs_op column: upserts and deletes travel in it",
                                hint="keep _gs_op in the output schema and in every batch")
            spark_out = spark_schema_from_arrow(out)
            # What Spark expects back: the declared schema as Spark holds it (e.g. timestamps in UTC).
            self._resolved[key] = (job, spark_out, to_arrow_schema(spark_out, timezone="UTC"))
        return self._resolved[key]

    def output_schema(self, input_schema: StructType) -> StructType:
        return self._resolve(input_schema)[1]

    def batch_function(self, input_schema: StructType, epoch: Epoch | None) -> BatchFunction:
        job, _, output = self._resolve(input_schema)
        return lambda batches: _run(job, output, batches)
