"""SQL transform: Spark SQL over the upstream nodes' micro-batches, stateless only."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from streamling.functions.dynamic_table import DynamicTableChecks
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Transform
from streamling.spec.nodes import SqlTransformOptions
from streamling.spec.sql import analyze_sql, pin_clock, rewrite_sql, uses_clock

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def view_name(scope: str, node: str) -> str:
    """A temp-view name unique per flow and node (views are session-global)."""
    return "__sl_" + re.sub(r"[^A-Za-z0-9_]", "_", f"{scope}__{node}")


class SqlTransform(Transform):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        assert isinstance(self.options, SqlTransformOptions)
        self.scope = str(ctx.extras.get("scope", "p"))
        self.views = {u.lower(): view_name(self.scope, u) for u in ctx.spec.upstream}
        self.sql = rewrite_sql(self.options.sql, self.views, carry_gs_op=True)
        self.pins_clock = uses_clock(self.sql)
        tables = analyze_sql(self.options.sql).dynamic_tables
        self.checks = DynamicTableChecks(tables, self.name, ctx.extras.get("dynamic_tables"),
                                         ctx.error) if tables else None
        if self.checks is not None:
            self.sql = self.checks.rewrite(self.sql)

    def apply(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None) -> DataFrame:
        from pyspark.errors import AnalysisException, ParseException

        for upstream, df in inputs.items():
            df.createOrReplaceTempView(self.views[upstream.lower()])
        sql = self.sql
        if self.pins_clock and epoch is not None:
            sql = pin_clock(sql, epoch.started_at_iso)
        if self.checks is not None:  # this epoch's members of each dynamic table, read once
            self.checks.register(spark, epoch)
        try:
            out = spark.sql(sql)
        except (AnalysisException, ParseException) as exc:
            raise self.ctx.error(f"SQL fails: {_spark_message(exc)}",
                                 hint="fix the query in 'sql'", code="sql_invalid") from exc
        return _single_gs_op(out)


def _single_gs_op(df: DataFrame) -> DataFrame:
    """``SELECT *, _gs_op`` would carry the column twice: keep the first."""
    names = df.columns
    if names.count(GS_OP) <= 1:
        return df
    seen = False
    keep: list[str] = []
    renamed: list[str] = []
    for i, name in enumerate(names):
        tmp = f"__c{i}"
        renamed.append(tmp)
        if name == GS_OP and seen:
            continue
        seen = seen or name == GS_OP
        keep.append(tmp)
    from pyspark.sql import functions as F

    df2 = df.toDF(*renamed)
    return df2.select([F.col(t).alias(names[int(t[3:])]) for t in keep])


def _spark_message(exc: Exception) -> str:
    text = str(exc).strip()
    text = re.sub(r"\s*SQLSTATE: \w+", "", text)
    text = re.sub(r"__sl_\w+?__", "", text)
    first = text.splitlines()[0] if text else type(exc).__name__
    return first
