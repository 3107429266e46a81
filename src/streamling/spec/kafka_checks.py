"""Kafka checks that need no broker or registry, so ``--validate`` reports them with their line.

* A Kafka sink needs a primary key (Streamling: "kafka sink 'x' requires a primary key"); it is
  the message key. The key is the sink's own or inherited from upstream; an Avro Kafka source
  without ``primary_key`` may still supply one from its registered record's ``doc``, which only
  the registry knows, so that case is left to the sink's start.
* ``batch_flush_interval`` of a Kafka sink must read as a duration (it becomes ``linger.ms``).
* A Kafka source's ``filter`` over a declared JSON ``schema`` may only name its columns, and its
  ``schema_id_overrides`` may name each writer id once (a ``hybrid`` source's live phase too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from streamling.spec.nodes import (
    DynamicTableTransformOptions,
    HybridSourceOptions,
    KafkaSinkOptions,
    KafkaSourceOptions,
    parse_key,
)
from streamling.spec.sql import DIALECT
from streamling.util import did_you_mean, parse_duration_secs

if TYPE_CHECKING:
    from streamling.spec.pipeline import NodeSpec

Add = Callable[..., None]
GS_OP = "_gs_op"
METADATA_COLUMNS = ["_kafka_topic", "_kafka_partition", "_kafka_offset", "_kafka_timestamp", "_kafka_key"]


def check_kafka_nodes(nodes: dict[str, NodeSpec], prefix: str, add: Add) -> None:
    """Report every Kafka problem found in ``nodes`` through ``add(path, message, **kw)``."""
    keys: dict[str, list[str] | None] = {}
    for spec in nodes.values():
        path = spec.path.removeprefix(prefix)
        kind = f"{spec.type} {spec.kind}"
        if isinstance(spec.options, KafkaSinkOptions):
            if _key(spec.name, nodes, keys) == []:
                add(path, f"kafka sink '{spec.name}' requires a primary key",
                    hint="set primary_key on the sink or on a node upstream; it becomes the message key")
            interval = spec.options.batch_flush_interval
            if interval is not None:
                try:
                    parse_duration_secs(interval)
                except ValueError as exc:
                    add(f"{path}.batch_flush_interval", f"batch_flush_interval: {exc}", node=spec.name,
                        node_kind=kind)
        elif isinstance(spec.options, KafkaSourceOptions):
            _check_source(spec.options, spec.name, kind, path, add)
        elif isinstance(spec.options, HybridSourceOptions):  # its live phase is a Kafka source
            live = spec.options.unbounded_source.kafka_options(spec.options)
            _check_source(live, spec.name, kind, f"{path}.unbounded_source", add)


def _check_source(options: KafkaSourceOptions, name: str, kind: str, path: str, add: Add) -> None:
    seen: set[int] = set()
    for override in options.schema_id_overrides or []:
        if override.from_ in seen:  # Streamling refuses it too: which target would win is undefined
            add(f"{path}.schema_id_overrides", f"schema_id_overrides lists 'from: {override.from_}' twice",
                node=name, node_kind=kind, hint="keep one override per writer schema id")
        seen.add(override.from_)
    if options.filter and options.schema_:
        problem = filter_column_problem(options.filter, declared_columns(options))
        if problem:
            add(f"{path}.filter", f"filter fails: {problem}", node=name, node_kind=kind,
                hint="fix the column name in 'filter'")


def _key(name: str, nodes: dict[str, NodeSpec], memo: dict[str, list[str] | None]) -> list[str] | None:
    """The node's effective key as the planner resolves it (own, else first keyed upstream);
    ``None`` when it may come from a registry that validation does not reach."""
    if name in memo:
        return memo[name]
    spec = nodes[name]
    result: list[str] | None = parse_key(spec.options.primary_key)
    if isinstance(spec.options, DynamicTableTransformOptions):
        result = []
    elif not result:
        if isinstance(spec.options, KafkaSourceOptions) and spec.options.data_format == "avro":
            result = None  # the record's doc may name primaryKeys
        upstream = [_key(u, nodes, memo) for u in spec.upstream if u in nodes]
        if any(upstream):
            result = next(k for k in upstream if k)
        elif any(k is None for k in upstream):
            result = None
    memo[name] = result
    return result


def declared_columns(options: KafkaSourceOptions) -> list[str]:
    """The rows a JSON Kafka source yields: its declared schema, ``_gs_op`` and the metadata columns."""
    return [*(options.schema_ or {}), GS_OP, *(METADATA_COLUMNS if options.include_metadata else [])]


def filter_column_problem(predicate: str, columns: list[str]) -> str | None:
    """``column 'x' does not exist (did you mean 'y'?)`` for the first unknown column, else None.

    The predicate is read as Streamling's (DataFusion) SQL; names match case-insensitively, as
    Spark resolves them. One that does not parse is left to the filter's own checks.
    """
    try:
        tree: Any = sqlglot.parse_one(predicate, read=DIALECT)
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError):
        return None
    lambda_vars = {v.name.lower() for lam in tree.find_all(exp.Lambda) for v in lam.expressions}
    known = {c.lower() for c in columns}
    for column in tree.find_all(exp.Column):
        name = column.name
        if name and name.lower() not in known and name.lower() not in lambda_vars:
            return f"column '{name}' does not exist{did_you_mean(name, columns)}"
    return None
