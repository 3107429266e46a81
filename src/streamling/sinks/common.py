"""Helpers shared by Spark-side sinks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from streamling.runtime.nodes import GS_OP

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame


def op_column(df: DataFrame) -> Column:
    """``_gs_op`` lower-cased, with a missing column or null meaning insert."""
    from pyspark.sql import functions as F

    return F.lower(F.coalesce(F.col(GS_OP), F.lit("i"))) if GS_OP in df.columns else F.lit("i")


def arrow_ops(table: pa.Table) -> pa.Table:
    """``table`` (an epoch collected on the driver) with ``_gs_op`` as ``op_column`` makes it:
    lower-cased, a missing column or null meaning insert. For sinks that collect the epoch anyway it
    is done here, in Arrow (under 1 ms per 250k rows), not in Spark's projection, whose per-row
    ``lower`` costs 20–40 ms per 250k rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    index = table.schema.get_field_index(GS_OP)
    if index < 0:
        return table.append_column(GS_OP, pa.repeat(pa.scalar("i"), table.num_rows))
    ops = table.column(index).cast(pa.string())
    return table.set_column(index, GS_OP, pc.utf8_lower(pc.fill_null(ops, "i")))


def last_row_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    """Keep the last row of each key in the batch's order (Streamling's per-epoch dedup)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    seq = df.withColumn("__seq", F.monotonically_increasing_id())
    last = Window.partitionBy(*[F.col(f"`{k}`") for k in keys]).orderBy(F.col("__seq").desc())
    return seq.withColumn("__rn", F.row_number().over(last)).where("__rn = 1").drop("__rn", "__seq")


def last_rows(table: pa.Table, key: list[str]) -> pa.Table:
    """The last row of each key, in the batch's order (Streamling's per-epoch dedup), on the driver:
    the epoch is collected once anyway, and Arrow's hash grouping costs no Spark shuffle."""
    import numpy as np
    import pyarrow as pa

    if table.num_rows < 2:
        return table
    index = "__stl_row"
    numbered = table.select(key).append_column(index, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    last = numbered.group_by(key, use_threads=False).aggregate([(index, "max")]).column(f"{index}_max")
    if len(last) == table.num_rows:
        return table
    return table.take(pa.array(np.sort(last.to_numpy())))


#: rows per Arrow chunk a driver-side sink holds at a time (``arrow_chunks``)
CHUNK_ROWS = 10_000


def arrow_chunks(df: DataFrame, rows_per_chunk: int = CHUNK_ROWS) -> Iterator[pa.RecordBatch]:
    """The rows of ``df`` on the driver as Arrow batches of at most ``rows_per_chunk`` rows, in order.

    For sinks that must write from the driver (stdout, one ordered stream of requests): unlike
    ``toArrow`` the driver never holds the epoch, only the partition being read and the next one.

    ``df`` is cached and counted first. That count is the execution that reports the epoch's
    observations (row counts per node): a local iterator's execution reports them before its jobs
    have run, i.e. as zeros. An epoch of at most ``rows_per_chunk`` rows is then read with one
    ``toArrow`` of the cached rows, in the JVM (no Python worker: ~1.4 s on a cold start); a larger
    one is cut into Arrow IPC chunks by the executors (the values ``toArrow`` gives) and fetched a
    partition at a time by ``toLocalIterator`` (one small Spark job per partition)."""

    step = max(1, rows_per_chunk)
    level = df.storageLevel
    ours = not (level.useMemory or level.useDisk)  # a plan cached by someone else stays cached
    cached = df.persist() if ours else df
    try:
        rows = cached.count()
        if rows <= step:
            for batch in cached.toArrow().to_batches():
                if batch.num_rows:
                    yield batch
            return
        yield from _partition_chunks(cached, step)
    finally:
        if ours:
            cached.unpersist()


def _partition_chunks(df: DataFrame, step: int) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            for offset in range(0, batch.num_rows, step):
                out = pa.BufferOutputStream()
                with pa.ipc.new_stream(out, batch.schema) as writer:
                    writer.write_batch(batch.slice(offset, step))
                yield pa.RecordBatch.from_arrays([pa.array([out.getvalue().to_pybytes()], pa.binary())],
                                                 names=["chunk"])

    for row in df.mapInArrow(encode, "chunk binary").toLocalIterator(prefetchPartitions=True):
        with pa.ipc.open_stream(bytes(row[0])) as reader:
            yield from reader
