"""Helpers shared by Spark-side sinks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamling.runtime.nodes import GS_OP

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def op_column(df: DataFrame) -> Column:
    """``_gs_op`` lower-cased, with a missing column or null meaning insert."""
    from pyspark.sql import functions as F

    return F.lower(F.coalesce(F.col(GS_OP), F.lit("i"))) if GS_OP in df.columns else F.lit("i")


def last_row_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    """Keep the last row of each key in the batch's order (Streamling's per-epoch dedup)."""
    from pyspark.sql import functions as F
    from pyspark.sql.window import Window

    seq = df.withColumn("__seq", F.monotonically_increasing_id())
    last = Window.partitionBy(*[F.col(f"`{k}`") for k in keys]).orderBy(F.col("__seq").desc())
    return seq.withColumn("__rn", F.row_number().over(last)).where("__rn = 1").drop("__rn", "__seq")
