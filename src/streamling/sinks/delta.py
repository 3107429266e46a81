"""``delta`` sink: a Delta Lake table under a path.

The table is created by the first epoch's write (its rows and the schema in one Delta commit), not
before the query starts: on the README's pipeline that took the first Delta commit (~4 s on a cold
JVM) off the path to the first printed row (looking the table up on a thread while the query
starts, to load Delta's classes early, measured no faster: 3 interleaved rounds, first row and exit
within 0.5 s either way). With a primary key, each later epoch is MERGEd on the
key honouring ``_gs_op`` (``d`` deletes, others upsert) after keeping the last row per key;
replaying an epoch converges to the same table.
Without a key, epochs are appended idempotently with Delta's ``txnAppId``/``txnVersion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from streamling import storage
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink, TargetReader
from streamling.runtime.observe import Counted
from streamling.sinks.common import last_row_per_key, op_column
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession


class DeltaSinkOptions(FromNodeOptions):
    type: Literal["delta"] = "delta"
    path: str
    deduplicate: bool = True
    partition_by: list[str] | None = None


class DeltaTableReader:
    """The table at ``path``, read with the run's SparkSession (in storage order)."""

    def __init__(self, path: str, spark: SparkSession) -> None:
        self.path = path
        self.spark = spark
        self.caption = f"rows of the Delta table at {path} (in storage order); read after each committed epoch"

    def read(self, limit: int) -> tuple[pa.Table, list[str]]:
        table = self.spark.read.format("delta").load(self.path).limit(limit).toArrow()
        return table, [str(f.type) for f in table.schema]

    def error_text(self, exc: BaseException) -> str:
        from streamling.errors import java_message

        return f"reading the Delta table at {self.path} failed: {java_message(exc)}"

    def close(self) -> None:
        return None


class DeltaSink(Sink[DeltaSinkOptions]):
    #: Delta writes data files from the executors: ``parallelism`` sets how many write at once
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"parallelism"})

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.path = storage.resolve(self.options.path)
        self._exists = False  # known to be a Delta table (checked until it is)

    def shared_paths(self) -> dict[str, str]:
        return {"path": self.options.path}  # executors write the table's data files

    def spread(self, df: DataFrame) -> DataFrame:
        return super().spread(df) if not self.key else df  # a MERGE shuffles by its own join

    def ineffective_keys(self) -> dict[str, str]:
        out = super().ineffective_keys()
        if self.options.parallelism is not None and self.key:
            out["parallelism"] = ("a keyed delta sink writes with MERGE, which shuffles by the key itself "
                                  "(spark.sql.shuffle.partitions sets its writers); parallelism applies to "
                                  "append-only delta sinks (no primary key)")
        return out

    @property
    def key(self) -> list[str]:
        # Read at write time: the planner may learn the key while resolving schemas (Kafka's Avro doc).
        return list(self.ctx.primary_key)

    def _table_exists(self, spark: SparkSession) -> bool:
        if not self._exists:
            from delta.tables import DeltaTable

            self._exists = DeltaTable.isDeltaTable(spark, self.path)
        return self._exists

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        from pyspark.sql import functions as F

        spark = df.sparkSession
        has_op = GS_OP in df.columns
        counted = Counted()
        if not self.key:
            data = counted.on(df.drop(GS_OP) if has_op else df)
            self._append(data, epoch, merge_schema=True)
            # A replayed epoch Delta already has (txnVersion) writes nothing, so nothing was counted.
            return counted.rows() if counted.done() else int(df.count())

        staged = df.withColumn("__op", op_column(df))
        if self.options.deduplicate:
            staged = last_row_per_key(staged, self.key)
        if has_op:
            staged = staged.drop(GS_OP)
        # Rows are counted as the write reads them (an observation), not by a job of their own.
        staged = counted.on(staged)
        if not self._table_exists(spark):
            # The first epoch creates the table: MERGE into nothing is the insert of the non-deletes.
            self._append(staged.where(F.col("__op") != "d").drop("__op"), epoch, merge_schema=False)
            return counted.rows() if counted.done() else int(staged.count())
        staged = staged.persist()  # MERGE reads its source twice: find the touched files, then write
        try:
            from delta.tables import DeltaTable

            target = DeltaTable.forPath(spark, self.path)
            cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.key)
            columns = [c for c in staged.columns if c != "__op"]
            values: dict[str, str | Column] = {f"`{c}`": F.col(f"s.`{c}`") for c in columns}
            (target.alias("t").merge(staged.alias("s"), cond)
             .whenMatchedDelete(condition="s.__op = 'd'")
             .whenMatchedUpdate(set=values)
             .whenNotMatchedInsert(condition="s.__op != 'd'", values=values)
             .execute())
            return counted.rows() if counted.done() else int(staged.count())
        finally:
            staged.unpersist()

    def _append(self, data: DataFrame, epoch: Epoch, merge_schema: bool) -> None:
        writer = (data.write.format("delta").mode("append")
                  .option("txnAppId", f"{epoch.sink_token}:{self.name}").option("txnVersion", epoch.epoch_id))
        if merge_schema:
            writer = writer.option("mergeSchema", "true")
        if self.options.partition_by:
            writer = writer.partitionBy(*self.options.partition_by)
        writer.save(self.path)
        self._exists = True

    def read_back(self, spark: SparkSession) -> TargetReader:
        return DeltaTableReader(str(self.path), spark)
