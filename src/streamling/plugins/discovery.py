"""Finding plugins: installed distributions and a plugin path.

Two ways in, as Streamling has them: the ``streamling.plugins`` entry-point group of installed
distributions (``[project.entry-points."streamling.plugins"] acme = "acme_streamling"``: importing
the module registers its plugins), and ``STREAMLING__PLUGIN__PATH`` (or ``plugin.path`` in the
config): a Python file, or a folder whose ``.py`` files and packages are each loaded. A plugin that
fails to import is reported with its distribution or file, once, and never breaks the built-ins or
the other plugins.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from streamling.plugins import registry

log = logging.getLogger(__name__)

GROUP = "streamling.plugins"
PATH_ENV = "STREAMLING__PLUGIN__PATH"


@dataclass(frozen=True)
class LoadFailure:
    origin: str  #: the distribution and entry point, or the file
    message: str


#: modules loaded from a plugin path: Spark ships their classes to workers by value
PATH_MODULES: set[str] = set()
FAILURES: list[LoadFailure] = []
_loaded: set[str] = set()
_scanned: list[bool] = []


def load_plugins(path: str | None = None) -> list[LoadFailure]:
    """Load every plugin not loaded yet; return the failures of this call (also logged)."""
    failures: list[LoadFailure] = []
    for ep in _entry_points() if not _scanned else []:
        dist = ep.dist.name if ep.dist is not None else "?"
        origin = f"{dist} (entry point '{ep.name}' = {ep.value})"
        if origin in _loaded:
            continue
        _loaded.add(origin)
        try:
            with registry.loading_from(dist):
                ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
            failures.append(LoadFailure(origin, f"{type(exc).__name__}: {exc}"))
    _scanned.append(True)  # installed distributions do not change while the process runs
    where = path or os.environ.get(PATH_ENV)
    if where:
        for file in _plugin_files(Path(where).expanduser(), failures):
            failures.extend(_load_file(file))
    for failure in failures:
        log.warning("plugin %s failed to load and is not available: %s", failure.origin, failure.message)
    FAILURES.extend(failures)
    return failures


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=GROUP))


def _plugin_files(where: Path, failures: list[LoadFailure]) -> list[Path]:
    if where.is_file():
        return [where]
    if where.is_dir():
        return sorted(p for p in where.iterdir()
                      if not p.name.startswith(("_", ".")) and (p.suffix == ".py" or (p / "__init__.py").is_file()))
    key = f"path {where}"
    if key not in _loaded:
        _loaded.add(key)
        failures.append(LoadFailure(f"{PATH_ENV}={where}", "no such file or folder"))
    return []


def _load_file(file: Path) -> list[LoadFailure]:
    resolved = str(file.resolve())
    if resolved in _loaded:
        return []
    _loaded.add(resolved)
    init = file / "__init__.py" if file.is_dir() else file
    name = f"streamling_plugin_{file.stem}"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(file)] if file.is_dir() else None)
    if spec is None or spec.loader is None:
        return [LoadFailure(str(file), "not a Python module")]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        with registry.loading_from(str(file)):
            spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
        sys.modules.pop(name, None)
        return [LoadFailure(str(file), f"{type(exc).__name__}: {exc}")]
    PATH_MODULES.add(name)
    return []


def ship_by_value(obj: object) -> None:
    """Let Spark's workers unpickle ``obj``'s class although its module is not importable there
    (it came from a plugin path): pickle that module by value."""
    module = getattr(obj, "__module__", "")
    root = module.split(".")[0]
    if root in PATH_MODULES:
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[root])
