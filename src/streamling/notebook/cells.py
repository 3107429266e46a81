"""What a ``%%streamling`` cell means, without IPython or Spark.

The magics (``streamling.notebook.magics``) and the notebook compiler (``streamling.bundle.compile``)
both turn a cell line and body into a node definition here, so a notebook run by hand and the
same notebook deployed as a job cannot build different pipelines.

Parameters: ``{{name}}`` and ``${name}`` in a cell line or body (``name`` an identifier, no dots)
are replaced by the parameter's value before anything else reads the text — a job parameter, or
else the default its ``dbutils.widgets`` declaration gives. ``${…}`` with dots (``${var.x}``) is
not a parameter and stays as written; ``$${name}`` writes a literal ``${name}``. In a script
transform's body (JavaScript/TypeScript) only ``{{name}}`` is replaced: ``${name}`` there is a
template-literal placeholder of the script itself.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import yaml

from streamling.errors import StreamlingError

#: ``%streamling`` commands that only show something in the notebook: a job skips them
DISPLAY_COMMANDS = frozenset({"validate", "show", "yaml", "preview", "display", "capture", "debug", "export"})
#: ``%streamling`` commands that manage a notebook run
RUN_CONTROL_COMMANDS = frozenset({"wait", "stop", "status"})

USAGE = """\
%%streamling source NAME [--type T]                 body: the node's YAML keys
%%streamling transform NAME [--from A[,B]] [--type sql|script|…] [--language javascript|typescript]
                                                     body: SQL (default), JS/TS for script, YAML otherwise
%%streamling sink NAME --from A [--type T]          body: the node's YAML keys
%%streamling pipeline                               body: a whole pipeline YAML
(any cell: --option KEY=VALUE, VALUE read as YAML, repeatable; {{param}} / ${param} insert a parameter)
(transform and sink cells: --expect NAME "SQL condition" [--on-violation warn|drop|fail], repeatable;
 each --on-violation applies to the --expect before it)
%streamling validate | show | yaml | status | stop | reset
%streamling preview NODE [--rows N]
%streamling display NODE [--rows N]                 live table of the node's latest rows (default 100)
%streamling run [--rows N | --seconds S] [--wait] [--sample N]
%streamling wait [--timeout S]
%streamling capture NODE | debug NODE | remove NODE | export PATH"""

CellKind = Literal["source", "transform", "sink", "pipeline"]


class PipelineError(Exception):
    """A ``%streamling`` magic failed; the message is one ``Node 'x': … — …`` line per problem.

    The notebook extension registers a handler that shows exactly this message as the cell's error
    (ename ``PipelineError``, no Python or Java traceback), so every runner — JupyterLab's "Run
    all", nbconvert, papermill, nbval, jobs — sees a failed cell.
    """


class _Expect(argparse.Action):
    """``--expect NAME CONDITION``: one expectation (``warn`` until an ``--on-violation`` follows)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        name, condition = values
        namespace.expect = [*(namespace.expect or []), {"name": name, "condition": condition}]


class _OnViolation(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if not namespace.expect:
            raise StreamlingError("--on-violation applies to the --expect before it; there is none",
                                  hint='--expect NAME "condition" --on-violation drop')
        namespace.expect[-1]["on_violation"] = values


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would sys.exit(); a magic must raise
        raise StreamlingError(f"{message}", hint=f"usage:\n{USAGE}")


def parser() -> argparse.ArgumentParser:
    """The parser of a ``%streamling`` / ``%%streamling`` line (arguments after the magic's name)."""
    p = _Parser(prog="%streamling", add_help=False)
    p.add_argument("command")
    p.add_argument("name", nargs="?")
    p.add_argument("--from", dest="from_")
    p.add_argument("--type")
    p.add_argument("--language")
    p.add_argument("--option", action="append", default=[])
    p.add_argument("--rows", type=int)
    p.add_argument("--seconds", type=float)
    p.add_argument("--timeout", type=float)
    p.add_argument("--sample", type=int)
    p.add_argument("--wait", action="store_true")
    p.add_argument("--expect", nargs=2, action=_Expect, default=[], metavar=("NAME", "CONDITION"))
    p.add_argument("--on-violation", dest="on_violation", action=_OnViolation, choices=["warn", "drop", "fail"])
    return p


# $${name} (an escaped reference), {{name}} / {{ name }}, ${name}; a name is an identifier, no dots.
_REFERENCE = re.compile(r"\$\$\{(?P<escaped>[A-Za-z_][A-Za-z0-9_]*)\}"
                        r"|\{\{\s*(?P<braces>[A-Za-z_][A-Za-z0-9_]*)\s*\}\}"
                        r"|\$\{(?P<dollar>[A-Za-z_][A-Za-z0-9_]*)\}")


def has_references(text: str) -> bool:
    """Whether ``text`` may refer to a parameter (a cheap test before the values are looked up)."""
    return "{{" in text or "${" in text


def substitute(text: str, values: Mapping[str, str], where: str, *, dollar_braces: bool = True) -> str:
    """Replace ``{{name}}`` and ``${name}`` by ``values[name]``; ``$${name}`` becomes ``${name}``.

    Every unknown name is reported at once, with the parameters that are defined. With
    ``dollar_braces=False`` (script bodies) only ``{{name}}`` is a reference.
    """
    if not has_references(text):
        return text
    unknown: list[str] = []

    def replace(match: re.Match[str]) -> str:
        if match.group("escaped") is not None:
            return match.group(0)[1:] if dollar_braces else match.group(0)
        name = match.group("braces") or match.group("dollar")
        if match.group("dollar") is not None and not dollar_braces:
            return match.group(0)
        if name in values:
            return str(values[name])
        if name not in unknown:
            unknown.append(name)
        return match.group(0)

    out = _REFERENCE.sub(replace, text)
    if unknown:
        names = ", ".join(f"'{n}'" for n in unknown)
        defined = ", ".join(sorted(values)) or "none"
        raise StreamlingError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {names} in {where}",
            code="unknown_parameter",
            hint=f"defined parameters: {defined}; declare one with dbutils.widgets.text('{unknown[0]}', "
                 f"'<default>') or pass it as a job parameter")
    return out


def parse_line(line: str, values: Mapping[str, str] | None = None, where: str = "the cell line") -> argparse.Namespace:
    """Split and parse a magic's line, after its parameter references are replaced."""
    if values is not None:
        line = substitute(line, values, where)
    try:
        words = shlex.split(line)
    except ValueError as exc:  # e.g. "No closing quotation"
        raise StreamlingError(f"the line cannot be split into arguments: {exc}",
                              hint="close the quote, or quote a value that has spaces") from exc
    return parser().parse_args(words)


def options(args: argparse.Namespace) -> dict[str, Any]:
    """``--option KEY=VALUE`` (repeatable), each VALUE read as YAML."""
    out: dict[str, Any] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise StreamlingError(f"--option '{item}' is not KEY=VALUE", hint="e.g. --option primary_key=id")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise StreamlingError(f"--option '{item}': the value is not valid YAML: {getattr(exc, 'problem', exc)}",
                                  hint="quote the whole option, e.g. --option 'schema={id: int64}'") from exc
    return out


def yaml_body(text: str, what: str) -> dict[str, Any]:
    """A cell body holding a node's YAML keys (an empty body: none)."""
    if not text.strip():
        return {}
    data = _load_yaml(text, f"write the {what}'s keys as in the pipeline YAML")
    if not isinstance(data, dict):
        raise StreamlingError("the cell body must be YAML keys (a mapping)",
                              hint=f"write the {what}'s keys as in the pipeline YAML, e.g. 'type: …'")
    return data


def _load_yaml(text: str, hint: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        # As the editor numbers the cell's lines: the body starts under the %%streamling line.
        where = f" at line {mark.line + 2} of the cell" if mark is not None else ""
        raise StreamlingError(f"the cell body is not valid YAML{where}: {getattr(exc, 'problem', exc)}",
                              hint=hint) from exc


class CellNode(NamedTuple):
    """What a ``%%streamling`` cell defines: a node, or (``pipeline``) a whole document in ``definition``."""

    kind: CellKind
    name: str | None
    definition: Any


def cell_node(args: argparse.Namespace, body: str, values: Mapping[str, str] | None = None,
              where: str = "the cell body") -> CellNode:
    """The node a ``%%streamling`` cell defines, exactly as its magic builds it.

    ``args`` is the parsed cell line (``parse_line``); ``values`` the parameters ``{{name}}`` /
    ``${name}`` in the body refer to (``None``: the body is taken as written).
    """
    kind = args.command
    if kind == "pipeline":
        if values is not None:
            body = substitute(body, values, where)
        return CellNode("pipeline", None, _load_yaml(body, "paste the pipeline YAML into the cell"))
    if kind not in ("source", "transform", "sink"):
        raise StreamlingError(f"unknown cell kind '{kind}'", hint=f"usage:\n{USAGE}")
    if not args.name:
        raise StreamlingError(f"the {kind} needs a name", hint=f"%%streamling {kind} NAME …")
    name = str(args.name)
    script = kind == "transform" and args.type == "script"
    if values is not None:
        body = substitute(body, values, where, dollar_braces=not script)
    head: dict[str, Any] = {}
    if kind == "transform" and (args.type or "sql") == "sql":
        head = {"type": "sql"}
        rest: dict[str, Any] = {"sql": body.strip()}
    elif script:
        head = {"type": "script", "language": args.language or "javascript"}
        rest = {"script": body.strip("\n") + "\n"}
    else:
        rest = yaml_body(body, kind)
        if args.type:
            head["type"] = args.type
        elif "type" in rest:
            head["type"] = rest.pop("type")
    if args.from_:
        head["from"] = [s.strip() for s in args.from_.split(",") if s.strip()]
    elif kind == "sink" and "from" not in rest:
        raise StreamlingError("a sink reads one node: add --from UPSTREAM", node=name,
                              hint=f"%%streamling sink {name} --from <transform or source>")
    definition = {**head, **rest, **options(args)}
    expectations = list(getattr(args, "expect", None) or [])
    if expectations:
        if kind == "source":
            raise StreamlingError("expectations check a transform's output or a sink's input, not a source",
                                  node=name, hint="put --expect on the transform or sink that reads it")
        definition["expectations"] = [*definition.get("expectations", []), *expectations]
    return CellNode(kind, name, definition)
