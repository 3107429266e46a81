"""Pipeline specification: YAML loading with line numbers, node options and validation (no JVM)."""

from streamling.spec.pipeline import NodeSpec, PipelineSpec, build_pipeline, load_pipeline, parse_pipeline

__all__ = ["NodeSpec", "PipelineSpec", "build_pipeline", "load_pipeline", "parse_pipeline"]
