"""``${…}`` in a bundle: variables, ``bundle.*``, ``workspace.*`` and ``resources.<kind>.<key>.id``.

Values are resolved lazily so that they may refer to each other (``file_path`` defaults to
``${workspace.root_path}/files``); a value that fails is reported once, where it is set, and a cycle is named as
``a -> b -> a``. Variables take their value with the CLI's precedence: ``--var`` > ``BUNDLE_VAR_<name>`` > the
target's > the default. These are resolved once, at load time; the ``{{…}}`` references a task reads when it
starts are ``references``'.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streamling.bundle.schema import Items, Keys, Named, Shape
from streamling.bundle.tree import Context, as_dict, describe, join_path, yaml_text
from streamling.errors import Location
from streamling.util import did_you_mean

_REF = re.compile(r"\$\{([^{}]*)\}")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class Resolver:
    """Resolves ``${…}`` lazily so values may refer to each other; a failed value reports once, where it is set."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.raw: dict[str, tuple[str, Location]] = {}
        self.done: dict[str, str | None] = {}
        self.stack: list[str] = []
        self.post: dict[str, Callable[[str], str]] = {}  # e.g. root_path made absolute

    def ref(self, name: str) -> str | None:
        if name in self.done:
            return self.done[name]
        if name in self.stack:
            cycle = [*self.stack[self.stack.index(name):], name]
            self.ctx.add(self.raw[name][1], f"references form a cycle: {' -> '.join(cycle)}",
                         hint="give one of them a plain value", code="bundle_reference_cycle")
            for entry in cycle:
                self.done[entry] = None
            return None
        text, loc = self.raw[name]
        self.stack.append(name)
        value = self.text(text, loc)
        self.stack.pop()
        if name in self.done:  # set to None by a cycle found below
            return None
        if value is not None and name in self.post:
            value = self.post[name](value)
        self.done[name] = value
        return value

    def text(self, text: str, loc: Location) -> str | None:
        failed = False

        def replace(match: re.Match[str]) -> str:
            nonlocal failed
            name = match.group(1)
            if name in self.raw or name in self.done:
                value = self.ref(name)
                if value is not None:
                    return value
            else:
                self.unknown(name, loc)
            failed = True
            return match.group(0)

        out = _REF.sub(replace, text)
        return None if failed else out

    def unknown(self, name: str, loc: Location) -> None:
        known = sorted({*self.raw, *self.done})
        jobs = [k.split(".")[2] for k in known if k.startswith("resources.jobs.")]
        if name.startswith("variables."):
            hint = f"variables are referenced as ${{var.{name.partition('.')[2]}}}"
        elif name.startswith("var."):
            hint = f"declare it: variables: {{{name[4:]}: {{default: …}}}}"
        elif name.startswith("resources.jobs."):
            hint = f"a job is referenced as ${{resources.jobs.<key>.id}}; jobs here: {', '.join(jobs) or 'none'}"
        else:
            hint = ("available: ${var.<name>}, ${bundle.name}, ${bundle.target}, ${workspace.root_path}, "
                    "${workspace.file_path}, ${workspace.current_user.short_name}, ${resources.jobs.<key>.id}")
        close = did_you_mean(name, known, "'${{{}}}'", cutoff=0.8)
        self.ctx.add(loc, f"unknown reference '${{{name}}}'{close}", hint=hint,
                     code="bundle_unknown_reference")

    def tree(self, path: str, value: Any, shape: Shape = None) -> Any:
        """Every string under ``value`` with its references replaced (unresolved ones kept as written).

        Keys with no effect here keep their text: a reference Databricks would resolve there (an artifact, a
        pipeline id) must not fail a bundle that cannot use it anyway."""
        if isinstance(value, dict):
            if isinstance(shape, Keys):
                return {k: self.tree(join_path(path, k), v, shape.keys[k]) if k in shape.keys else v
                        for k, v in value.items()}
            item = shape.item if isinstance(shape, Named) else None
            return {k: self.tree(join_path(path, k), v, item) for k, v in value.items()}
        if isinstance(value, list):
            item = shape.item if isinstance(shape, Items) else None
            return [self.tree(join_path(path, i), v, item) for i, v in enumerate(value)]
        if isinstance(value, str) and "${" in value:
            resolved = self.text(value, self.ctx.loc(path))
            return value if resolved is None else resolved
        return value


def local_or_uri(text: str, root: Path) -> str:
    """A URI as written; a local path made absolute (``~`` expanded, relative to the bundle root)."""
    if _URI.match(text):
        return text
    path = Path(text).expanduser()
    return os.path.normpath(path if path.is_absolute() else root / path)


def declare_variables(res: Resolver, target: str, body: dict[str, Any], cli_vars: Mapping[str, str],
                      environ: Mapping[str, str]) -> list[str]:
    """The declared variables' names; each one's value is set in ``res`` with the Databricks CLI's precedence
    (``--var`` > ``BUNDLE_VAR_<name>`` > the target's > its default), or reported when it has none."""
    ctx = res.ctx
    declared = as_dict(ctx.data.get("variables"))
    names = [str(n) for n in declared]
    overrides = as_dict(body.get("variables"))
    for name in overrides:
        if name not in declared:
            ctx.add(f"targets.{target}.variables.{name}",
                    f"target '{target}' sets variable '{name}', which is not declared"
                    f"{did_you_mean(str(name), names)}",
                    hint=f"declare it under variables: {{{name}: {{default: …}}}}")
    for name in cli_vars:
        if name not in declared:
            ctx.add(Location(f"--var {name}"), f"--var sets variable '{name}', which is not declared"
                    f"{did_you_mean(name, names)}", hint="declare it under variables: in the bundle, or drop --var")
    for name, spec in declared.items():
        path, ref = f"variables.{name}", f"var.{name}"
        spec = as_dict(spec)
        if "lookup" in spec:
            ctx.add(f"{path}.lookup", f"variable '{name}': lookup is not supported here",
                    hint="there is no workspace to look objects up in; give it a default")
        if spec.get("type") is not None:
            ctx.add(f"{path}.type", f"variable '{name}': type {spec['type']!r} is not supported here",
                    hint="variables are plain strings here; remove type")
        value: Any = None
        where: str | Location = path
        if name in cli_vars:
            value, where = cli_vars[name], Location(f"--var {name}")
        elif f"BUNDLE_VAR_{name}" in environ:
            value, where = environ[f"BUNDLE_VAR_{name}"], Location(f"BUNDLE_VAR_{name}")
        elif name in overrides:
            value, where = overrides[name], f"targets.{target}.variables.{name}"
            if isinstance(value, dict) and set(value) == {"default"}:
                value, where = value["default"], f"{where}.default"
        elif "default" in spec:
            value, where = spec["default"], f"{path}.default"
        loc = where if isinstance(where, Location) else ctx.loc(where)
        if value is None:
            ctx.add(path, f"variable '{name}' has no value", code="bundle_variable_unset",
                    hint=f"give it a default, set it per target, pass --var {name}=VALUE or set BUNDLE_VAR_{name}")
            res.done[ref] = None
        elif isinstance(value, (dict, list)):
            ctx.add(loc, f"variable '{name}' must be a single value (got {describe(value)})",
                    hint="complex variables are not supported here")
            res.done[ref] = None
        else:
            res.raw[ref] = (yaml_text(value), loc)
    return names
