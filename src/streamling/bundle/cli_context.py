"""What every ``streamling bundle`` command starts from: the bundle and target it acts on (found
from the working directory upwards, or ``STREAMLING_BUNDLE_ROOT``, with ``--target`` and ``--var``),
and how it writes its result to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamling.errors import StreamlingError


def kv(items: Sequence[str], what: str) -> dict[str, str]:
    """``NAME=VALUE`` items (``what`` names the option in the error) as a mapping."""
    values: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise StreamlingError(f"{what} '{item}' is not NAME=VALUE", code="bundle_usage",
                                  hint=f"e.g. {what} threshold=900")
        values[key.strip()] = value
    return values


def target_bundle(args: argparse.Namespace) -> Any:
    """The bundle the command acts on, loaded for its ``--target`` with its ``--var`` values."""
    from streamling.bundle.loading import load_bundle
    from streamling.bundle.model import find_bundle_root

    if not os.environ.get("STREAMLING_BUNDLE_ROOT"):
        try:
            here = Path.cwd()
        except FileNotFoundError:
            raise StreamlingError(
                "bundle: the current folder no longer exists (deleted or moved)", code="bundle_missing",
                hint="cd into the bundle's folder again (the one with bundle.yml or databricks.yml)") from None
    root = Path(os.environ.get("STREAMLING_BUNDLE_ROOT") or find_bundle_root(here))
    return load_bundle(root, target=args.target, variables=kv(args.var, "--var"))


def out(text: str) -> None:
    """A line of the command's result on stdout (flushed: a follower sees it at once)."""
    sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    sys.stdout.flush()
