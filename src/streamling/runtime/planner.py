"""From a validated spec to runnable flows.

A *flow* is a connected part of the pipeline: its sources and everything downstream. Each flow
runs as one Spark streaming query whose ``foreachBatch`` evaluates the transforms and writes every
sink, so no source of a flow advances before all of its sinks have flushed.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamling import storage
from streamling.config import Settings
from streamling.config.sections import normalize_backend
from streamling.errors import StreamlingError, ValidationError
from streamling.runtime.nodes import Node, NodeContext, Sink, Source, Transform
from streamling.spec.options import parse_key
from streamling.spec.pipeline import NodeSpec, PipelineSpec
from streamling.util import did_you_mean

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from streamling.functions.dynamic_table import DynamicTableBackend

log = logging.getLogger(__name__)


@dataclass
class Flow:
    name: str
    sources: list[NodeSpec]
    transforms: list[NodeSpec]
    sinks: list[NodeSpec]

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in [*self.sources, *self.transforms, *self.sinks]]


@dataclass
class FlowNodes:
    """The runtime nodes of one flow by kind, each list in the flow's order (transforms topological)."""

    sources: list[Source] = field(default_factory=list)
    transforms: list[Transform] = field(default_factory=list)
    sinks: list[Sink] = field(default_factory=list)

    @property
    def all(self) -> list[Node]:
        return [*self.sources, *self.transforms, *self.sinks]


@dataclass
class Plan:
    spec: PipelineSpec
    settings: Settings
    flows: list[Flow]
    keys: dict[str, list[str]]
    #: every node by name, in a flow or not (a dynamic table without ``sql`` belongs to none)
    nodes: dict[str, Node] = field(default_factory=dict)
    #: each flow's nodes, typed by kind, by flow name
    flow_nodes: dict[str, FlowNodes] = field(default_factory=dict)
    schemas: dict[str, StructType] = field(default_factory=dict)
    #: per node with ``telemetry.event_time``: ``"timestamp"``, ``"timestamp_ntz"`` or ``"number"``,
    #: None when its instrumentation is skipped (said once, by ``_check_event_times`` or the flow)
    event_time_kinds: dict[str, str | None] = field(default_factory=dict)

    def sources(self, flow: Flow) -> list[Source]:
        return list(self.flow_nodes[flow.name].sources)

    def transforms(self, flow: Flow) -> list[Transform]:
        return list(self.flow_nodes[flow.name].transforms)

    def sinks(self, flow: Flow) -> list[Sink]:
        return list(self.flow_nodes[flow.name].sinks)

    @property
    def bounded(self) -> bool:
        """Every flow ends by itself (all its sources are bounded): a job, not a service."""
        return all(s.bounded for f in self.flows for s in self.sources(f))

    def describe(self) -> dict[str, Any]:
        """A JSON-able picture of the plan (for --dry-run, notebooks and tests)."""
        return {
            "flows": [
                {
                    "name": f.name,
                    "sources": [s.name for s in f.sources],
                    "transforms": [t.name for t in f.transforms],
                    "sinks": [s.name for s in f.sinks],
                    "bounded": all(s.bounded for s in self.sources(f)),
                }
                for f in self.flows
            ],
            "nodes": {
                name: {
                    "kind": spec.kind,
                    "type": spec.type,
                    "upstream": spec.upstream,
                    **({"requires": spec.requires} if spec.requires else {}),
                    "primary_key": self.keys.get(name, []),
                    "schema": [f"{f.name} {f.dataType.simpleString()}" for f in self.schemas[name].fields]
                    if name in self.schemas else None,
                }
                for name, spec in self.spec.nodes.items()
            },
            **({"ddl": ddl} if (ddl := {n: stmts for n, node in self.nodes.items()
                                        if isinstance(node, Sink) and (stmts := node.ddl_statements())}) else {}),
        }


def flow_name(sources: list[NodeSpec]) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", "+".join(sorted(s.name for s in sources)))


def split_flows(spec: PipelineSpec) -> list[Flow]:
    """Connected components of the node graph, each in topological order.

    Only data edges (``upstream``) connect nodes. A dynamic table filled by ``sql`` reads the same
    input as the transforms that check it, so it lands in their flow, ordered before them through
    ``requires``; one without ``sql`` has no input and belongs to no flow (it is still planned:
    its backend is queried by the flows that check it).
    """
    parent: dict[str, str] = {n: n for n in spec.nodes}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for node in spec.nodes.values():
        for up in node.upstream:
            parent[find(node.name)] = find(up)
    groups: dict[str, list[NodeSpec]] = {}
    for node in spec.topological():
        groups.setdefault(find(node.name), []).append(node)
    flows = []
    for members in groups.values():
        sources = [n for n in members if n.kind == "source"]
        if not sources:
            continue
        flows.append(Flow(flow_name(sources), sources, [n for n in members if n.kind == "transform"],
                          [n for n in members if n.kind == "sink"]))
    return sorted(flows, key=lambda f: f.name)


def effective_keys(spec: PipelineSpec, known: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """A node's primary key is its own (or one its source knows, ``known``), else inherited from
    its first keyed upstream."""
    keys: dict[str, list[str]] = {}
    for node in spec.topological():
        if not node.options.produces_rows:
            keys[node.name] = []  # e.g. a dynamic table: a set of values, not rows of its input
            continue
        own = parse_key(node.options.primary_key) or (known or {}).get(node.name, [])
        if not own:
            own = next((keys[u] for u in node.upstream if keys.get(u)), [])
        keys[node.name] = own
    return keys


def _implementation(spec: NodeSpec) -> type:
    """The class named by ``spec``'s type, imported on first use.

    The registry (``streamling.spec.nodes``) names each implementation by a ``"module:Class"``
    string rather than the class: validation imports only the node modules a pipeline uses, and
    importing every runtime class there would cycle back through ``runtime.nodes`` to ``spec``. So
    the class is checked here against its kind's base, once per lookup, by the typed loaders below."""
    try:
        return spec.node_type.load_class()
    except TypeError as exc:
        raise TypeError(f"{exc} (the runtime of {spec.kind} type '{spec.type}')") from None


def _wrong_class(spec: NodeSpec, cls: object) -> TypeError:
    return TypeError(f"{spec.node_type.implementation} (the runtime of {spec.kind} type '{spec.type}') is "
                     f"{cls!r}, not a {spec.kind} node class")


def source_class(spec: NodeSpec) -> type[Source]:
    if issubclass(cls := _implementation(spec), Source):
        return cls
    raise _wrong_class(spec, cls)


def transform_class(spec: NodeSpec) -> type[Transform]:
    if issubclass(cls := _implementation(spec), Transform):
        return cls
    raise _wrong_class(spec, cls)


def sink_class(spec: NodeSpec) -> type[Sink]:
    if issubclass(cls := _implementation(spec), Sink):
        return cls
    raise _wrong_class(spec, cls)


def node_class(spec: NodeSpec) -> type[Source] | type[Transform] | type[Sink]:
    """The runtime class of ``spec``'s type, imported on first use and checked against its kind."""
    if spec.kind == "source":
        return source_class(spec)
    if spec.kind == "transform":
        return transform_class(spec)
    return sink_class(spec)


def _instantiate(spec: NodeSpec, ctx: NodeContext) -> Source | Transform | Sink:
    return node_class(spec)(ctx)


def settings_warnings(spec: PipelineSpec, settings: Settings) -> list[str]:
    """What each node type of ``spec`` says about settings keys without effect
    (``Node.ineffective_settings``), sources' first: each type asked once, each line kept once, so
    two types reading the same connection (a Kafka and a hybrid source) do not repeat it."""
    out: list[str] = []
    for cls in dict.fromkeys(node_class(node) for node in [*spec.sources, *spec.transforms, *spec.sinks]):
        out += [line for line in cls.ineffective_settings(settings) if line not in out]
    return out


def build_plan(spec: PipelineSpec, settings: Settings, dry_run: bool = False) -> Plan:
    keys = effective_keys(spec)
    plan = Plan(spec=spec, settings=settings, flows=split_flows(spec), keys=keys)
    # The plan's dynamic tables by node name: each DynamicTableTransform registers its backend,
    # SQL transforms calling dynamic_table_check look it up (see streamling.functions.dynamic_table).
    dynamic_tables: dict[str, DynamicTableBackend] = {}

    def context(node: NodeSpec, scope: str) -> NodeContext:
        return NodeContext(spec=node, settings=settings, primary_key=keys[node.name],
                           state_dir=settings.state_dir, dry_run=dry_run, scope=scope,
                           dynamic_tables=dynamic_tables)

    for i, flow in enumerate(plan.flows):
        scope = f"f{i}"
        typed = FlowNodes([source_class(s)(context(s, scope)) for s in flow.sources],
                          [transform_class(t)(context(t, scope)) for t in flow.transforms],
                          [sink_class(s)(context(s, scope)) for s in flow.sinks])
        plan.flow_nodes[flow.name] = typed
        plan.nodes.update((node.name, node) for node in typed.all)
    for node in spec.topological():
        if node.name not in plan.nodes:
            plan.nodes[node.name] = _instantiate(node, context(node, "p"))
    _report_ineffective_keys(plan)
    _check_cluster_storage(plan)
    for flow in plan.flows:
        alone = [source for source in plan.sources(flow) if source.exclusive_in_flow is not None]
        if alone and len(flow.sources) > 1:
            others = [s.name for s in flow.sources if s.name != alone[0].name]
            raise StreamlingError(
                f"{alone[0].ctx.spec.type} source '{alone[0].name}' shares a flow with {others}: "
                f"{alone[0].exclusive_in_flow}", code="hybrid_not_alone",
                hint="give the other sources their own transforms and sinks")
    if settings.job_mode:
        unbounded = [s.name for f in plan.flows for s in plan.sources(f) if not s.bounded]
        if unbounded:
            raise StreamlingError(
                f"job_mode is on but sources {json.dumps(unbounded)} do not support it",
                code="job_mode_unbounded", hint="use bounded sources (file with mode: bounded, generate with rows) "
                "or turn job_mode off")
    return plan


def _check_cluster_storage(plan: Plan) -> None:
    """On a cluster of several hosts, refuse every path that would not be the same folder on each
    host (all problems at once), and the SQLite state backend, a file on the driver host's disk.

    A checkpoint on one host's disk is only lost with that host (the driver writes it alone), so a
    local absolute ``state_dir`` is allowed with a warning; tables and file folders that executors
    write or read are refused, since each host would see its own."""
    settings = plan.settings
    master = settings.spark.master
    if not storage.is_multi_host(master):
        return
    problems: list[StreamlingError] = []
    state_dir = settings.state_dir
    if (problem := storage.cluster_path_problem(state_dir, master, "state_dir", written_by_executors=False)):
        problems.append(StreamlingError(problem, code="cluster_path"))
    elif storage.is_local(state_dir):
        log.warning("state_dir '%s' is on the driver host's disk: a driver relaunched on another host of %s starts "
                    "without these checkpoints; put state_dir on shared storage (hdfs://, s3a://) to move drivers",
                    state_dir, master)
    if normalize_backend(settings.state_backend.backend_type) == "sqlite":
        problems.append(StreamlingError(
            f"the Sqlite state backend keeps its file on the driver host's disk "
            f"({settings.state_backend.sqlite.database_path}), which a cluster at {master} cannot share",
            code="cluster_state_backend",
            hint="use state_backend.backend_type: Postgres on a cluster (STREAMLING__STATE_BACKEND__BACKEND_TYPE)"))
    for node in plan.nodes.values():
        for key, path in node.shared_paths().items():
            if (problem := storage.cluster_path_problem(path, master, key, written_by_executors=True)):
                problems.append(node.ctx.error(problem, code="cluster_path"))
    if problems:
        raise ValidationError(problems)


def _report_ineffective_keys(plan: Plan) -> None:
    """Warn once per plan about every key that is set and does nothing here (``--validate`` lists
    the warnings): Streamling keys are accepted so pipelines load unchanged, never silently ignored."""
    for key, why in plan.settings.ineffective_keys():
        log.warning("config key '%s' has no effect here: %s", key, why)
    for warning in settings_warnings(plan.spec, plan.settings):  # connection keys, said by the types using them
        log.warning("%s", warning)
    for node in plan.nodes.values():
        for key, why in node.ineffective_keys().items():
            log.warning("%s: '%s' has no effect here: %s", node.ctx.spec.label, key, why)


def _check_sink_keys(plan: Plan) -> list[StreamlingError]:
    """A sink without a primary key cannot apply updates or deletes by key: a warning, or an error
    with ``enforce_primary_keys`` (Streamling's switch)."""
    problems: list[StreamlingError] = []
    for spec in plan.spec.sinks:
        if plan.keys.get(spec.name):
            continue
        sink = plan.nodes[spec.name]
        if isinstance(sink, Sink) and sink.primary_key_reason is not None:
            problems.append(sink.missing_key_error())
            continue
        message = ("no primary key (none declared, none inherited from its inputs): updates and deletes cannot "
                   "be matched to earlier rows")
        hint = "declare primary_key on the sink or on a node upstream"
        if plan.settings.enforce_primary_keys:
            problems.append(spec.error(f"{message}, and enforce_primary_keys is on", hint=hint,
                                       code="primary_key_missing"))
        else:
            log.warning("%s: %s; %s", spec.label, message, hint)
    return problems


def format_pk_error(node: str, missing: list[str], available: list[str]) -> str:
    """Streamling's exact message, so scripts that grep for it keep working."""
    return (f"Primary key validation failed for node '{node}': columns {json.dumps(missing, separators=(', ', ':'))} "
            f"not found in schema. Available columns: {json.dumps(available, separators=(', ', ':'))}")


def analyze(plan: Plan, spark: SparkSession) -> None:
    """Resolve every node's output schema on empty batches and check primary keys against them.

    All problems are collected and raised together. This is what ``--dry-run``/``--validate`` add
    on top of the static checks, and what the runtime does before starting any query.
    """
    problems: list[StreamlingError] = []
    inferred_keys: dict[str, list[str]] = {}
    for flow in plan.flows:
        frames: dict[str, Any] = {}
        typed = plan.flow_nodes[flow.name]
        steps: list[Source | Transform] = [*typed.sources, *typed.transforms]
        for node in steps:
            node_spec = node.ctx.spec
            try:
                if isinstance(node, Source):
                    schema = node.decode(node.read_stream(spark), None).schema
                    if not node_spec.options.primary_key:
                        inferred = node.inferred_primary_key()
                        if inferred:
                            inferred_keys[node_spec.name] = inferred
                            plan.keys = effective_keys(plan.spec, inferred_keys)
                            for name, key in plan.keys.items():
                                plan.nodes[name].ctx.primary_key = key
                else:
                    inputs = {u: frames[u] for u in node_spec.upstream}
                    schema = node.apply(spark, inputs, None).schema
            except StreamlingError as exc:
                problems.append(exc)
                break
            plan.schemas[node_spec.name] = schema
            frames[node_spec.name] = spark.createDataFrame([], schema)
        for sink_spec in flow.sinks:
            ups = [plan.schemas[u] for u in sink_spec.upstream if u in plan.schemas]
            if ups:
                plan.schemas[sink_spec.name] = ups[0]
                plan.nodes[sink_spec.name].ctx.input_schema = ups[0]
    failed: set[str] = set()
    for spec in plan.spec.topological():
        if spec.name not in plan.schemas:
            continue
        schema = plan.schemas[spec.name]
        columns = [f.name for f in schema.fields]
        declared = parse_key(spec.options.primary_key)
        if not declared and any(u in failed for u in spec.upstream):
            failed.add(spec.name)  # the same inherited key was already reported upstream
            continue
        missing = [c for c in (declared or plan.keys.get(spec.name, [])) if c not in columns]
        if missing:
            failed.add(spec.name)
            problems.append(StreamlingError(format_pk_error(spec.name, missing, columns),
                                            code="primary_key_missing"))
    problems += _check_sink_keys(plan)
    if problems:
        raise ValidationError(problems)
    _check_event_times(plan)


def _check_event_times(plan: Plan) -> None:
    """A node whose ``telemetry.event_time`` names no timestamp or number column of its output is
    told once per run, as Streamling logs it; its rows flow and its event-time series stay empty.
    The verdict is kept in ``plan.event_time_kinds`` for the flows, which then never touch the column."""
    for spec in plan.spec.topological():
        event_time = spec.options.telemetry.event_time if spec.options.telemetry is not None else None
        schema = plan.schemas.get(spec.name)
        if event_time is None or schema is None:
            continue
        plan.event_time_kinds[spec.name] = event_time_kind(spec.label, spec.kind, event_time.column, schema)


def event_time_kind(label: str, kind: str, column: str, schema: StructType) -> str | None:
    """``"timestamp"``, ``"timestamp_ntz"`` or ``"number"`` when ``column`` of ``schema`` can be an
    event time; otherwise None, after one warning naming the node and why."""
    from pyspark.sql.types import NumericType, TimestampNTZType, TimestampType

    field = next((f for f in schema.fields if f.name == column), None)
    if field is None:
        why = f"its {'input' if kind == 'sink' else 'output'} has no column '{column}'" + \
            did_you_mean(column, [f.name for f in schema.fields])
    elif isinstance(field.dataType, TimestampType):
        return "timestamp"
    elif isinstance(field.dataType, TimestampNTZType):
        return "timestamp_ntz"
    elif isinstance(field.dataType, NumericType):
        return "number"
    else:
        why = f"column '{column}' is {field.dataType.simpleString()}, not a timestamp or a number"
    log.warning("%s: event-time instrumentation skipped: %s (telemetry.event_time.column)", label, why)
    return None
