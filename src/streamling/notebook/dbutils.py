"""A local ``dbutils`` with Databricks' ``dbutils.widgets`` (notebook parameters that jobs override)
and ``dbutils.jobs.taskValues`` (values a job's task hands to the tasks after it, ``TaskValues``).

A notebook declares its parameters the Databricks way::

    dbutils.widgets.text("topic", "orders", "Kafka topic")
    topic = dbutils.widgets.get("topic")

and a ``%%streamling`` cell refers to one as ``{{topic}}`` or ``${topic}``. A widget's value is its
declared default unless a job parameter of the same name is set: the job runner passes them as a
JSON object (name → string) in ``STREAMLING_JOB_PARAMETERS``, which also lets a papermill or
nbconvert run pass parameters. A job parameter is readable with ``get`` even when no widget
declares it, as on Databricks. ``load_ipython_extension`` puts this object in the notebook's
namespace only when ``dbutils`` is not defined there already (on Databricks the real one wins).

In a notebook (a Jupyter kernel) the declared widgets are input controls — a text box, a
dropdown, a combobox or a multi-select, as Databricks draws them — in a bar above the cells where
the front end has one, else in the declaring cell (``parameter_bar``); a value changed there is what
``get`` and ``{{name}}`` read from then on (a job parameter still wins). The bundle compiler reads
the same declarations from the notebook's source without running it (``streamling.bundle.compile``);
a job uses the defaults and its parameters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamling.errors import StreamlingError

PARAMETERS_ENV = "STREAMLING_JOB_PARAMETERS"
#: in a job task: what the run's upstream tasks set (JSON: task → key → value)
TASK_VALUES_ENV = "STREAMLING_TASK_VALUES"
#: in a job task: the file its own values go to (the runner stores them when the task succeeds)
TASK_VALUES_FILE_ENV = "STREAMLING_TASK_VALUES_FILE"
#: Databricks' limit on one task value, as JSON
MAX_TASK_VALUE_BYTES = 48 * 1024
_UNSET: Any = object()


def values_file(log_path: Path | str) -> Path:
    """Where a task attempt (logging to ``log_path``) leaves the values it set."""
    return Path(f"{log_path}.values.json")


def output_file(log_path: Path | str) -> Path:
    """Where a notebook task's attempt leaves the value it exited with (``dbutils.notebook.exit``)."""
    return Path(f"{log_path}.output.json")


class InputWidgetNotDefined(LookupError):
    """``dbutils.widgets.get`` of a name no widget declares and no job parameter sets."""


def job_parameters(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's parameters from ``STREAMLING_JOB_PARAMETERS`` (empty when unset)."""
    env = os.environ if environ is None else environ
    raw = env.get(PARAMETERS_ENV, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StreamlingError(f"{PARAMETERS_ENV} is not valid JSON: {exc}",
                              hint='set it to a JSON object of strings, e.g. {"topic": "orders"}') from exc
    if not isinstance(data, dict):
        raise StreamlingError(f"{PARAMETERS_ENV} must be a JSON object (name → value)",
                              hint='e.g. {"topic": "orders"}')
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


@dataclass
class Widget:
    """One declared widget: its kind, default, choices and label."""

    kind: str
    default: str
    choices: list[str] = field(default_factory=list)
    label: str | None = None
    #: what the notebook's input control holds now (None: untouched, the default)
    value: str | None = None


def _text(value: object, what: str) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (list, tuple, dict, set)):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    return str(value)


class Widgets:
    """``dbutils.widgets``: declared defaults overridden by job parameters.

    ``environ`` is read on every call (``None``: the process environment), so parameters set after
    the object was made still count.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self._widgets: dict[str, Widget] = {}
        self._bar: Any = None  #: the kernel's ParameterBar, once a declaration showed it
        self._shown_in: int | None = None  #: the cell (execution count) that showed it last

    # --- declaring ----------------------------------------------------------------------------

    def _declare(self, kind: str, name: str, defaultValue: str, choices: Sequence[str] | None,
                 label: str | None) -> None:
        name = _text(name, "the widget name")
        default = _text(defaultValue, f"the default value of widget '{name}'")
        options = [_text(c, f"a choice of widget '{name}'") for c in choices] if choices is not None else []
        if choices is not None and not options:
            raise ValueError(f"widget '{name}' needs at least one choice")
        if kind in ("dropdown", "multiselect"):
            picked = [v.strip() for v in default.split(",")] if kind == "multiselect" else [default]
            missing = [v for v in picked if v not in options]
            if missing:
                raise ValueError(f"default value {default!r} of {kind} widget '{name}' is not one of its choices: "
                                 f"{', '.join(options)}")
        previous = self._widgets.get(name)
        widget = Widget(kind, default, options, label)
        if previous is not None and previous.kind == kind and previous.value is not None \
                and (kind in ("text", "combobox") or set(previous.value.split(",")) <= set(options)):
            widget.value = previous.value  # as on Databricks: re-running the cell keeps what was entered
        self._widgets[name] = widget
        from streamling.notebook import in_kernel

        if in_kernel():
            self._show()

    def _show(self) -> None:
        """Show the widget that draws every declared widget's input control (``ParameterBar``), up to
        date, once per cell: a cell declaring several widgets gets one view of it."""
        from IPython import get_ipython
        from IPython.display import display, update_display

        from streamling.notebook.parameter_bar import ParameterBar

        if self._bar is None:
            self._bar = ParameterBar(self)
        else:
            self._bar.refresh()
        cell = getattr(get_ipython(), "execution_count", None)
        # Every view is one display of the bar: updating it refreshes what renderers without widgets
        # show (the text and HTML fallback) in every cell that showed it.
        shown = f"streamling-parameters-{self._bar.model_id}"
        if cell is None or cell != self._shown_in:
            self._shown_in = cell
            display(self._bar, display_id=shown)
        else:
            update_display(self._bar, display_id=shown)

    def text(self, name: str, defaultValue: str, label: str | None = None) -> None:
        """A free-text parameter."""
        self._declare("text", name, defaultValue, None, label)

    def dropdown(self, name: str, defaultValue: str, choices: Sequence[str],
                 label: str | None = None) -> None:
        """A parameter with one of ``choices``; the default must be one of them."""
        self._declare("dropdown", name, defaultValue, choices, label)

    def combobox(self, name: str, defaultValue: str, choices: Sequence[str],
                 label: str | None = None) -> None:
        """A free-text parameter with suggested ``choices``."""
        self._declare("combobox", name, defaultValue, choices, label)

    def multiselect(self, name: str, defaultValue: str, choices: Sequence[str],
                    label: str | None = None) -> None:
        """Several of ``choices``, as one comma-separated string."""
        self._declare("multiselect", name, defaultValue, choices, label)

    def remove(self, name: str) -> None:
        if name not in self._widgets:
            raise InputWidgetNotDefined(f"No input widget named {name} is defined")
        del self._widgets[name]
        self._refresh_shown()

    def removeAll(self) -> None:
        self._widgets.clear()
        self._refresh_shown()

    def _refresh_shown(self) -> None:
        if self._bar is not None:
            from IPython.display import update_display

            self._bar.refresh()
            update_display(self._bar, display_id=f"streamling-parameters-{self._bar.model_id}")

    # --- reading ------------------------------------------------------------------------------

    def defaults(self) -> dict[str, str]:
        """Declared widgets and their defaults, before job parameters."""
        return {name: w.default for name, w in self._widgets.items()}

    def values(self) -> dict[str, str]:
        """Declared widgets and what their controls hold (the default until changed in the page)."""
        return {name: w.value if w.value is not None else w.default for name, w in self._widgets.items()}

    def declared(self) -> dict[str, Widget]:
        return dict(self._widgets)

    def getAll(self) -> dict[str, str]:
        """Every widget's value and every job parameter (a job parameter wins over a default)."""
        return {**self.values(), **job_parameters(self._environ)}

    def get(self, name: str) -> str:
        values = self.getAll()
        if name not in values:
            raise InputWidgetNotDefined(f"No input widget named {name} is defined")
        return values[name]

    def getArgument(self, name: str, default: str | None = None) -> str | None:
        """Databricks' older form of ``get``: ``default`` when the widget is not defined."""
        return self.getAll().get(name, default)

    def __repr__(self) -> str:
        return f"<streamling widgets: {', '.join(self._widgets) or 'none declared'}>"


class TaskValues:
    """``dbutils.jobs.taskValues``: small JSON values a job's task hands to the tasks after it.

    In a job task (the runner sets ``STREAMLING_TASK_VALUES`` and ``…_FILE``) ``set`` records a
    value the runner keeps once the task succeeds, and ``get`` reads what an upstream task set (or
    ``default``; with neither, a ``ValueError``), as do ``{{tasks.<task>.values.<key>}}`` references
    in task parameters. Outside a job, as on Databricks, ``set`` does nothing and ``get`` returns
    ``debugValue`` (a ``TypeError`` without one)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def set(self, key: str, value: Any) -> None:
        key = _text(key, "the task value key")
        try:
            text = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"task value '{key}' must be JSON-serializable: {exc}") from None
        if len(text.encode()) > MAX_TASK_VALUE_BYTES:
            raise ValueError(f"task value '{key}' is {len(text.encode()):,} bytes as JSON; the limit is 48 KiB")
        target = self._env().get(TASK_VALUES_FILE_ENV)
        if not target:
            return  # not in a job: nothing downstream to hand it to
        path = Path(target)
        current = json.loads(path.read_text()) if path.exists() else {}
        current[key] = value
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(current))
        tmp.replace(path)

    def get(self, taskKey: str, key: str, default: Any = _UNSET, debugValue: Any = _UNSET) -> Any:  # noqa: N803
        raw = self._env().get(TASK_VALUES_ENV)
        if raw is None:
            if debugValue is _UNSET:
                raise TypeError(f"dbutils.jobs.taskValues.get('{taskKey}', '{key}') runs outside a job: give "
                                "debugValue= for what it returns there")
            return debugValue
        values = json.loads(raw or "{}")
        if key in (values.get(taskKey) or {}):
            return values[taskKey][key]
        if default is not _UNSET:
            return default
        raise ValueError(f"task '{taskKey}' set no task value '{key}' in this run (or it does not run before "
                         "this task)")


class Fs:
    """``dbutils.fs`` on Hadoop file systems, as Databricks has it: ``ls``, ``cp``, ``mv``, ``rm``,
    ``mkdirs``, ``put``, ``head``. Paths are local paths, ``file:`` URIs or any URI the session's
    Hadoop configuration reaches (``hdfs://``, ``s3a://`` …), through ``streamling.storage``;
    ``dbfs:/`` names Databricks' own file system, which does not exist here."""

    def _storage(self, *paths: str) -> Any:
        from streamling import storage

        for path in paths:
            if storage.scheme(path) == "dbfs":
                raise StreamlingError(f"{path} is on DBFS, Databricks' own file system, which does not exist here",
                                      hint="use a local path, file:/…, hdfs://… or s3a://…")
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is not None:
            return storage.HadoopStorage(spark)
        if all(storage.is_local(p) for p in paths):
            return storage.LocalStorage()
        raise StreamlingError(f"dbutils.fs needs a Spark session for {', '.join(p for p in paths if ':' in p)}",
                              hint="create one first (in a job it exists as spark)")

    def ls(self, dir: str) -> list[Any]:  # noqa: A002 - Databricks' parameter name
        return list(self._storage(dir).ls(dir))

    def cp(self, from_: str, to: str, recurse: bool = False) -> bool:
        self._storage(from_, to).copy(from_, to, recurse)
        return True

    def mv(self, from_: str, to: str, recurse: bool = False) -> bool:  # noqa: ARG002 - a move takes folders whole
        self._storage(from_, to).move(from_, to)
        return True

    def rm(self, dir: str, recurse: bool = False) -> bool:  # noqa: A002 - Databricks' parameter name
        storage = self._storage(dir)
        if not storage.exists(dir):
            return False
        entries = storage.ls(dir)
        a_file = len(entries) == 1 and entries[0].isFile() and entries[0].name == dir.rstrip("/").rsplit("/", 1)[-1]
        if entries and not a_file and not recurse:
            raise StreamlingError(f"{dir} is a folder that is not empty", hint="remove it with recurse=True")
        storage.delete(dir)
        return True

    def mkdirs(self, dir: str) -> bool:  # noqa: A002 - Databricks' parameter name
        self._storage(dir).mkdirs(dir)
        return True

    def put(self, file: str, contents: str, overwrite: bool = False) -> bool:
        self._storage(file).put(file, contents.encode("utf-8"), overwrite)
        return True

    def head(self, file: str, maxBytes: int = 65536) -> str:  # noqa: N803 - Databricks' parameter name
        return bytes(self._storage(file).head(file, maxBytes)).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "<streamling dbutils.fs: ls, cp, mv, rm, mkdirs, put, head>"


class NotebookExit(Exception):  # noqa: N818 - Databricks' verb, not an error
    """``dbutils.notebook.exit(value)``: the notebook ends here, successfully, with ``value``."""

    def __init__(self, value: str) -> None:
        super().__init__(value)
        self.value = value


class Notebook:
    """``dbutils.notebook``: ``exit`` ends the notebook with a value (a job task succeeds with it,
    and Run All stops at it); ``run`` runs another notebook where a job's driver provides it
    (``streamling.bundle.notebook_job``)."""

    #: set by the job's driver: runs a notebook and returns its exit value
    runner: Any = None

    def exit(self, value: Any) -> None:
        raise NotebookExit("" if value is None else str(value))

    def run(self, path: str, timeout_seconds: int = 0, arguments: Mapping[str, Any] | None = None) -> str:
        if self.runner is None:
            raise StreamlingError("dbutils.notebook.run runs a notebook as part of a job here: it is not available "
                                  "in an interactive notebook", hint="use %run to include a notebook's cells, or "
                                  "run this notebook as a bundle job")
        return str(self.runner(path, timeout_seconds, dict(arguments or {})))


class Jobs:
    """``dbutils.jobs``."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.taskValues = TaskValues(environ)


class DBUtils:
    """The part of Databricks' ``dbutils`` a streamling notebook or job task uses outside Databricks.

    A Python file or wheel task gets it as on Databricks, ``from databricks.sdk.runtime import
    dbutils`` (``provide_databricks_runtime``), or with ``from streamling.notebook.dbutils import dbutils``."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        from streamling.secrets import Secrets

        self.widgets = Widgets(environ)
        self.jobs = Jobs(environ)
        self.notebook = Notebook()
        self.fs = Fs()
        self.secrets = Secrets(dict(environ) if environ is not None else None)

    def __repr__(self) -> str:
        return ("<streamling dbutils (widgets, jobs.taskValues, notebook, secrets, fs): the local stand-in for "
                "Databricks' dbutils>")


#: The notebook's ``dbutils`` when the kernel has none (see ``load_ipython_extension``).
dbutils = DBUtils()


def provide_databricks_runtime(namespace: Mapping[str, Any] | None = None) -> None:
    """Make ``from databricks.sdk.runtime import dbutils, spark, display`` in a job's code get ours,
    unless the Databricks SDK itself is installed (then its own module is what the code asked for).

    ``namespace`` holds the objects a notebook already has; a Python file or wheel task has none, so
    ``spark`` (and ``sc``, ``sql``, ``table``) is the session its own ``SparkSession.builder`` would
    get, made on first use: code that never asks for it starts no JVM."""
    import sys
    import types

    try:
        import databricks.sdk.runtime  # noqa: F401
        return
    except ImportError:
        pass
    for name in ("databricks", "databricks.sdk"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []
            sys.modules[name] = module
    runtime = types.ModuleType("databricks.sdk.runtime", "streamling's stand-in for Databricks' runtime objects")
    objects: dict[str, Any] = {"dbutils": dbutils, "getArgument": dbutils.widgets.getArgument,
                               "display": _display, "displayHTML": print, **(namespace or {})}
    runtime.__dict__.update(objects)

    def lazy(name: str) -> Any:
        if name not in ("spark", "sc", "sql", "table"):
            raise AttributeError(f"module 'databricks.sdk.runtime' has no attribute '{name}'")
        if "spark" not in runtime.__dict__:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.getOrCreate()
            runtime.__dict__.update(spark=spark, sc=spark.sparkContext, sql=spark.sql, table=spark.table)
        return runtime.__dict__[name]

    runtime.__getattr__ = lazy  # type: ignore[method-assign]
    sys.modules["databricks.sdk.runtime"] = runtime


def _display(obj: Any, *args: Any, **kwargs: Any) -> None:
    """``display`` outside a notebook: a DataFrame's rows as ``show`` prints them, anything else as text."""
    show = getattr(obj, "show", None)
    if callable(show):
        show(truncate=False)
    else:
        print(obj)
