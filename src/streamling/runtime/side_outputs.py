"""Side output plugins (``plugin.side_output_ids``): each sees every batch of every source.

They run inside the epoch, on executors, one instance per partition, before the sinks write; a
failure fails the epoch like a sink's (retried when transient), so the epoch is committed only once
every side output has seen it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from streamling.plugins.host import PluginJob, job_for

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from streamling.config import Settings


def _feed(job: PluginJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    from pyspark import TaskContext

    task = TaskContext.get()
    plugin: Any = job.create("executor", task.partitionId() if task else -1)
    rows = 0
    try:
        for batch in batches:
            job.on_executor("process_batch()", lambda b=batch: plugin.process_batch(b))
            rows += batch.num_rows
    finally:
        job.on_executor("close()", plugin.close)
    yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})


class SideOutputs:
    """The configured side outputs of one flow's sources."""

    def __init__(self, settings: Settings, sources: list[str]) -> None:
        from streamling.plugins.discovery import ship_by_value

        self.jobs: dict[str, list[PluginJob]] = {}
        for plugin_id in settings.plugin.side_output_ids:
            options = settings.plugin.side_output_options.get(plugin_id, {})
            for source in sources:
                job = job_for("side_output", plugin_id, source, options, settings)
                ship_by_value(job.cls)
                self.jobs.setdefault(source, []).append(job)

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def run(self, frames: dict[str, DataFrame]) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        for source, jobs in self.jobs.items():
            frame = frames[source]
            for job in jobs:
                job.input_schema = to_arrow_schema(frame.schema, timezone="UTC")
                frame.mapInArrow(functools.partial(_feed, job), "rows bigint").collect()
