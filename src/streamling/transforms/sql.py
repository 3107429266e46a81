"""SQL transform: Streamling (DataFusion) SQL, translated to Spark SQL, over the upstream nodes'
micro-batches, stateless only."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from streamling.errors import spark_sql_message
from streamling.functions.catalog import register_udfs
from streamling.functions.dynamic_table import DynamicTableChecks
from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Transform
from streamling.spec.sql import analyze_sql, pin_clock, rewrite_sql, uses_clock
from streamling.spec.transforms import SqlTransformOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession


def view_name(scope: str, node: str) -> str:
    """A temp-view name unique per flow and node (views are session-global)."""
    return "__sl_" + re.sub(r"[^A-Za-z0-9_]", "_", f"{scope}__{node}")


class UpstreamSql:
    """A node's SQL over its upstream nodes' batches: translated from DataFusion's SQL to Spark's,
    names rewritten to per-flow temp views, and ``now()`` pinned to the epoch's start. Shared by the
    SQL transform and a dynamic table's ``sql``.

    The translation is redone when the inputs' column types change: some of DataFusion's meanings
    depend on them (``a / b`` divides integers as integers)."""

    def __init__(self, ctx: NodeContext, sql: str, carry_gs_op: bool) -> None:
        self.ctx = ctx
        scope = ctx.scope
        self.views = {u.lower(): view_name(scope, u) for u in ctx.spec.upstream}
        self.source = sql
        self.carry_gs_op = carry_gs_op
        #: a further rewrite of the translated SQL (e.g. dynamic-table lookups)
        self.post: Callable[[str], str] | None = None
        self.sql = self._rewrite(None)
        self.pins_clock = uses_clock(self.sql)
        self._typed_for: tuple[tuple[str, str], ...] | None = None

    @property
    def typed_for(self) -> tuple[tuple[str, str], ...] | None:
        """The inputs' columns and types the current SQL was translated for."""
        return self._typed_for

    def _rewrite(self, columns: dict[str, str] | None) -> str:
        from sqlglot.errors import ParseError

        try:
            return rewrite_sql(self.source, self.views, carry_gs_op=self.carry_gs_op, columns=columns)
        except ParseError as exc:  # validation reports these first; kept for specs built in code
            raise self.ctx.error(f"SQL cannot run on Spark: {exc}", hint="fix the query in 'sql'",
                                 code="sql_invalid") from exc

    def _typed(self, inputs: dict[str, DataFrame]) -> str:
        columns: dict[str, str] = {}
        clashes: set[str] = set()
        for df in inputs.values():
            for f in df.schema.fields:
                kind = f.dataType.simpleString()
                if columns.setdefault(f.name.lower(), kind) != kind:
                    clashes.add(f.name.lower())
        typed = {k: v for k, v in columns.items() if k not in clashes}
        key = tuple(sorted(typed.items()))
        if key != self._typed_for:
            self._check_wide_columns(inputs)
            sql = self._rewrite(typed)
            self.sql = self.post(sql) if self.post is not None else sql
            self._typed_for = key
        return self.sql

    def _check_wide_columns(self, inputs: dict[str, DataFrame]) -> None:
        """Decimals wider than Spark's 38 digits travel as exact text: SQL may only use them exactly
        (equality, IN, grouping). Anything else is refused when the query is planned — at
        ``--validate`` and before the first epoch — rather than computed on text."""
        from streamling.spec.sql import parse_user_sql
        from streamling.spec.types import wide_fields
        from streamling.spec.wide_sql import wide_decimal_problems

        wide = {k.lower(): v for df in inputs.values() for k, v in wide_fields(df.schema).items()}
        problems = wide_decimal_problems(parse_user_sql(self.source), wide) if wide else []
        if problems:
            raise self.ctx.error(f"SQL is not exact on wide decimals: {problems[0]}", hint="change the query in 'sql'",
                                 code="sql_invalid")

    def run(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None,
            before: Callable[[], None] | None = None) -> DataFrame:
        """Register the inputs' views, call ``before`` (e.g. bind UDFs), and plan the query."""
        from pyspark.errors import AnalysisException, ParseException

        for upstream, df in inputs.items():
            df.createOrReplaceTempView(self.views[upstream.lower()])
        typed = self._typed(inputs)
        sql = pin_clock(typed, epoch.started_at_iso) if self.pins_clock and epoch is not None else typed
        register_udfs(spark, sql)
        if before is not None:
            before()
        try:
            return spark.sql(sql)
        except (AnalysisException, ParseException) as exc:
            raise self.ctx.error(f"SQL fails: {_spark_message(exc)}",
                                 hint="fix the query in 'sql'", code="sql_invalid") from exc


class SqlTransform(Transform[SqlTransformOptions]):
    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.query = UpstreamSql(ctx, self.options.sql, carry_gs_op=True)
        analysis = analyze_sql(self.options.sql)
        tables = analysis.dynamic_tables
        self.checks = DynamicTableChecks(tables, self.name, ctx.dynamic_tables, ctx.error,
                                         by_column=analysis.dynamic_table_by_column) \
            if tables or analysis.dynamic_table_by_column else None
        if self.checks is not None:
            self.query.post = self.checks.rewrite
            self.query.sql = self.checks.rewrite(self.query.sql)
        self._doubled_op: dict[tuple[tuple[str, str], ...], bool] = {}

    def apply(self, spark: SparkSession, inputs: dict[str, DataFrame], epoch: Epoch | None) -> DataFrame:
        checks = self.checks
        # this epoch's members of each dynamic table, read once, bound before the query is planned
        bind = (lambda: checks.register(spark, epoch)) if checks is not None else None
        df = self.query.run(spark, inputs, epoch, bind)
        # The output's columns follow from the SQL and its inputs' columns, so whether ``_gs_op``
        # came out twice is asked of Spark once per input shape, not every epoch.
        key = self.query.typed_for
        if key is None or key not in self._doubled_op:
            doubled = df.columns.count(GS_OP) > 1
            if key is not None:
                self._doubled_op[key] = doubled
        else:
            doubled = self._doubled_op[key]
        return _single_gs_op(df) if doubled else df


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
    # the views streamling names its inputs by (``__sl_<scope>__<node>``) read as the node names
    return re.sub(r"__sl_\w+?__", "", spark_sql_message(exc))
