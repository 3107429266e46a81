"""bundle.yml → a resolved, validated ``Bundle`` for one target (Databricks Asset Bundle conventions).

A bundle is a folder holding ``bundle.yml`` or ``databricks.yml``. Its keys are Databricks' so an existing
bundle keeps working: ``include`` globs merge more YAML files into one tree, ``variables`` resolve with the CLI's
precedence (``--var`` > ``BUNDLE_VAR_<name>`` > target > default), ``targets`` overlay their ``workspace``,
``variables`` and ``resources`` on the top level, and ``mode: development`` prefixes, tags and pauses jobs as the
CLI does. Only ``resources.jobs`` with notebook, Python-file and (streamling) wheel tasks can run here; keys that
configure Databricks itself (clusters, libraries, permissions, …) are accepted with a warning, so a bundle shared
with Databricks validates on both.

Extension: ``config`` (top level) and ``targets.<t>.config`` hold streamling runtime settings with the same keys
as ``config.yaml`` (``spark.master``, ``spark.conf``, ``application_id``, …); the target's mapping is merged over
the top-level one. This is where a target says which Spark master runs its jobs.

Everything is checked before anything is raised: ``load_bundle`` reports every problem at once, each located as
``<file relative to the root>: <dotted path>`` with the line of that key in that file. This module reads and
merges the files and picks the target; ``builder`` turns the merged tree into the ``Bundle``. No pyspark import
here: ``streamling bundle validate`` must stay fast and JVM-free.
"""

from __future__ import annotations

import copy
import getpass
import glob
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from streamling.bundle.builder import Builder
from streamling.bundle.model import BUNDLE_FILES, Bundle
from streamling.bundle.schema import TARGET, TOP, check_keys
from streamling.bundle.tree import BundleFile, Context, as_dict, join_path, relative
from streamling.errors import Location, StreamlingError
from streamling.spec.loader import LoadedDocument, parse_yaml
from streamling.util import did_you_mean


def load_bundle(root: Path, target: str | None = None, variables: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None, user: str | None = None) -> Bundle:
    """Load ``root``'s bundle file and includes, resolve them for one target, and check everything.

    ``variables`` come from ``--var k=v``; ``environ`` supplies ``BUNDLE_VAR_<name>`` (default ``os.environ``);
    ``user`` is the short user name of ``${workspace.current_user.short_name}`` and development prefixes.
    Raises ``ValidationError`` listing every problem; keys with no effect here become ``Bundle.warnings``.
    """
    root = Path(root).resolve()
    present = [root / name for name in BUNDLE_FILES if (root / name).is_file()]
    if not present:
        raise StreamlingError(f"no bundle file in {root}", code="bundle_missing",
                              hint=f"create one of {', '.join(BUNDLE_FILES)}")
    ctx = Context(root)
    main = _read(ctx, present[0])
    if len(present) > 1:
        ctx.add(Location(ctx.files[0].rel), f"{root} holds more than one bundle file: "
                f"{', '.join(p.name for p in present)}", hint="keep one of them")
    if main is None:
        ctx.fail()
    assert main is not None
    _combine(ctx, "", ctx.data, main.doc.data, main, "")
    _includes(ctx, main)
    user = user or _current_user()
    environ = os.environ if environ is None else environ
    targets = as_dict(ctx.data.get("targets"))
    chosen = _choose_target(ctx, targets, target)
    for key, value in ctx.data.items():
        if key == "targets" and isinstance(value, dict):  # warnings only for the target in use
            for name, body in value.items():
                check_keys(ctx, f"targets.{name}", body, TARGET, warn=name == chosen)
        else:
            check_keys(ctx, "", {key: value}, TOP, warn=True)
    if chosen is None:
        ctx.fail()
    assert chosen is not None
    body = as_dict(targets.get(chosen))
    for section in ("workspace", "resources", "config", "artifacts"):
        if isinstance(body.get(section), dict):
            if ctx.data.get(section) is None:
                ctx.data[section] = {}
            if not isinstance(ctx.data[section], dict):
                continue
            file, src = ctx.where(f"targets.{chosen}.{section}")
            if section not in ctx.origin:
                ctx.origin[section] = (file, src)
            _overlay(ctx, section, ctx.data[section], body[section], file, src)
    python = as_dict(ctx.data.get("python"))
    if python.get("resources") or python.get("mutators"):
        _python_resources(ctx, chosen, variables or {}, environ)
    bundle = Builder(ctx, chosen, body, user).build(variables or {}, environ)
    ctx.fail()
    return bundle


def _python_resources(ctx: Context, target: str, cli_vars: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """Jobs and pipelines the bundle defines in Python (``python.resources``, and ``python.mutators``
    that change them), loaded by the ``databricks-bundles`` package as the Databricks CLI loads them;
    they join the YAML-defined ones, located at their Python source."""
    from streamling.bundle import python_resources

    overrides = as_dict(as_dict(as_dict(ctx.data.get("targets")).get(target)).get("variables"))
    values = {}
    for name, spec in as_dict(ctx.data.get("variables")).items():
        values[str(name)] = cli_vars.get(name) or environ.get(f"BUNDLE_VAR_{name}") or overrides.get(name, (
            as_dict(spec).get("default")))
    try:
        python = python_resources.interpreter(ctx.root, as_dict(ctx.data.get("python")).get("venv_path"))
        result = python_resources.load(ctx.root, {k: v for k, v in ctx.data.items() if k != "targets"}, target,
                                       values, python)
    except StreamlingError as exc:
        ctx.add("python", exc.message, hint=exc.hint, code=exc.code)
        return
    for diagnostic in result.diagnostics:
        where = Location(diagnostic.file or "python.resources", diagnostic.line)
        detail = diagnostic.detail.strip().splitlines()[-1] if diagnostic.detail.strip() else None
        if diagnostic.severity == "error":
            ctx.add(where, diagnostic.summary, hint=detail, code="bundle_python")
        else:
            ctx.warnings.append(f"{diagnostic.file or 'python.resources'}:{diagnostic.line or 1}: {diagnostic.summary}")
    resources = as_dict(result.data.get("resources"))
    known = as_dict(ctx.data.get("resources"))
    files: dict[str, BundleFile] = {}
    for kind, items in resources.items():
        for name, item in as_dict(items).items():
            path = f"resources.{kind}.{name}"
            if name in as_dict(known.get(kind)):
                continue
            rel, _line = result.locations.get(path, ("python.resources", None))
            if rel not in files:  # a stand-in file: problems in a Python-defined resource name its source
                files[rel] = BundleFile(rel, ctx.root / rel, LoadedDocument({}, source=rel), len(ctx.files))
                ctx.files.append(files[rel])
            ctx.record(path, item, files[rel], path)
    ctx.data["resources"] = resources


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in some containers
        return os.environ.get("USER") or "user"


def _includes(ctx: Context, main: BundleFile) -> None:
    patterns = ctx.data.get("include")
    if not isinstance(patterns, list):
        return
    seen = {main.path}
    for i, pattern in enumerate(patterns):
        path = f"include.{i}"
        if not isinstance(pattern, str):
            ctx.add(path, "an include entry must be a glob pattern such as resources/*.yml")
            continue
        matches = sorted(glob.glob(pattern, root_dir=ctx.root, recursive=True))
        if not matches:  # as the Databricks CLI: not an error (a folder of resources may be empty)
            ctx.warnings.append(f"{ctx.source(path)}: include pattern '{pattern}' matches no file, so it adds "
                                "nothing (patterns are relative to the bundle folder)")
        for match in matches:
            file_path = Path(os.path.normpath(ctx.root / match))
            if file_path in seen or file_path.is_dir():
                continue
            seen.add(file_path)
            if file_path.suffix not in (".yml", ".yaml"):
                ctx.add(path, f"include pattern '{pattern}' matches {match}, which is not a YAML file",
                        hint="include only lists YAML configuration files")
                continue
            file = _read(ctx, file_path)
            if file is None:
                continue
            if "include" in file.doc.data:
                ctx.add(Location(f"{file.rel}: include", file.doc.line("include")),
                        "include is only read from the bundle file", hint=f"move it to {main.rel}")
                del file.doc.data["include"]
            _combine(ctx, "", ctx.data, file.doc.data, file, "")


def _choose_target(ctx: Context, targets: dict[str, Any], wanted: str | None) -> str | None:
    names = [str(n) for n in targets]
    if wanted is not None:
        if wanted in targets:
            return wanted
        ctx.add("targets", f"unknown target '{wanted}'{did_you_mean(wanted, names)}",
                hint=f"targets here: {', '.join(names)}" if names else "declare it under targets:",
                code="bundle_unknown_target")
        return None
    if not targets:
        return "default"  # as Databricks: a bundle without targets has one named "default"
    defaults = [n for n, b in targets.items() if isinstance(b, dict) and b.get("default") is True]
    if len(defaults) > 1:
        for name in defaults[1:]:
            ctx.add(f"targets.{name}.default", f"more than one target is the default ({', '.join(defaults)})",
                    hint="keep default: true on one target", code="bundle_no_target")
        return None
    if defaults:
        return str(defaults[0])
    if len(names) == 1:
        return names[0]
    ctx.add("targets", f"no target given and none is the default among {', '.join(names)}",
            hint="pass --target NAME or set default: true on one target", code="bundle_no_target")
    return None

def _read(ctx: Context, path: Path) -> BundleFile | None:
    rel = relative(path, ctx.root)
    file = BundleFile(rel, path, LoadedDocument(None, source=rel), len(ctx.files))
    ctx.files.append(file)
    try:
        file.doc = parse_yaml(path.read_text(encoding="utf-8"), source=rel)
    except StreamlingError as exc:
        line = exc.location.line if exc.location else None
        ctx.add(Location(rel, line), exc.message, hint=exc.hint, code=exc.code)
        return None
    except OSError as exc:
        ctx.add(Location(rel), f"cannot read {rel}: {exc.strerror or exc}", code="bundle_unreadable")
        return None
    if file.doc.data is None:
        file.doc.data = {}
    if not isinstance(file.doc.data, dict):
        ctx.add(Location(rel, 1), f"{rel} must hold a mapping of keys (bundle, resources, targets, …)")
        return None
    return file


def _is_section(path: str) -> bool:
    """Mappings whose entries may come from different files (one job per file is the usual layout)."""
    return path in ("variables", "targets", "resources") or (path.startswith("resources.") and path.count(".") == 1)


def _combine(ctx: Context, path: str, dst: dict[str, Any], value: dict[str, Any], file: BundleFile, src: str) -> None:
    for key, item in value.items():
        child, child_src = join_path(path, key), join_path(src, key)
        if _is_section(child) and isinstance(item, dict) and isinstance(dst.get(key, {}), dict):
            if key not in dst:
                dst[key] = {}
                ctx.origin[child] = (file, child_src)
            _combine(ctx, child, dst[key], item, file, child_src)
        elif key in dst:
            first, first_src = ctx.where(child)
            ctx.add(Location(f"{file.rel}: {child_src}", file.doc.line(child_src)),
                    f"'{child}' is defined in both {first.rel} (line {first.doc.line(first_src)}) and {file.rel}",
                    hint="keep one definition: the files listed in include are merged into one configuration",
                    code="bundle_duplicate_key")
        else:
            dst[key] = item
            ctx.record(child, item, file, child_src)


def _overlay(ctx: Context, path: str, dst: dict[str, Any], value: dict[str, Any], file: BundleFile, src: str) -> None:
    """A target's settings over the top level: mappings merge deeply, tasks merge by task_key (as Databricks)."""
    for key, item in value.items():
        child, child_src = join_path(path, key), join_path(src, key)
        old = dst.get(key)
        if isinstance(old, dict) and isinstance(item, dict):
            _overlay(ctx, child, old, item, file, child_src)
        elif key == "tasks" and isinstance(old, list) and isinstance(item, list):
            keys = [t.get("task_key") if isinstance(t, dict) else None for t in old]
            for i, task in enumerate(item):
                task_key = task.get("task_key") if isinstance(task, dict) else None
                if task_key is not None and task_key in keys:
                    j = keys.index(task_key)
                    _overlay(ctx, f"{child}.{j}", old[j], cast(dict[str, Any], task), file, f"{child_src}.{i}")
                else:
                    old.append(copy.deepcopy(task))
                    ctx.record(f"{child}.{len(old) - 1}", task, file, f"{child_src}.{i}")
        else:
            ctx.forget(child)
            dst[key] = copy.deepcopy(item)
            ctx.record(child, item, file, child_src)

