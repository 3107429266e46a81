"""streamling: Streamling-format pipelines on Spark Structured Streaming."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
