"""The merged YAML tree of a bundle: where each of its paths came from, and the problems found in it.

A bundle is several files merged into one tree, so every message must still name the file and line a key was
written at. ``Context`` records that provenance as files are merged and collects every problem (and every
warning) so that ``load_bundle`` reports them all at once, in reading order. The small readers below take a
YAML value of any shape without failing: shapes are reported by the schema check, not twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamling.errors import Location, StreamlingError, ValidationError
from streamling.spec.loader import LoadedDocument


def join_path(prefix: str, key: object) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` if it is a mapping, else empty: shapes are reported by the schema check, not twice."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def describe(value: Any) -> str:
    """How a message names a YAML value of the wrong shape."""
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    return f"{yaml_text(value)!r}"


def yaml_text(value: Any) -> str:
    """A YAML scalar as the string Databricks would see (``true`` stays lower case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class BundleFile:
    rel: str
    path: Path
    doc: LoadedDocument
    index: int


class Context:
    """The merged tree, where each of its paths came from, and the problems and warnings found so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data: dict[str, Any] = {}
        self.origin: dict[str, tuple[BundleFile, str]] = {}
        self.files: list[BundleFile] = []
        self.problems: list[tuple[int, int, StreamlingError]] = []
        self.seen: set[str] = set()
        self.warnings: list[str] = []

    # provenance
    def record(self, path: str, value: Any, file: BundleFile, src: str) -> None:
        self.origin[path] = (file, src)
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            self.record(join_path(path, key), item, file, join_path(src, key))

    def forget(self, path: str) -> None:
        for key in [k for k in self.origin if k == path or k.startswith(path + ".")]:
            del self.origin[key]

    def where(self, path: str) -> tuple[BundleFile, str]:
        """The file and the path inside it for a merged path (or its nearest recorded ancestor)."""
        probe = path
        while probe:
            if probe in self.origin:
                file, src = self.origin[probe]
                return file, src + path[len(probe):]
            probe = probe.rpartition(".")[0]
        return self.files[0], path

    def loc(self, path: str) -> Location:
        file, src = self.where(path)
        return Location(f"{file.rel}: {src or '<root>'}", file.doc.line(src))

    def source(self, path: str) -> str:
        file, src = self.where(path)
        return f"{file.rel}:{file.doc.line(src) or 1}"

    # reporting
    def add(self, where: str | Location, message: str, *, hint: str | None = None, code: str = "invalid_bundle",
            node: str | None = None, node_kind: str | None = None) -> None:
        loc = where if isinstance(where, Location) else self.loc(where)
        err = StreamlingError(message, location=loc, hint=hint, code=code, node=node, node_kind=node_kind)
        if err.headline() in self.seen:  # the same string resolved twice reports once
            return
        self.seen.add(err.headline())
        # Reported in reading order: by file (bundle file, then includes), then line; --var problems last.
        index = next((f.index for f in self.files if loc.path == f.rel or loc.path.startswith(f"{f.rel}: ")),
                     len(self.files))
        self.problems.append((index, loc.line or 0, err))

    def warn(self, path: str, key: str, why: str) -> None:
        self.warnings.append(f"{self.source(path)}: '{key}' has no effect here: {why}")

    def fail(self) -> None:
        if self.problems:
            raise BundleInvalid([p for _, _, p in sorted(self.problems, key=lambda t: (t[0], t[1]))])


class BundleInvalid(ValidationError):
    """A ``ValidationError`` whose summary says "bundle" rather than "pipeline"."""

    def __init__(self, problems: list[StreamlingError]) -> None:
        super().__init__(problems)
        count = len(self.problems)
        body = "\n".join(f"  - {p.headline()}" for p in self.problems)
        self.message = f"bundle is invalid ({count} problem{'s' if count != 1 else ''}):\n{body}"
        self.args = (self.message,)
        self.code = "invalid_bundle"
