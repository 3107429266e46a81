"""Expectations (data-quality rules) checked in the same pass as the node they guard.

A node's rows are observed once with a failure count per expectation (one ``Observation``, filled by
the sinks' own job); ``drop`` rules then filter, and ``fail`` rules make the job raise on the first
violating row with a ``NodeFailure`` naming the node, the rule and the row, so the epoch is not
committed and the flow stops with that message. No extra Spark job either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamling.errors import NodeFailure
from streamling.runtime.observe import EpochObservations
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from streamling.runtime.nodes import Node

SUFFIX = "#expectations"
ROW_MARK = "\x00ROW\x00"


def has_rules(node: Node[Any]) -> bool:
    """Whether ``node`` has expectations (``guard`` then observes, filters or checks its rows)."""
    return isinstance(node.options, FromNodeOptions) and bool(node.options.expectations)


def guard(node: Node[Any], df: DataFrame, watch: EpochObservations | None) -> DataFrame:
    """``df`` with ``node``'s expectations applied (counts observed, ``drop`` filtered, ``fail`` raised)."""
    expectations = node.options.expectations if isinstance(node.options, FromNodeOptions) else []
    if not expectations:
        return df
    from pyspark.sql import functions as F

    from streamling.spec.sql import spark_expression

    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    passed: dict[str, Column] = {}
    for rule in expectations:
        try:
            condition = F.expr(spark_expression(rule.condition, types))
        except Exception as exc:  # noqa: BLE001 - a parse or translation problem, with the rule named
            raise node.ctx.error(f"expectation '{rule.name}': {exc}", code="expectation_invalid") from exc
        passed[rule.name] = F.coalesce(condition, F.lit(False))  # NULL is a violation, as false is
    if watch is not None:
        failures = {rule.name: F.sum(F.when(passed[rule.name], 0).otherwise(1)) for rule in expectations}
        df = watch.watch(node.name + SUFFIX, df, failures)
    row = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]))
    for rule in expectations:
        if rule.on_violation == "drop":
            df = df.where(passed[rule.name])
        elif rule.on_violation == "fail":
            message = str(NodeFailure(node.name, f"{node.ctx.spec.type} {node.ctx.spec.kind}",
                                      f"expectation '{rule.name}' ({rule.condition}) failed on row {ROW_MARK}",
                                      hint="fix the data or the rule; the epoch was not committed"))
            head, tail = message.split(ROW_MARK)
            df = df.where(F.when(passed[rule.name], F.lit(True)).otherwise(
                F.raise_error(F.concat(F.lit(head), row, F.lit(tail))).cast("boolean")))
    return df


def results(node: Node[Any], observed: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{expectation: {"passed", "failed", "action"}}`` for the epoch, from the observation."""
    values = observed.get(node.name + SUFFIX)
    expectations = node.options.expectations if isinstance(node.options, FromNodeOptions) else []
    if values is None or not expectations:
        return {}
    total = int(values.get("rows") or 0)
    out = {}
    for rule in expectations:
        failed = int(values.get(rule.name) or 0)
        out[rule.name] = {"passed": total - failed, "failed": failed, "action": rule.on_violation}
    return out
