"""streamling: Streamling-format pipelines on Spark Structured Streaming."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext streamling``: the ``%%streamling`` magics (imported only in a notebook)."""
    from streamling.notebook import load_ipython_extension as load

    load(ipython)
