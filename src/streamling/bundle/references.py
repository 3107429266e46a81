"""Databricks' dynamic value references in task parameters: ``{{job.run_id}}``, ``{{job.parameters.x}}``…

A task's ``base_parameters``, its ``parameters`` (Python file and wheel tasks) and a job's parameter
defaults may hold references that the job runner fills in when the task starts, as Databricks
does: ``{{job.id}}``, ``{{job.name}}``, ``{{job.run_id}}``, ``{{job.repair_count}}``,
``{{job.trigger.type}}``, ``{{job.start_time.<part>}}`` (``iso_date``, ``iso_datetime``, ``year``,
``month``, ``day``, ``hour``, ``minute``, ``second``, ``timestamp_ms``, ``is_weekday``, in UTC),
``{{job.parameters.<name>}}`` (or ``{{job.parameters.[name]}}``), ``{{task.name}}``,
``{{task.run_id}}``, ``{{task.execution_count}}``, ``{{task.notebook_path}}``, ``{{workspace.id}}``,
``{{workspace.url}}`` and the deprecated ``{{job_id}}``, ``{{run_id}}``, ``{{parent_run_id}}``,
``{{task_key}}``, ``{{task_retry_count}}``, ``{{start_date}}``, ``{{start_time}}``.

In the task a ``for_each_task`` runs, ``{{input}}`` is the iteration's input (a string as it is,
anything else as JSON).

``{{tasks.<task>.values.<key>}}`` is what an upstream task set with ``dbutils.jobs.taskValues.set``
(a string as it is, anything else as JSON); a value the task did not set fails the task that reads
it. ``check`` finds what cannot be filled in before anything runs: an unknown reference (naming the
valid ones), a job parameter the job does not declare, a value of a task this one does not depend
on, and other tasks' results (``{{tasks.<task>.run_id}}``…), which this runner does not record —
a validation error, never a parameter left unreplaced or silently empty.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamling.bundle.model import PAYLOADS
from streamling.bundle.tree import as_dict, as_list
from streamling.errors import StreamlingError
from streamling.util import did_you_mean

if TYPE_CHECKING:
    from streamling.bundle.model import Task

REFERENCE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_START_PARTS = ("iso_date", "iso_datetime", "year", "month", "day", "hour", "minute", "second", "timestamp_ms",
                "is_weekday")
_NAMES = ("job.id", "job.name", "job.run_id", "job.repair_count", "job.trigger.type", "task.name", "task.run_id",
          "task.execution_count", "task.notebook_path", "workspace.id", "workspace.url",
          *(f"job.start_time.{p}" for p in _START_PARTS),
          # deprecated forms Databricks still fills in
          "job_id", "run_id", "parent_run_id", "task_key", "task_retry_count", "start_date", "start_time")
_PARAMETER = re.compile(r"job\.parameters\.(?:\[(?P<quoted>[^\]]+)\]|(?P<plain>[A-Za-z0-9_.\-]+))$")
_TASK_VALUE = re.compile(r"tasks\.(?P<task>[^.]+)\.values\.(?P<key>.+)$")


@dataclass(frozen=True)
class RunContext:
    """What the references of one task attempt are filled in from (the runner knows it all)."""

    job_key: str
    job_name: str
    run_id: int
    task_key: str
    attempt_id: int
    attempt: int  #: 1 for the first attempt
    start_time: float  #: the run's start, Unix seconds
    trigger: str  #: manual | schedule | periodic | continuous | …
    notebook_path: str = ""
    workspace: str = ""  #: the bundle root
    #: what the run's finished tasks set with ``dbutils.jobs.taskValues.set``: task → key → value
    task_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: in an iteration of a for-each task: its input, as ``{{input}}`` gives it
    input: str | None = None


def check(text: str, job_parameters: Iterable[str], upstream: Iterable[str] = (), iteration: bool = False) -> list[str]:
    """The problems of the references in ``text`` (empty: every one can be filled in). ``upstream``:
    the tasks the task depends on, directly or not (whose values it may read); ``iteration``: the
    text is in the task a for-each task runs, where ``{{input}}`` is defined."""
    declared, before = list(job_parameters), list(upstream)
    problems = []
    for match in REFERENCE.finditer(text):
        name = match.group(1)
        if name in _NAMES or (name == "input" and iteration):
            continue
        if name == "input":
            problems.append("'{{input}}' is only defined in the task of a for_each_task")
            continue
        param = _PARAMETER.match(name)
        if param is not None:
            wanted = param.group("quoted") or param.group("plain")
            if wanted not in declared:
                problems.append(f"'{{{{{name}}}}}' names job parameter '{wanted}', which the job does not declare"
                                f"{did_you_mean(wanted, declared)}")
            continue
        value = _TASK_VALUE.match(name)
        if value is not None:
            if value.group("task") not in before:
                problems.append(f"'{{{{{name}}}}}' reads a value of task '{value.group('task')}', which this task "
                                f"does not depend on{did_you_mean(value.group('task'), before)}")
            continue
        if name.startswith("tasks."):
            problems.append(f"'{{{{{name}}}}}': of other tasks, only their values ({{{{tasks.<task>.values.<key>}}}}) "
                            "are filled in here")
            continue
        problems.append(f"unknown reference '{{{{{name}}}}}'{did_you_mean(name, list(_NAMES), cutoff=0.7)}; "
                        f"valid: {', '.join('{{' + n + '}}' for n in _NAMES[:11])}, {{{{job.start_time.<part>}}}}, "
                        "{{job.parameters.<name>}}")
    return problems


def job_problems(path: str, raw_tasks: Any, raw_parameters: Any, parameters: Mapping[str, str],
                 tasks: list[Task]) -> list[tuple[str, str]]:
    """Each reference a job's parameter defaults and its tasks' parameters hold (at ``path``, the job's
    YAML path) that ``check`` finds cannot be filled in, as (YAML path, problem): what the bundle
    validation reports before anything runs."""
    deps = {t.key: t.depends_on for t in tasks}

    def upstream(key: str) -> set[str]:
        seen: set[str] = set()
        todo = list(deps.get(key, []))
        while todo:
            dep = todo.pop()
            if dep not in seen:
                seen.add(dep)
                todo.extend(deps.get(dep, []))
        return seen

    places: list[tuple[str, Any, set[str], bool]] = [
        (f"{path}.parameters.{i}.default", as_dict(item).get("default"), set(), False)
        for i, item in enumerate(as_list(raw_parameters))]

    def add_places(where: str, item: Any, before: set[str], in_loop: bool) -> None:
        """The texts of a task that may hold references (``{{input}}`` only in a for-each's task)."""
        for kind in PAYLOADS:
            spec = as_dict(as_dict(item).get(kind))
            if kind == "for_each_task" and spec:
                places.append((f"{where}.{kind}.inputs", spec.get("inputs"), before, False))
                add_places(f"{where}.{kind}.task", spec.get("task"), before, True)
                continue
            named = as_dict(spec.get("parameters"))  # a SQL task's parameters are named
            texts = [*(("base_parameters", k, v) for k, v in as_dict(spec.get("base_parameters")).items()),
                     *(("parameters", k, v) for k, v in (named.items() if named else
                                                         enumerate(as_list(spec.get("parameters"))))),
                     *(("named_parameters", k, v) for k, v in as_dict(spec.get("named_parameters")).items()),
                     *(("job_parameters", k, v) for k, v in as_dict(spec.get("job_parameters")).items())]
            places.extend((f"{where}.{kind}.{group}.{k}", v, before, in_loop) for group, k, v in texts)
            places.extend((f"{where}.{kind}.{side}", spec.get(side), before, in_loop) for side in ("left", "right"))

    for i, item in enumerate(as_list(raw_tasks)):
        add_places(f"{path}.tasks.{i}", item, upstream(str(as_dict(item).get("task_key"))), False)
    return [(where, problem) for where, value, before, in_loop in places if isinstance(value, str)
            for problem in check(value, parameters, sorted(before), iteration=in_loop)]


def resolve(text: str, context: RunContext, job_parameters: Mapping[str, str]) -> str:
    """``text`` with every reference filled in (``check`` has passed at deploy)."""
    if "{{" not in text:
        return text
    start = dt.datetime.fromtimestamp(context.start_time, dt.UTC)
    values = {
        "job.id": context.job_key, "job_id": context.job_key, "job.name": context.job_name,
        "job.run_id": str(context.run_id), "run_id": str(context.attempt_id), "parent_run_id": str(context.run_id),
        "job.repair_count": "0", "job.trigger.type": context.trigger,
        "task.name": context.task_key, "task_key": context.task_key, "task.run_id": str(context.attempt_id),
        "task.execution_count": str(context.attempt), "task_retry_count": str(context.attempt - 1),
        "task.notebook_path": context.notebook_path, "workspace.id": context.workspace,
        "workspace.url": f"file://{context.workspace}" if context.workspace else "",
        "start_date": start.date().isoformat(), "start_time": str(int(context.start_time * 1000)),
        "job.start_time.iso_date": start.date().isoformat(),
        "job.start_time.iso_datetime": start.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "job.start_time.year": str(start.year), "job.start_time.month": str(start.month),
        "job.start_time.day": str(start.day), "job.start_time.hour": str(start.hour),
        "job.start_time.minute": str(start.minute), "job.start_time.second": str(start.second),
        "job.start_time.timestamp_ms": str(int(context.start_time * 1000)),
        "job.start_time.is_weekday": "true" if start.weekday() < 5 else "false",
    }

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        param = _PARAMETER.match(name)
        if param is not None:
            return str(job_parameters.get(param.group("quoted") or param.group("plain") or "", ""))
        task_value = _TASK_VALUE.match(name)
        if task_value is not None:
            got = context.task_values.get(task_value.group("task"), {})
            if task_value.group("key") not in got:
                raise StreamlingError(f"task parameter reference '{{{{{name}}}}}': task '{task_value.group('task')}' "
                                      f"set no value '{task_value.group('key')}' in this run",
                                      code="task_value_missing",
                                      hint="set it there with dbutils.jobs.taskValues.set(key, value)")
            item = got[task_value.group("key")]
            return item if isinstance(item, str) else json.dumps(item)
        if name == "input" and context.input is not None:
            return context.input
        return values.get(name, match.group(0))

    return REFERENCE.sub(fill, text)


def job_parameter_values(job: Mapping[str, Any], run_params: Mapping[str, str]) -> dict[str, str]:
    """A run's job parameters (what ``{{job.parameters.x}}`` reads): the deployed job's defaults,
    then the run's values for them."""
    declared = job.get("parameters") or {}
    return {**{k: str(v) for k, v in declared.items()}, **{k: v for k, v in run_params.items() if k in declared}}


def compare(op: str, left: str, right: str) -> bool:
    """A condition task's outcome, as Databricks evaluates it: ``EQUAL_TO``/``NOT_EQUAL`` compare the
    texts, the others compare numbers (a value that is not one is a ``ValueError``)."""
    if op == "EQUAL_TO":
        return left == right
    if op == "NOT_EQUAL":
        return left != right
    numbers = []
    for side in (left, right):
        try:
            numbers.append(float(side))
        except ValueError:
            raise ValueError(f"{op} compares numbers, and '{side}' is not one") from None
    a, b = numbers
    return {"GREATER_THAN": a > b, "GREATER_THAN_OR_EQUAL": a >= b, "LESS_THAN": a < b,
            "LESS_THAN_OR_EQUAL": a <= b}[op]
