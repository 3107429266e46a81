"""The pipeline model: load, check everything at once, and hand the planner a clean graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from streamling.errors import StreamlingError, ValidationError
from streamling.spec.loader import LoadedDocument, load_yaml_file, parse_yaml
from streamling.spec.nodes import REGISTRY, NodeType
from streamling.spec.options import (
    LABEL_KEY,
    MAX_LABEL_VALUE_BYTES,
    MAX_LABELS,
    RESERVED_LABELS,
    FromNodeOptions,
    NodeOptions,
    parse_key,
)
from streamling.spec.sql import DYNAMIC_TABLE_CHECK, analyze_sql, dynamic_table_sql_problems, expression_problems
from streamling.spec.transforms import DynamicTableTransformOptions, SqlTransformOptions
from streamling.util import did_you_mean

Kind = Literal["source", "transform", "sink"]
SECTIONS: dict[str, Kind] = {"sources": "source", "transforms": "transform", "sinks": "sink"}
TOP_LEVEL_EXTRA = {"name", "description", "version"}


@dataclass
class NodeSpec:
    """One node: its name, kind, validated options and resolved upstream names."""

    name: str
    kind: Kind
    node_type: NodeType
    options: NodeOptions
    path: str
    line: int | None = None
    upstream: list[str] = field(default_factory=list)
    #: nodes that must run earlier in the same epoch without feeding rows in: the dynamic tables
    #: an SQL transform queries with ``dynamic_table_check`` (so their ``sql`` fills them first).
    requires: list[str] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.node_type.name

    @property
    def label(self) -> str:
        """``sql transform 'x'`` — how messages name this node."""
        return f"{self.type} {self.kind} '{self.name}'"

    def error(self, message: str, **kwargs: Any) -> StreamlingError:
        return StreamlingError(message, node=self.name, node_kind=f"{self.type} {self.kind}", **kwargs)


@dataclass
class PipelineSpec:
    nodes: dict[str, NodeSpec]
    source: str = "<pipeline>"
    raw: dict[str, Any] = field(default_factory=dict)

    def of_kind(self, kind: Kind) -> list[NodeSpec]:
        return [n for n in self.nodes.values() if n.kind == kind]

    @property
    def sources(self) -> list[NodeSpec]:
        return self.of_kind("source")

    @property
    def transforms(self) -> list[NodeSpec]:
        return self.of_kind("transform")

    @property
    def sinks(self) -> list[NodeSpec]:
        return self.of_kind("sink")

    def consumers(self, name: str) -> list[NodeSpec]:
        return [n for n in self.nodes.values() if name in n.upstream]

    def topological(self) -> list[NodeSpec]:
        """Sources, then transforms in dependency order, then sinks."""
        done: list[str] = []
        pending = {n.name for n in self.transforms}
        done.extend(n.name for n in self.sources)
        while pending:
            ready = sorted(n for n in pending
                           if all(u in done for u in [*self.nodes[n].upstream, *self.nodes[n].requires]))
            if not ready:
                break
            done.extend(ready)
            pending.difference_update(ready)
        done.extend(n.name for n in self.sinks)
        return [self.nodes[n] for n in done]


def _yaml_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return f"the boolean {value!r}"
    return f"the value {value!r}" if isinstance(value, (int, float)) else f"the text {str(value)!r}"


class _Collector:
    def __init__(self, doc: LoadedDocument, prefix: str) -> None:
        self.doc = doc
        self.prefix = prefix
        self.problems: list[StreamlingError] = []

    def add(self, path: str, message: str, *, node: str | None = None, node_kind: str | None = None,
            hint: str | None = None, code: str = "invalid_pipeline") -> None:
        full = f"{self.prefix}{path}" if path else self.prefix.rstrip(".")
        self.problems.append(StreamlingError(message, node=node, node_kind=node_kind, hint=hint,
                                             code=code, location=self.doc.location(full)))


def _model_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The keys allowed at ``loc`` inside ``model`` (``telemetry`` → labels, event_time)."""
    current = model
    hidden: frozenset[str] = getattr(model, "not_accepted", frozenset()) if not loc else frozenset()
    for part in loc:
        found = next((f for k, f in current.model_fields.items() if part in (k, f.alias)), None)
        args = (found.annotation, *get_args(found.annotation)) if found else ()
        nested = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nested is None:
            return []
        current = nested
    return sorted({(f.alias or k) for k, f in current.model_fields.items() if k not in hidden})


def _pydantic_problems(col: _Collector, path: str, exc: PydanticValidationError, model: type[NodeOptions],
                       name: str, node_kind: str) -> None:
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = ".".join([path, *loc]) if loc else path
        key = loc[-1] if loc else ""
        if err["type"] == "extra_forbidden":
            fields = _model_keys(model, loc[:-1])
            allowed = f"; allowed keys: {', '.join(fields)}" if fields else ""
            msg = f"unknown key '{key}'{did_you_mean(key, fields)}{allowed}"
        elif err["type"] == "missing":
            msg = f"missing required key '{key}'"
        else:
            text = err["msg"].removeprefix("Value error, ")
            if text.startswith("Input should be"):  # pydantic's wording; say what was given
                text = text.replace("Input should be", "must be", 1)
                if isinstance(err.get("input"), (str, int, float, bool)):
                    text += f" (got {err['input']!r})"
            msg = f"{'.'.join(loc) + ': ' if loc else ''}{text}"
        col.add(where, msg, node=name, node_kind=node_kind)


#: Streamling node types this build does not run yet: named as such, not as typos.
NOT_YET_AVAILABLE: dict[Kind, set[str]] = {"source": {"delta"}, "transform": set(), "sink": set()}


def _unknown_type(kind: Kind, type_name: str, available: list[str]) -> str:
    """Why ``type_name`` cannot be used: a Streamling type not built yet, a plugin id (``ns.name``) no
    installed plugin provides (Streamling's "… is not available"), or a typo with a did-you-mean.
    Built-in types and installed plugins are listed apart: what is built in does not change with
    what is installed."""
    from streamling.plugins.discovery import FAILURES
    from streamling.plugins.registry import ids

    plugins = ids(kind)
    builtins = [t for t in available if t not in plugins]
    listing = f"available {kind} types: {', '.join(builtins)}"
    broken = "".join(f"; plugin {f.origin} failed to load: {f.message}" for f in FAILURES)
    if type_name in NOT_YET_AVAILABLE[kind]:
        return f"{kind} type '{type_name}' is not available in this build yet; {listing}"
    if "." in type_name:
        return (f"{kind} type '{type_name}' is not available: no installed plugin provides it "
                f"(installed {kind} plugins: {', '.join(plugins) or 'none'}){broken}")
    return f"unknown {kind} type '{type_name}'{did_you_mean(type_name, available)}; {listing}{broken}"


def _check_labels(col: _Collector, spec: NodeSpec) -> None:
    telemetry = spec.options.telemetry
    if telemetry is None:
        return
    labels = telemetry.labels
    base = f"{spec.path}.telemetry.labels"
    kind = f"{spec.type} {spec.kind}"
    if len(labels) > MAX_LABELS:
        col.add(base, f"at most {MAX_LABELS} telemetry labels are allowed, found {len(labels)}",
                node=spec.name, node_kind=kind)
    reserved = RESERVED_LABELS | spec.node_type.reserved_labels
    for key, value in labels.items():
        where = f"{base}.{key}"
        if not LABEL_KEY.match(key):
            col.add(where, f"label key '{key}' must match ^[a-zA-Z_][a-zA-Z0-9_]*$", node=spec.name,
                    node_kind=kind)
        elif key.startswith("__"):
            col.add(where, f"label key '{key}' must not start with '__'", node=spec.name, node_kind=kind)
        elif key in reserved:
            col.add(where, f"label key '{key}' is reserved (reserved here: {', '.join(sorted(reserved))})",
                    node=spec.name, node_kind=kind)
        size = len(value.encode())
        if size > MAX_LABEL_VALUE_BYTES:
            col.add(where, f"label '{key}' is {size} bytes long; at most {MAX_LABEL_VALUE_BYTES} are allowed",
                    node=spec.name, node_kind=kind)
        if any(ord(ch) < 32 and ch != "\t" for ch in value):
            col.add(where, f"label '{key}' contains a control character", node=spec.name, node_kind=kind)


def _check_expectations(col: _Collector, spec: NodeSpec) -> None:
    """Each expectation's condition is a boolean expression over the row, in Streamling's SQL."""
    if not isinstance(spec.options, FromNodeOptions):
        return
    for i, expectation in enumerate(spec.options.expectations):
        for problem in expression_problems(expectation.condition):
            col.add(f"{spec.path}.expectations[{i}].condition", f"expectation '{expectation.name}': {problem}",
                    node=spec.name, node_kind=f"{spec.type} {spec.kind}")


def build_pipeline(doc: LoadedDocument) -> PipelineSpec:
    """Validate a loaded document; raise ``ValidationError`` listing every problem found."""
    from streamling.plugins.discovery import load_plugins

    load_plugins()  # plugin types are node types: known before the first node is read
    data = doc.data
    prefix = ""
    col = _Collector(doc, "")
    if isinstance(data, dict) and "definition" in data and not (set(data) & set(SECTIONS)):
        data, prefix = data["definition"], "definition."
        col.prefix = prefix
    if not isinstance(data, dict):
        found = "the file is empty" if data is None else f"found {_yaml_kind(data)}"
        col.add("", f"a pipeline must be a mapping with 'sources', 'transforms' and 'sinks'; {found}")
        raise ValidationError(col.problems)

    for key in data:
        if key not in SECTIONS and key not in TOP_LEVEL_EXTRA:
            col.add(str(key), f"unknown top-level key '{key}'{did_you_mean(str(key), list(SECTIONS))}; "
                              "expected sources, transforms and sinks")

    nodes: dict[str, NodeSpec] = {}
    declared: dict[str, Kind] = {}
    for section, kind in SECTIONS.items():
        if isinstance(data.get(section), dict):
            for name in data[section]:
                declared.setdefault(str(name), kind)
    for section, kind in SECTIONS.items():
        entries = data.get(section)
        if entries is None:
            if section != "transforms":
                col.add(section if section in data else "", f"the pipeline has no {section}",
                        hint=f"add at least one entry under '{section}:'")
            continue
        if not isinstance(entries, dict):
            col.add(section, f"'{section}' must be a mapping from node name to definition")
            continue
        if not entries and section != "transforms":
            col.add(section, f"the pipeline has no {section}", hint=f"add at least one entry under '{section}:'")
        for name, body in entries.items():
            name = str(name)
            path = f"{section}.{name}"
            if name in nodes:
                col.add(path, f"node name '{name}' is used twice (also a {nodes[name].kind})",
                        hint="node names are shared by sources, transforms and sinks; rename one")
                continue
            if not isinstance(body, dict):
                col.add(path, f"{kind} '{name}' must be a mapping with a 'type'")
                continue
            type_name = body.get("type")
            available = sorted(REGISTRY[kind])
            if not type_name and kind == "transform" and "sql" in body:
                # Streamling reads a transform with only ``sql:`` as a SQL transform.
                type_name = "sql"
                body = {**body, "type": "sql"}
            if not type_name:
                col.add(path, f"{kind} '{name}' has no 'type'; available {kind} types: {', '.join(available)}")
                continue
            node_type = REGISTRY[kind].get(str(type_name))
            if node_type is None:
                col.add(f"{path}.type", _unknown_type(kind, str(type_name), available), node=name, node_kind=kind)
                continue
            try:
                options = node_type.options.model_validate(body)
            except PydanticValidationError as exc:
                _pydantic_problems(col, path, exc, node_type.options, name, f"{type_name} {kind}")
                continue
            spec = NodeSpec(name=name, kind=kind, node_type=node_type, options=options, path=prefix + path,
                            line=doc.line(prefix + path))
            nodes[name] = spec
            _check_labels(col, spec)
            _check_expectations(col, spec)

    _resolve_edges(col, nodes, declared, prefix)
    if not col.problems:
        _check_options(col, nodes, prefix)
    if col.problems:
        col.problems.sort(key=lambda p: (p.location.line or 0) if p.location else 0)
        raise ValidationError(col.problems)
    return PipelineSpec(nodes=nodes, source=doc.source, raw=data)


def _resolve_edges(col: _Collector, nodes: dict[str, NodeSpec], declared: dict[str, Kind], prefix: str) -> None:
    """Resolve ``from`` and SQL references. Names declared but invalid were already reported,
    so references to them are not reported a second time."""
    producers = {n.lower(): n for n, k in declared.items() if k != "sink"}
    uses: dict[str, list[str]] = {}  # SQL transform → the dynamic tables it checks
    for spec in nodes.values():
        path = spec.path.removeprefix(prefix)
        kind = f"{spec.type} {spec.kind}"
        if spec.kind == "source":
            for key, predicate in spec.options.predicates().items():
                for problem in expression_problems(predicate):
                    col.add(f"{path}.{key}", f"{key.rpartition('.')[2]}: {problem}", node=spec.name, node_kind=kind)
            continue
        assert isinstance(spec.options, FromNodeOptions)
        declared_from = spec.options.from_
        if isinstance(spec.options, DynamicTableTransformOptions) and spec.options.sql is None:
            continue  # filled outside the pipeline: no input
        if isinstance(spec.options, (SqlTransformOptions, DynamicTableTransformOptions)):
            assert spec.options.sql is not None
            analysis = analyze_sql(spec.options.sql)
            if analysis.parse_error:
                col.add(f"{path}.sql", f"SQL does not parse: {analysis.parse_error}", node=spec.name, node_kind=kind)
                continue
            for problem in analysis.problems:
                col.add(f"{path}.sql", problem, node=spec.name, node_kind=kind)
            if isinstance(spec.options, DynamicTableTransformOptions) and not analysis.problems:
                for problem in dynamic_table_sql_problems(spec.options.sql):
                    col.add(f"{path}.sql", problem, node=spec.name, node_kind=kind,
                            hint="compute the value in an SQL transform and fill the table from it")
            if analysis.dynamic_tables:
                uses[spec.name] = analysis.dynamic_tables
            refs = []
            for table in analysis.tables:
                target = producers.get(table.lower())
                if target is None:
                    col.add(f"{path}.sql", f"SQL reads '{table}', which is not a source or transform"
                                           f"{did_you_mean(table, list(producers.values()))}",
                            node=spec.name, node_kind=kind)
                elif declared_from and target not in declared_from:
                    col.add(f"{path}.sql", f"SQL reads '{table}' but 'from' lists only {', '.join(declared_from)}",
                            node=spec.name, node_kind=kind, hint=f"add '{table}' to 'from'")
                elif target in nodes:
                    refs.append(target)
            if not declared_from:
                spec.upstream = list(dict.fromkeys(refs))
                if not analysis.tables and not analysis.problems:
                    col.add(f"{path}.sql", "SQL reads no upstream node", node=spec.name, node_kind=kind,
                            hint="select FROM a source or transform name")
                continue
        if not declared_from:
            col.add(f"{path}.from", "missing required key 'from'", node=spec.name, node_kind=kind,
                    hint=f"name the source or transform this {spec.kind} reads")
            continue
        for upstream in declared_from:
            if declared.get(upstream) == "sink":
                col.add(f"{path}.from", f"'from' names sink '{upstream}'; only sources and transforms produce rows",
                        node=spec.name, node_kind=kind)
            elif upstream not in declared:
                col.add(f"{path}.from", f"'from' names '{upstream}', which does not exist"
                                        f"{did_you_mean(upstream, list(producers.values()))}",
                        node=spec.name, node_kind=kind)
        spec.upstream = [u for u in declared_from if u in nodes and nodes[u].kind != "sink"]

    _resolve_dynamic_tables(col, nodes, declared, prefix, uses)

    # Cycles among transforms.
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for up in [*nodes[name].upstream, *nodes[name].requires]:
            if nodes[up].kind != "transform":
                continue
            if state.get(up) == 1:
                cycle = trail[trail.index(up):] + [up] if up in trail else [name, up]
                col.add(nodes[name].path.removeprefix(prefix),
                        f"transforms form a cycle: {' -> '.join(reversed(cycle))}", node=name,
                        node_kind=f"{nodes[name].type} transform")
            elif up not in state:
                visit(up, trail + [up])
        state[name] = 2

    for spec in nodes.values():
        if spec.kind == "transform" and spec.name not in state:
            visit(spec.name, [spec.name])

    consumed = {u for n in nodes.values() for u in n.upstream}
    orphans = [n for n in nodes.values() if n.kind != "sink" and n.name not in consumed and n.options.produces_rows]
    if orphans and not col.problems:
        names = ", ".join(f"'{n.name}'" for n in orphans)
        col.problems.append(StreamlingError(
            f"nodes [{names}] have no consumers", code="orphan_nodes",
            location=col.doc.location(orphans[0].path),
            hint="read them from a transform or sink, or remove them"))


def _resolve_dynamic_tables(col: _Collector, nodes: dict[str, NodeSpec], declared: dict[str, Kind], prefix: str,
                            uses: dict[str, list[str]]) -> None:
    """Dynamic tables produce no rows, are named by ``dynamic_table_check``'s literal, and a table
    filled by ``sql`` may only be checked by transforms that read the same input (Streamling's rule:
    the table is filled from the very batch being checked)."""
    tables = {n for n, s in nodes.items() if isinstance(s.options, DynamicTableTransformOptions)}
    for spec in nodes.values():
        kind = f"{spec.type} {spec.kind}"
        path = spec.path.removeprefix(prefix)
        read = [u for u in spec.upstream if u in tables]
        if read:
            declared_from = isinstance(spec.options, FromNodeOptions) and spec.options.from_
            where = f"{path}.from" if declared_from else f"{path}.sql"
            col.add(where, f"reads dynamic table '{read[0]}', which produces no rows",
                    node=spec.name, node_kind=kind,
                    hint=f"query it with {DYNAMIC_TABLE_CHECK}('{read[0]}', value) in an SQL transform")
            spec.upstream = [u for u in spec.upstream if u not in tables]
        if isinstance(spec.options, DynamicTableTransformOptions) and spec.upstream:
            source = nodes[spec.upstream[0]]
            if source.kind == "transform" and source.name in uses and spec.name in uses[source.name]:
                col.add(f"{path}.sql", f"reads '{source.name}', which checks this dynamic table: the table would "
                                       "be filled from rows that depend on it", node=spec.name, node_kind=kind)
                spec.upstream = []
    for name, used in uses.items():
        spec = nodes[name]
        kind = f"{spec.type} {spec.kind}"
        path = f"{spec.path.removeprefix(prefix)}.sql"
        for table in used:
            target = nodes.get(table)
            if table not in declared:
                close = did_you_mean(table, sorted(n for n, k in declared.items() if k == "transform"))
                col.add(path, f"dynamic table '{table}' is used in SQL transform but not defined in pipeline "
                              f"topology{close}", node=name, node_kind=kind,
                        hint=f"add a transform of type dynamic_table named '{table}', or fix the name")
            elif target is None:
                continue  # declared but invalid: already reported
            elif table not in tables:
                col.add(path, f"{DYNAMIC_TABLE_CHECK} names '{table}', which is a {target.type} {target.kind}, "
                              "not a dynamic_table", node=name, node_kind=kind)
            else:
                spec.requires.append(table)
                if target.upstream and target.upstream[0] not in spec.upstream:
                    reads = ", ".join(f"'{u}'" for u in spec.upstream) or "nothing"
                    col.add(path, f"dynamic table '{table}' is filled from '{target.upstream[0]}' but this "
                                  f"transform reads {reads}; a transform that calls {DYNAMIC_TABLE_CHECK} on a "
                                  "table with 'sql' must read the same input", node=name, node_kind=kind,
                            hint=f"read '{target.upstream[0]}' here, or fill '{table}' from {reads}")


def _check_options(col: _Collector, nodes: dict[str, NodeSpec], prefix: str) -> None:
    """What each node's options find wrong in themselves (``NodeOptions.option_problems``), and a
    missing key where the node's type cannot run without one (``primary_key_required``)."""
    keys: dict[str, list[str] | None] = {}
    for spec in nodes.values():
        path = spec.path.removeprefix(prefix)
        hint = spec.options.primary_key_required
        if hint is not None and _declared_key(spec.name, nodes, keys) == []:
            col.add(path, f"{spec.label} requires a primary key", hint=hint)
        for problem in spec.options.option_problems():
            col.add(f"{path}.{problem.path}", problem.message, hint=problem.hint, node=spec.name,
                    node_kind=f"{spec.type} {spec.kind}")


def _declared_key(name: str, nodes: dict[str, NodeSpec], memo: dict[str, list[str] | None]) -> list[str] | None:
    """The node's effective key as the planner resolves it (own, else first keyed upstream);
    ``None`` when it may come from a registry that validation does not reach."""
    if name in memo:
        return memo[name]
    spec = nodes[name]
    result: list[str] | None = parse_key(spec.options.primary_key)
    if not spec.options.produces_rows:
        result = []
    elif not result:
        if spec.options.key_from_registry():
            result = None
        upstream = [_declared_key(u, nodes, memo) for u in spec.upstream if u in nodes]
        if any(upstream):
            result = next(k for k in upstream if k)
        elif any(k is None for k in upstream):
            result = None
    memo[name] = result
    return result


def load_pipeline(path: str | Path, rewrite: Callable[[str], str] | None = None) -> PipelineSpec:
    """Load and validate the pipeline at ``path``; ``rewrite`` preprocesses its text (plugins)."""
    return build_pipeline(load_yaml_file(path, rewrite))


def parse_pipeline(text: str, source: str = "<pipeline>") -> PipelineSpec:
    return build_pipeline(parse_yaml(text, source))
