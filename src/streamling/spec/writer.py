"""Pipeline YAML as a person would write it: the reverse of ``streamling.spec.loader``.

The notebook's ``%streamling export`` and the bundle compiler write the same text, so both call
``pipeline_yaml`` here rather than one reaching into the other.
"""

from __future__ import annotations

from typing import Any

import yaml


class _BlockStr(str):
    """Multi-line text (SQL, scripts) written as a YAML ``|`` block instead of a quoted one-liner."""


def _block_representer(dumper: yaml.SafeDumper, value: _BlockStr) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style="|")


class _BlockDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that writes ``_BlockStr`` values as ``|`` blocks."""


_BlockDumper.add_representer(_BlockStr, _block_representer)


def _with_blocks(value: Any) -> Any:
    """``value`` with every multi-line string turned into a ``_BlockStr`` (ending in a newline, as a
    ``|`` block keeps it)."""
    if isinstance(value, dict):
        return {k: _with_blocks(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_blocks(v) for v in value]
    if isinstance(value, str) and "\n" in value:
        return _BlockStr(value if value.endswith("\n") else value + "\n")
    return value


def pipeline_yaml(document: dict[str, Any]) -> str:
    """A pipeline document as ``%streamling export`` writes it (and a bundle compiles a notebook):
    keys in their order, SQL and scripts as ``|`` blocks."""
    return yaml.dump(_with_blocks(document), Dumper=_BlockDumper, sort_keys=False, allow_unicode=True,
                     default_flow_style=False)
