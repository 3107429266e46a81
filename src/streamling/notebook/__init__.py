"""Notebook authoring: ``%load_ext streamling`` registers the ``%%streamling`` magics."""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    from streamling.notebook.magics import StreamlingMagics

    ipython.register_magics(StreamlingMagics)
