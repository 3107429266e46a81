"""Pipeline specification: YAML loading with line numbers, node options and validation (no JVM).

The names below load ``streamling.spec.pipeline`` on first use: Spark's Python workers import
``streamling.spec.nodes`` (plugin options, types) and must not pay for the validator and the SQL
dialect they never run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamling.spec.pipeline import NodeSpec, PipelineSpec, build_pipeline, load_pipeline, parse_pipeline

__all__ = ["NodeSpec", "PipelineSpec", "build_pipeline", "load_pipeline", "parse_pipeline"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("streamling.spec.pipeline"), name)
    raise AttributeError(f"module 'streamling.spec' has no attribute {name!r}")
