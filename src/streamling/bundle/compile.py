"""Compile a notebook into the pipeline its ``%%streamling`` cells build, without running it.

``streamling bundle deploy`` ships a notebook as a job: the deploy step reads the notebook's
cells, builds the very pipeline document the magics would build when the notebook runs top to
bottom (the same ``streamling.notebook.cells`` code turns a cell into a node, the same
``NotebookPipeline`` adds, replaces and removes nodes), validates it, and a job driver runs that
document. No kernel, no Spark and no user code run at deploy time. The notebook's cells, their
numbers and the lines an error names come from ``streamling.bundle.notebook_reader``.

What each cell means in a job:

- ``%load_ext streamling`` / ``%reload_ext streamling``, comments and blank lines: fine.
- ``%config StreamlingMagics.application_id = '…'`` and ``config_name``: applied (a Python literal).
  ``monitor``, ``sample_rows`` and ``full_traceback`` have no effect in a job and are ignored. Any
  other ``%config`` is an error.
- ``%%streamling source|transform|sink|pipeline`` cells: nodes, exactly as the magic builds them;
  ``%streamling remove NODE`` removes one. A re-defined node keeps its first place, as in the
  notebook.
- Parameters: ``dbutils.widgets.text|dropdown|combobox|multiselect(name, default, …)`` declare
  them; ``{{name}}`` / ``${name}`` in a cell line or body take the job parameter passed to
  ``compile_notebook`` or else the declared default (see ``streamling.notebook.cells``). A reference
  to an unknown parameter is an error that lists the defined ones.
- ``%streamling run [--rows N | --seconds S]``: the job's run options (``rows`` / ``seconds``; the
  last ``run`` counts). ``--wait`` and ``--sample``, ``wait``, ``stop`` and ``status`` have no
  effect in a job.
- ``validate``, ``show``, ``yaml``, ``preview``, ``display``, ``capture``, ``debug`` and ``export`` only display
  something in the notebook: skipped. ``%streamling reset`` is skipped with a warning — a job never
  deletes its checkpoints.
- Python code cells: imports, ``dbutils.widgets`` declarations with literal arguments (and
  ``remove`` / ``removeAll``) and ``x = dbutils.widgets.get("name")`` declare parameters here. Any
  other Python code makes the notebook one the job **runs**: its driver executes every cell in order
  in an IPython shell (``streamling.bundle.notebook_job``), as Databricks runs a notebook task, and
  the ``%%streamling`` cells build the pipeline there. The pipeline compiled here is then the
  deploy-time check of those cells, and a redeploy restarts the driver instead of swapping in it.
- Databricks language magics as a cell's first line: ``%python`` (Python), ``%sql`` / ``%%sql``
  (Spark SQL statements), ``%sh`` (a shell script, failing on a non-zero exit), ``%run <notebook>
  [$name=value …]`` (another notebook's cells in the same namespace, its widgets reading the
  arguments), ``%md`` (markdown) — all but ``%md`` make the
  notebook run. A Databricks SQL source notebook (``.sql`` starting ``-- Databricks notebook
  source``) is a notebook of SQL cells. ``%pip`` and ``%scala`` / ``%r`` cells are errors: a job
  never installs into the environment streamling runs from, and only Python and SQL run here. Other
  IPython magics (``%time``, ``!cmd``, ``%%bash``, …) run as IPython runs them.
  Tag a cell ``interactive`` (the cell's metadata tags; in a Databricks source notebook a first line
  ``# streamling: interactive``) to keep it for the notebook only: interactive cells, of any kind,
  are not part of the job.
- Cells tagged ``raises-exception`` (nbval: the cell is expected to fail) fail in the notebook, and
  a cell that fails changes nothing there (``NotebookPipeline.edit``): the job gets the pipeline the
  notebook has after "Run all", so a tagged ``%%streamling`` cell defines nothing in the job either
  (e.g. a script transform that throws when re-run on the captured batch), with a warning; a job
  that runs the notebook goes on past such a cell's failure. The tag does not excuse an unsupported
  magic.

Every problem is reported at once: ``compile_notebook`` raises a ``ValidationError`` listing each
cell's problems and then the document's own validation (``streamling.spec.parse_pipeline``),
located at the cell that defined the node.

Why this module is over 500 lines: it is one pass over the cells (``_Compiler``) applying the rules
listed above, a fifth of it being that list; split, each rule would sit apart from the others it
interacts with (a failed cell, the cell that defined a node, what makes the notebook run).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from streamling.bundle.notebook_reader import (
    INTERACTIVE,
    LANGUAGE_MAGICS,
    RAISES,
    Cell,
    clip,
    read_notebook,
    run_target,
)
from streamling.errors import Location, StreamlingError, ValidationError
from streamling.notebook.cells import DISPLAY_COMMANDS, RUN_CONTROL_COMMANDS, USAGE, cell_node, parse_line
from streamling.notebook.dbutils import InputWidgetNotDefined, Widgets
from streamling.notebook.session import NotebookPipeline, problems_of
from streamling.spec import parse_pipeline
from streamling.spec.pipeline import SECTIONS, Kind
from streamling.spec.writer import pipeline_yaml

APPLIED_SETTINGS = {"application_id", "config_name"}
IGNORED_SETTINGS = {"monitor", "sample_rows", "full_traceback"}
WIDGET_DECLARATIONS = {"text", "dropdown", "combobox", "multiselect"}
WIDGET_READS = {"get", "getArgument"}

_CONFIG = re.compile(r"^(?P<cls>[A-Za-z_]\w*)\.(?P<trait>[A-Za-z_]\w*)\s*=\s*(?P<value>.+)$")


@dataclass
class CompiledNotebook:
    """The pipeline a notebook's cells build, and what else a job needs from the notebook."""

    path: Path
    document: dict[str, Any]
    application_id: str | None = None
    config_name: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: cells the job's driver must execute (Python, SQL, shell, ``%run``): empty for a notebook of
    #: ``%%streamling`` cells, which the driver runs as its compiled pipeline (and swaps on redeploy)
    executes: list[int] = field(default_factory=list)
    #: notebooks its ``%run`` cells include (their content is part of what the task runs)
    includes: list[Path] = field(default_factory=list)

    def to_yaml(self) -> str:
        """The pipeline YAML, written as ``%streamling export`` writes it."""
        return pipeline_yaml(self.document)


# --- compiling ------------------------------------------------------------------------------------


class _Expected(Exception):
    """A cell tagged ``raises-exception`` built its node: it fails later in the notebook."""


class _CellError(Exception):
    """A cell the job cannot take (Python code, another magic): an error even when the cell is
    tagged ``raises-exception``."""

    def __init__(self, error: StreamlingError) -> None:
        super().__init__(str(error))
        self.error = error


class _Compiler:
    def __init__(self, path: Path, parameters: Mapping[str, str]) -> None:
        self.path = path
        self.passed = {str(k): str(v) for k, v in parameters.items()}
        self.widgets = Widgets(environ={})  # declarations only; job parameters are self.passed
        self.nb = NotebookPipeline()
        self.application_id: str | None = None
        self.config_name: str | None = None
        self.run: dict[str, Any] = {}
        self.run_cell: int | None = None
        self.extension_loaded = False
        self.warnings: list[str] = []
        self.problems: list[StreamlingError] = []
        self.node_cells: dict[str, tuple[int, int]] = {}  # node -> (cell, line) that defined it last
        # %%streamling cells that failed: their nodes' absence is not reported again by validation
        self.attempt: tuple[str, str | None] | None = None
        self.failed: dict[str | None, str] = {}
        self.cell: Cell = Cell(0, "code", "")
        self.executes: list[int] = []
        self.includes: list[Path] = []

    # --- helpers --------------------------------------------------------------------------------

    def values(self) -> dict[str, str]:
        return {**self.widgets.defaults(), **self.passed}

    def where(self, line: int | None) -> Location:
        return Location(f"{self.path.name}: cell {self.cell.index}", line)

    def error(self, message: str, line: int | None, hint: str | None = None,
              code: str = "notebook_not_a_job") -> StreamlingError:
        return StreamlingError(message, hint=hint, code=code, location=self.where(line))

    def locate(self, exc: StreamlingError, line: int) -> StreamlingError:
        for problem in problems_of(exc):
            problem.location = self.where(line)
        return exc

    def executed(self) -> None:
        """The current cell holds code only the job's driver can run: the notebook is executed."""
        if self.cell.index not in self.executes:
            self.executes.append(self.cell.index)

    # --- cells ----------------------------------------------------------------------------------

    def compile(self, cells: list[Cell]) -> None:
        for cell in cells:
            if cell.kind != "code" or INTERACTIVE in cell.tags:
                continue
            self.cell = cell
            self.attempt = None
            node_cells = dict(self.node_cells)
            try:
                with self.nb.edit():
                    self.code_cell(cell)
                    if RAISES in cell.tags and self.attempt is not None:
                        # The cell fails in the notebook (e.g. a script re-run on the captured batch
                        # throws), and a failing cell changes nothing there: nor here.
                        raise _Expected()
            except _Expected:
                self.node_cells = node_cells
                self.warnings.append(f"cell {cell.index} (tagged {RAISES}) fails in the notebook, so its "
                                     f"definition of '{self.attempt[1] if self.attempt else '?'}' is not part "
                                     "of the job")
            except _CellError as exc:
                self.problems.append(exc.error)
            except StreamlingError as exc:  # what the notebook's own cell would raise
                self.node_cells = node_cells
                if RAISES in cell.tags:
                    self.warnings.append(f"cell {cell.index} (tagged {RAISES}) fails as in the notebook and "
                                         f"changes nothing in the job: {_first(exc)}")
                else:
                    self.problems.extend(problems_of(exc))
                    if self.attempt is not None:
                        self.failed[self.attempt[1]] = self.attempt[0]

    def code_cell(self, cell: Cell) -> None:
        language, body, start = cell.language()
        if language == "markdown" or not body.strip():
            return
        lines = cell.source.splitlines()
        at = cell.line(next((i for i, line in enumerate(lines) if line.strip()), 0))  # the magic's line
        if language == "pip":
            raise _CellError(self.error("`%pip` does not run in a job: it would install into the environment "
                                        "streamling itself runs from", at, hint=_foreign_hint("%pip")))
        if language == "foreign":
            magic = cell.source.strip().split(None, 1)[0]
            raise _CellError(self.error(f"`{magic}` cells cannot run here: a job runs Python and SQL cells", at,
                                        hint="rewrite the cell in Python or SQL, or tag it `interactive`"))
        if language == "run":
            self.include(body, at)
        if language != "python":
            self.executed()
            return
        if start:  # ``%python``: blank the magic, keep the lines where they are
            lines = lines[:start - 1] + [""] + lines[start:]
        start = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
        if start < len(lines) and lines[start].startswith("%%"):
            self.cell_magic(lines, start)
            return
        self.line_cell(lines)

    def include(self, argument: str, at: int) -> None:
        """``%run <notebook>``: the notebook it names must exist next to this one."""
        try:
            self.includes.append(run_target(self.path.parent, argument))
        except StreamlingError as exc:
            raise _CellError(self.locate(exc, at)) from None

    def cell_magic(self, lines: list[str], start: int) -> None:
        name, _, line = lines[start][2:].rstrip().partition(" ")
        at = self.cell.line(start)
        if name != "streamling":  # IPython's own (%%bash, %%time, %%writefile, …): the driver runs it
            self.executed()
            return
        if not self.extension_loaded:
            self.warnings.append(f"cell {self.cell.index}: %%streamling before `%load_ext streamling`: the "
                                 "notebook itself fails here")
            self.extension_loaded = True
        body = "".join(f"{text}\n" for text in lines[start + 1:])
        try:
            args = parse_line(line, self.values())
            self.attempt = (str(args.command), str(args.name) if args.name else None)
            node = cell_node(args, body, self.values())
            if node.kind == "pipeline":
                self.nb.load_document(node.definition)
                self.node_cells = {node_name: (self.cell.index, at) for node_name in self.nb.nodes}
                return
            assert node.name is not None
            try:
                self.nb.define(cast(Kind, node.kind), node.name, node.definition)
            except StreamlingError as exc:
                exc.node = exc.node or node.name
                raise
            self.node_cells[node.name] = (self.cell.index, at)
        except StreamlingError as exc:
            raise self.locate(exc, at) from None

    def line_cell(self, lines: list[str]) -> None:
        """A cell of line magics and Python statements, run in line order."""
        magics: list[tuple[int, str]] = []
        python = []
        for offset, line in enumerate(lines):
            stripped = line.strip()
            if stripped.startswith(("%", "!")):
                if self.check_magic(offset, stripped):
                    magics.append((offset, stripped))
                python.append("")
            else:
                python.append(line)
        steps: list[tuple[int, Any]] = [(offset, stripped) for offset, stripped in magics]
        steps += self.python_steps("\n".join(python) + "\n", lines)
        for offset, step in sorted(steps, key=lambda s: s[0]):
            at = self.cell.line(offset)
            try:
                if isinstance(step, str):
                    self.line_magic(step, at)
                else:
                    self.widget_call(step, at)
            except StreamlingError as exc:
                raise self.locate(exc, at) from None

    def check_magic(self, offset: int, stripped: str) -> bool:
        """Whether a line magic is streamling's own (applied here); IPython's run in the job's driver.
        What a job cannot run is rejected before anything in the cell is applied."""
        at = self.cell.line(offset)
        if stripped.startswith("!"):
            self.executed()
            return False
        if stripped.startswith("%%"):
            raise _CellError(self.error(f"`{stripped.split()[0]}` must be the first line of its cell", at,
                                        hint="move it to the top of the cell, as IPython requires"))
        name, _, rest = stripped[1:].partition(" ")
        rest = rest.strip()
        if name in ("load_ext", "reload_ext") and rest == "streamling":
            return True
        if name == "streamling" or (name == "config" and rest.startswith("StreamlingMagics.")):
            return True
        if name == "pip":
            raise _CellError(self.error("`%pip` does not run in a job: it would install into the environment "
                                        "streamling itself runs from", at, hint=_foreign_hint("%pip")))
        if f"%{name}" in LANGUAGE_MAGICS:
            raise _CellError(self.error(f"`%{name}` must be the first line of its cell", at,
                                        hint="a language magic applies to the whole cell: start a new cell with it"))
        self.executed()
        return False

    def line_magic(self, stripped: str, at: int) -> None:
        name, _, rest = stripped[1:].partition(" ")
        rest = rest.strip()
        if name in ("load_ext", "reload_ext"):
            self.extension_loaded = True
        elif name == "config":
            self.config(rest, at)
        else:
            self.streamling(rest, at)

    def config(self, text: str, at: int) -> None:
        match = _CONFIG.match(text)
        if match is None or match.group("cls") != "StreamlingMagics":
            raise _CellError(self.error(f"`%config {clip(text)}` is not part of a job: only "
                                        "`%config StreamlingMagics.<setting> = <value>` is", at,
                                        hint="tag the cell `interactive` to keep it for the notebook only"))
        trait = match.group("trait")
        if trait in IGNORED_SETTINGS:
            return
        if trait not in APPLIED_SETTINGS:
            known = ", ".join(sorted(APPLIED_SETTINGS | IGNORED_SETTINGS))
            raise self.error(f"StreamlingMagics has no setting '{trait}'", at, hint=f"settings: {known}",
                             code="invalid_notebook")
        try:
            value = ast.literal_eval(match.group("value").strip())
        except (ValueError, SyntaxError) as exc:
            raise _CellError(self.error(f"`%config StreamlingMagics.{trait}` must be set to a Python literal in a "
                                        "job", at, hint=f"e.g. %config StreamlingMagics.{trait} = 'my_pipeline'")
                             ) from exc
        if not isinstance(value, str):
            raise self.error(f"StreamlingMagics.{trait} must be a string, not {type(value).__name__}", at,
                             hint=f"e.g. %config StreamlingMagics.{trait} = 'my_pipeline'", code="invalid_notebook")
        if trait == "application_id":
            self.application_id = value or None
        else:
            self.config_name = value or None

    def streamling(self, line: str, at: int) -> None:
        args = parse_line(line, self.values())
        command = args.command
        if command in DISPLAY_COMMANDS or command in RUN_CONTROL_COMMANDS:
            return
        if command == "reset":
            self.warnings.append(f"cell {self.cell.index}: `%streamling reset` is not part of the job: a job never "
                                 "deletes its checkpoints (start over with a new application_id)")
        elif command == "remove":
            if not args.name:
                raise StreamlingError("`%streamling remove` needs NODE", hint="%streamling remove NODE")
            self.nb.remove(str(args.name))
            self.node_cells.pop(str(args.name), None)
        elif command == "run":
            if args.rows is not None and args.seconds is not None:
                raise StreamlingError("give --rows or --seconds, not both")
            if self.run_cell is not None:
                self.warnings.append(f"cell {self.cell.index}: the notebook runs the pipeline again (also in cell "
                                     f"{self.run_cell}); the job runs it once, with the last `%streamling run`'s "
                                     "options")
            self.run_cell = self.cell.index
            self.run = ({"rows": args.rows} if args.rows is not None
                        else {"seconds": args.seconds} if args.seconds is not None else {})
        else:
            raise StreamlingError(f"unknown command '{command}'", hint=f"usage:\n{USAGE}")

    # --- Python: parameter declarations ----------------------------------------------------------

    def python_steps(self, source: str, lines: list[str]) -> list[tuple[int, tuple[str, list[Any], dict[str, Any]]]]:
        """The parameter declarations of a Python cell, applied here; any other statement (or a
        declaration whose arguments are computed) makes the notebook one the job's driver executes."""
        if not source.strip():
            return []
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            if _ipython_syntax(source):  # ``x = !ls``, ``obj?`` …: IPython runs it
                self.executed()
                return []
            raise _CellError(self.error(f"invalid Python: {exc.msg}", self.cell.line((exc.lineno or 1) - 1),
                                        hint="the cell fails in the notebook too: fix it there",
                                        code="invalid_notebook")) from None
        steps: list[tuple[int, tuple[str, list[Any], dict[str, Any]]]] = []
        for statement in tree.body:
            offset = statement.lineno - 1
            if isinstance(statement, (ast.Import, ast.ImportFrom)):
                continue
            call = _widget_call(statement)
            if call is None:
                self.executed()
                continue
            method, node = call
            try:
                args = [ast.literal_eval(a) for a in node.args]
                kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
                if any(k.arg is None for k in node.keywords):
                    raise ValueError("**kwargs")
            except ValueError:
                self.executed()  # computed when the notebook runs
                continue
            steps.append((offset, (method, args, kwargs)))
        return steps

    def widget_call(self, step: tuple[str, list[Any], dict[str, Any]], at: int) -> None:
        method, args, kwargs = step
        if method in WIDGET_READS:
            if method == "get":
                try:
                    name = args[0] if args else kwargs["name"]
                except KeyError:
                    raise StreamlingError("dbutils.widgets.get() needs the widget's name") from None
                if name not in self.values():
                    raise StreamlingError(f"No input widget named {name} is defined",
                                          hint=f"declare it first, e.g. dbutils.widgets.text('{name}', '<default>'), "
                                               "or pass it as a job parameter", code="unknown_parameter")
            return
        try:
            getattr(self.widgets, method)(*args, **kwargs)
        except (TypeError, ValueError, InputWidgetNotDefined) as exc:
            raise StreamlingError(f"dbutils.widgets.{method}: {exc}", code="invalid_notebook") from None

    # --- the document ---------------------------------------------------------------------------

    def validate(self) -> None:
        if not self.nb.nodes:
            if not self.problems and not self.executes:
                self.problems.append(StreamlingError(
                    "the notebook defines no pipeline", location=Location(self.path.name), code="invalid_notebook",
                    hint="add %%streamling source/transform/sink cells"))
            return
        try:
            parse_pipeline(self.nb.to_yaml(), source=self.path.name)
        except StreamlingError as exc:
            for problem in problems_of(exc):
                if not self.follows_a_failed_cell(problem):
                    problem.location = self.node_location(problem)
                    self.problems.append(problem)

    def follows_a_failed_cell(self, problem: StreamlingError) -> bool:
        """A validation problem that only repeats a cell's failure (its node is missing)."""
        missing = {name: kind for name, kind in self.failed.items() if name is None or name not in self.nb.nodes}
        if not missing:
            return False
        if problem.message.startswith("the pipeline has no "):
            section = problem.message.removeprefix("the pipeline has no ")
            return any(SECTIONS.get(section) == kind or kind == "pipeline" for kind in missing.values())
        return any(name is not None and name != problem.node and f"'{name}'" in problem.message for name in missing)

    def node_location(self, problem: StreamlingError) -> Location:
        node = problem.node
        if node not in self.node_cells and problem.location is not None:
            path = problem.location.path.removeprefix("definition.")
            best = ""
            for section in SECTIONS:
                for name in self.node_cells:
                    prefix = f"{section}.{name}"
                    if (path == prefix or path.startswith(prefix + ".")) and len(name) > len(best):
                        best = name
            node = best or None
        if node in self.node_cells:
            cell, line = self.node_cells[node]
            return Location(f"{self.path.name}: cell {cell}", line)
        return Location(self.path.name)


def _ipython_syntax(source: str) -> bool:
    """Whether ``source`` is valid once IPython has transformed its own syntax into Python."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return False
    return True


def _widget_call(statement: ast.stmt) -> tuple[str, ast.Call] | None:
    """``dbutils.widgets.<declaration|remove|removeAll>(…)`` or ``x = dbutils.widgets.get(…)``."""
    if isinstance(statement, ast.Expr):
        allowed, value = WIDGET_DECLARATIONS | {"remove", "removeAll"}, statement.value
    elif (isinstance(statement, ast.Assign) and len(statement.targets) == 1
          and isinstance(statement.targets[0], ast.Name)):
        allowed, value = WIDGET_READS, statement.value
    else:
        return None
    if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Attribute):
        return None
    owner = value.func.value
    if (value.func.attr in allowed and isinstance(owner, ast.Attribute) and owner.attr == "widgets"
            and isinstance(owner.value, ast.Name) and owner.value.id == "dbutils"):
        return value.func.attr, value
    return None


def _foreign_hint(magic: str) -> str:
    if magic == "%pip":
        return ("install the package into the environment the job runs in before deploying, or tag the cell "
                "`interactive` to keep it for the notebook only")
    return "tag the cell `interactive` to keep it for the notebook only"


def _first(exc: StreamlingError) -> str:
    """The problems as the notebook shows them, without their location (the warning names the cell)."""
    lines = []
    for p in problems_of(exc):
        head = f"Node '{p.node}': " if p.node else ""
        lines.append(f"{head}{p.message}{' — ' + p.hint if p.hint else ''}")
    return "; ".join(lines)


def compile_notebook(path: Path, parameters: Mapping[str, str] | None = None) -> CompiledNotebook:
    """The pipeline ``path``'s cells build, with ``parameters`` (job parameters) over the defaults its
    ``dbutils.widgets`` declare. Raises ``ValidationError`` listing every problem found."""
    path = Path(path)
    compiler = _Compiler(path, parameters or {})
    compiler.compile(read_notebook(path))
    compiler.validate()
    if compiler.problems:
        raise ValidationError(compiler.problems)
    return CompiledNotebook(path=path, document=compiler.nb.document(), application_id=compiler.application_id,
                            config_name=compiler.config_name, parameters=compiler.widgets.defaults(),
                            run=compiler.run, warnings=compiler.warnings, executes=compiler.executes,
                            includes=compiler.includes)
