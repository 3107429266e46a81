"""What a definition cell checks on its own, when it runs, without a JVM.

The whole notebook pipeline goes through the same validation as ``--validate`` (so the messages
are the same), and the cell keeps the problems of *its* node: an unknown type, an unknown or
missing key, SQL that does not parse, ``from`` naming a sink. A reference to a node no cell has
defined yet is not an error here: cells may be written in any order and run top to bottom, so it
is only noted, and ``validate``/``show``/``run`` fail if it is still missing then. Problems of
other nodes were reported by their own cells; whole-pipeline ones (no sink yet, nodes without
consumers) are what an unfinished notebook looks like.

A cell also builds its node and what it reads as ``--validate`` does (``resolved_schema``), which
needs no JVM: a script that does not load fails its own cell. When the kernel already has a Spark
session, it also resolves the node's output schema, as ``show`` does but for the node and what it
reads only: analysis on empty batches, no job over data. Without a warm session nothing starts a
JVM.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from streamling.errors import StreamlingError, ValidationError
from streamling.spec import PipelineSpec, parse_pipeline
from streamling.spec.nodes import REGISTRY
from streamling.spec.pipeline import SECTIONS, Kind

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamling.config import Settings

log = logging.getLogger(__name__)

#: How validation words a reference to a name no node has (``from``, SQL ``FROM``,
#: ``dynamic_table_check``): in a notebook, possibly a node of a later cell.
NOT_DEFINED_YET = ("which does not exist", "which is not a source or transform",
                   "but not defined in pipeline topology")

#: Whole-pipeline problems reported at a node's path without its name: a node nothing reads yet
#: is the latest cell of a notebook being written, not a mistake in it.
UNFINISHED = ("orphan_nodes",)


@dataclass
class CellCheck:
    """The cell's node: its problems, and its references to nodes not defined (yet)."""

    errors: list[StreamlingError] = field(default_factory=list)
    undefined: list[StreamlingError] = field(default_factory=list)


def check_node(yaml_text: str, kind: Kind, name: str) -> CellCheck:
    """Validate the notebook's pipeline (``yaml_text``) and keep what concerns node ``name``."""
    try:
        parse_pipeline(yaml_text, source="<notebook>")
    except ValidationError as exc:
        problems = exc.problems
    except StreamlingError as exc:
        problems = [exc]
    else:
        return CellCheck()
    section = next(s for s, k in SECTIONS.items() if k == kind)
    check = CellCheck()
    for problem in problems:
        if problem.code in UNFINISHED:
            continue
        path = problem.location.path if problem.location else ""
        # A node without a valid 'type' is reported at its own path, without a node name.
        if problem.node != name and not (problem.node is None and path == f"{section}.{name}"):
            continue
        if any(marker in problem.message for marker in NOT_DEFINED_YET):
            check.undefined.append(problem)
        else:
            check.errors.append(problem)
    return check


#: Names of the blackhole sinks ``resolved_schema`` adds so an unfinished notebook (no sink yet,
#: a node nothing reads yet) still parses; no user node is named so.
PROBE_SINK = "__streamling_schema_probe_{}"


@dataclass
class NodeSchema:
    """A node's resolved output schema (a sink's: its input's), as ``show`` lists it."""

    node: str
    columns: list[tuple[str, str]]
    primary_key: list[str]


def resolved_schema(document: dict[str, Any], name: str, settings: Settings,
                    spark: SparkSession | None) -> NodeSchema | None:
    """Node ``name``'s schema, resolved on empty batches of the node and the nodes it reads.

    A problem of the node itself (an unknown column in its SQL, a key it does not have, a script
    that does not load) raises the error ``show`` gives for it. The node is always built as
    ``--validate`` builds it, which needs no JVM; without a ``spark`` session nothing is analysed
    and the result is ``None``, as it is when the pipeline around the node does not plan yet
    (another node's problem, reported by that node's cell and by ``show``).
    """
    from streamling.runtime.planner import analyze, build_plan

    spec = _spec_upto(document, name)
    if spec is None:
        return None
    try:
        plan = build_plan(spec, settings, dry_run=True)
    except StreamlingError as exc:
        _raise_own(exc, name)
        return None
    if spark is None:
        return None
    try:
        analyze(plan, spark)
    except StreamlingError as exc:
        _raise_own(exc, name)
    except Exception:  # noqa: BLE001 - a stopped session or a dead JVM: nobody's node to blame here
        log.debug("resolving the schema of '%s'", name, exc_info=True)
        return None
    schema = plan.schemas.get(name)
    if schema is None:
        return None
    return NodeSchema(name, [(f.name, f.dataType.simpleString()) for f in schema.fields], plan.keys.get(name, []))


def _spec_upto(document: dict[str, Any], name: str) -> PipelineSpec | None:
    """The notebook's pipeline cut down to ``name`` and its ancestors (what analysing it needs)."""
    try:
        spec = parse_pipeline(yaml.safe_dump(_with_probe_sinks(document), sort_keys=False), source="<notebook>")
    except (StreamlingError, yaml.YAMLError):
        return None
    if name not in spec.nodes:
        return None
    keep: set[str] = set()
    pending = [name]
    while pending:
        node = spec.nodes[pending.pop()]
        if node.name not in keep:
            keep.add(node.name)
            pending += [*node.upstream, *node.requires]
    return PipelineSpec({n: node for n, node in spec.nodes.items() if n in keep}, source=spec.source)


def _with_probe_sinks(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with a blackhole sink reading each source and transform: validation then has
    nothing to say about missing sinks and unread nodes, which a notebook being written has."""
    producers = [n for kind, section in (("source", "sources"), ("transform", "transforms"))
                 for n, body in (document.get(section) or {}).items() if _produces_rows(kind, body)]
    probes = {PROBE_SINK.format(i): {"type": "blackhole", "from": [n]} for i, n in enumerate(producers)}
    return {**document, "sinks": {**(document.get("sinks") or {}), **probes}}


def _produces_rows(kind: str, body: object) -> bool:
    """Whether a node of this body has rows to read (a dynamic table is a set of values): its type says."""
    node_type = REGISTRY[kind].get(str(body.get("type"))) if isinstance(body, dict) else None
    return node_type is None or node_type.options.produces_rows


def _raise_own(exc: StreamlingError, name: str) -> None:
    """Raise the problems of node ``name`` among ``exc``'s, the others are their nodes' to report."""
    mine = [p for p in (exc.problems if isinstance(exc, ValidationError) else [exc]) if _concerns(p, name)]
    if mine:
        raise ValidationError(mine) from None


def _concerns(problem: StreamlingError, name: str) -> bool:
    """Whether a planning or analysis problem is about node ``name`` (a primary key check names
    its node in the message only)."""
    return problem.node == name or (problem.node is None and f"'{name}'" in problem.message)
