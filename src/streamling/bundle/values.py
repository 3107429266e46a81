"""How the bundle builders read one value of the merged tree: typed, located, and reported under its node.

A problem found while a job or a task is built names it (``job 'x':`` / ``task 'y':``), so the builders keep the
node being built here; a file path is relative to the YAML file that declares it, as Databricks resolves it, and
must be inside the bundle folder that ``deploy`` snapshots.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from streamling.bundle.tree import Context, as_dict, describe, join_path, relative, yaml_text


class ValueReader:
    """Typed reads of the merged tree; every problem goes to ``ctx``, under the node being built."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.node: tuple[str, str] | None = None

    def add(self, path: str, message: str, hint: str | None = None, code: str = "invalid_bundle") -> None:
        """A problem about the job or task being built: its headline starts ``job 'x':`` or ``task 'y':``."""
        node, kind = self.node if self.node else (None, None)
        self.ctx.add(path, message, hint=hint, code=code, node=node, node_kind=kind)

    def str_(self, obj: dict[str, Any], key: str, path: str, required: bool = False) -> str | None:
        value = obj.get(key)
        if value is None:
            if required:
                self.add(join_path(path, key), f"{path.rpartition('.')[2]} has no {key}", hint=f"set {key}")
            return None
        if isinstance(value, (dict, list)):
            self.add(join_path(path, key), f"{key} must be a single value (got {describe(value)})")
            return None
        return yaml_text(value)

    def int_(self, obj: dict[str, Any], key: str, path: str, default: int, minimum: int) -> int:
        value = obj.get(key)
        if value is None:
            return default
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):  # e.g. from ${var.retries}
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            self.add(join_path(path, key), f"{key} must be a whole number (got {value!r})")
            return default
        if value < minimum:
            self.add(join_path(path, key), f"{key} must be at least {minimum} (got {value})")
            return default
        return value

    def bool_(self, obj: dict[str, Any], key: str, path: str) -> bool:
        value = obj.get(key)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if value is not None and not isinstance(value, bool):
            self.add(join_path(path, key), f"{key} must be true or false (got {value!r})")
        return value is True

    def strings(self, obj: dict[str, Any], key: str, path: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, item in as_dict(obj.get(key)).items():
            if isinstance(item, (dict, list)):
                self.add(f"{path}.{key}.{name}", f"{key}.{name} must be a single value")
            elif item is not None:
                out[str(name)] = yaml_text(item)
        return out

    def locate(self, path: str, raw: str, what: str) -> tuple[Path, str, str]:
        """A path relative to the YAML file that declares it (Databricks' rule), how to show it, and a hint."""
        file, _ = self.ctx.where(path)
        resolved = Path(os.path.normpath(file.path.parent / Path(raw).expanduser()))
        shown = relative(resolved, self.ctx.root)
        return resolved, shown, f"{what} is relative to {file.rel}, the file that declares it"

    def inside(self, path: str, resolved: Path, what: str) -> bool:
        """Deploy snapshots the bundle folder, so a file outside it would be missing on the target."""
        if resolved.is_relative_to(self.ctx.root):
            return True
        self.add(path, f"{what} {resolved} is outside the bundle folder {self.ctx.root}",
                 hint="deploy snapshots only the bundle folder: move it inside")
        return False
