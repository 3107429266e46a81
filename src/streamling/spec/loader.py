"""YAML loading that remembers where every key came from, so errors can cite a line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from streamling.errors import Location, StreamlingError


@dataclass
class LoadedDocument:
    """Plain data plus ``path → line`` for every mapping key and sequence item."""

    data: Any
    lines: dict[str, int] = field(default_factory=dict)
    source: str = "<pipeline>"

    def line(self, path: str) -> int | None:
        """The line of ``path`` or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path.rpartition(".")[0]
        return None

    def location(self, path: str) -> Location:
        return Location(path or "<root>", self.line(path))


def _join(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


_MERGE = "tag:yaml.org,2002:merge"


def _walk(node: yaml.Node, path: str, lines: dict[str, int]) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        inherited: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                _merge(value_node, path, key_node.start_mark.line + 1, inherited, lines)
                continue
            key = _scalar(key_node)
            child = _join(path, key)
            if key in out:
                raise StreamlingError(
                    f"key '{key}' appears twice{' under ' + repr(path) if path else ''}; the second would "
                    "silently replace the first", location=Location(child, key_node.start_mark.line + 1),
                    code="yaml_duplicate_key", hint="rename or remove one of them")
            lines[child] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, child, lines)
        if inherited:
            out = {**{k: v for k, v in inherited.items() if k not in out}, **out}
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            child = _join(path, i)
            lines[child] = item.start_mark.line + 1
            items.append(_walk(item, child, lines))
        return items
    return _scalar(node)


def _merge(value: yaml.Node, path: str, line: int, into: dict[Any, Any], lines: dict[str, int]) -> None:
    """``<<: *anchor`` (or a list of anchors): YAML's merge key, as Databricks' bundle examples use
    it. Keys the mapping sets itself win; among merged mappings the first that has a key wins."""
    for source in value.value if isinstance(value, yaml.SequenceNode) else [value]:
        if not isinstance(source, yaml.MappingNode):
            raise StreamlingError("a merge key (<<) takes a mapping or a list of mappings, e.g. <<: *defaults",
                                  location=Location(path or "<root>", line), code="yaml_merge",
                                  hint="anchor a mapping (&name) and merge it with <<: *name")
        for key, item in _walk(source, path, {}).items():
            if key not in into:
                into[key] = item
                lines.setdefault(_join(path, key), line)


_CONSTRUCTOR = yaml.SafeLoader("")


def _scalar(node: yaml.Node) -> Any:
    return _CONSTRUCTOR.construct_object(node, deep=True)


def parse_yaml(text: str, source: str = "<pipeline>") -> LoadedDocument:
    """Parse one YAML document; a syntax error names the line and column."""
    lines: dict[str, int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        # Building scalars can fail too (an unknown ``!!tag``): report it like a syntax error.
        data = _walk(root, "", lines) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark else None
        col = f" at column {mark.column + 1}" if mark else ""
        problem, where = str(exc.problem or exc), exc.context_mark
        if exc.context and problem.startswith("but "):  # "expected a single document…, but found…"
            problem = f"{exc.context}, {problem}"
        elif exc.context and where and mark and where.line != mark.line:  # e.g. an unclosed quote
            col += f" ({exc.context} started on line {where.line + 1})"
        raise StreamlingError(
            f"{source} is not valid YAML: {problem}{col}",
            location=Location("<root>", line), code="yaml_syntax",
            hint="fix the indentation or quoting at that line",
        ) from exc
    except yaml.YAMLError as exc:
        raise StreamlingError(f"{source} is not valid YAML: {exc}", code="yaml_syntax") from exc
    return LoadedDocument(data=data, lines=lines, source=source)


def load_yaml_file(path: str | Path, rewrite: Callable[[str], str] | None = None) -> LoadedDocument:
    """The YAML at ``path``; ``rewrite`` turns its text into the text to parse (preprocessor plugins)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError as exc:
        raise StreamlingError(
            f"pipeline file {p} does not exist", code="pipeline_missing",
            hint="pass a pipeline file or set pipeline_definition_location",
        ) from exc
    except OSError as exc:
        raise StreamlingError(f"cannot read pipeline file {p}: {exc}", code="pipeline_unreadable") from exc
    return parse_yaml(rewrite(text) if rewrite is not None else text, source=str(p))
