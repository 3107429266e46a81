"""Databricks' dynamic value references in task parameters: ``{{job.run_id}}``, ``{{job.parameters.x}}``…

A task's ``base_parameters``, its ``parameters`` (Python file and wheel tasks) and a job's parameter
defaults may hold references that the job runner fills in when the task starts, as Databricks
does: ``{{job.id}}``, ``{{job.name}}``, ``{{job.run_id}}``, ``{{job.repair_count}}``,
``{{job.trigger.type}}``, ``{{job.start_time.<part>}}`` (``iso_date``, ``iso_datetime``, ``year``,
``month``, ``day``, ``hour``, ``minute``, ``second``, ``timestamp_ms``, ``is_weekday``, in UTC),
``{{job.trigger.time.<part>}}`` (the same parts, of the moment the run was triggered: created),
``{{job.parameters.<name>}}`` (or ``{{job.parameters.[name]}}``), ``{{task.name}}``,
``{{task.run_id}}``, ``{{task.execution_count}}``, ``{{task.notebook_path}}``, ``{{workspace.id}}``,
``{{workspace.url}}`` and the deprecated ``{{job_id}}``, ``{{run_id}}``, ``{{parent_run_id}}``,
``{{task_key}}``, ``{{task_retry_count}}``, ``{{start_date}}``, ``{{start_time}}``.

In the task a ``for_each_task`` runs, ``{{input}}`` is the iteration's input (a string as it is,
anything else as JSON).

``{{tasks.<task>.values.<key>}}`` is what an upstream task set with ``dbutils.jobs.taskValues.set``
(a string as it is, anything else as JSON); a value the task did not set fails the task that reads
it. An upstream task's result is ``{{tasks.<task>.result_state}}`` (Databricks' words: ``success``,
``failed``, ``timedout``, ``canceled``, ``excluded``, ``upstream_failed``),
``{{tasks.<task>.error_code}}`` (``RunExecutionError`` when it failed or timed out, else empty),
``{{tasks.<task>.execution_count}}`` (its attempts) and ``{{tasks.<task>.run_id}}`` (its last
attempt's id; empty for a task that started no process: a condition, an excluded task). ``check``
finds what cannot be filled in before anything runs: an unknown reference (naming the valid ones),
a job parameter the job does not declare, and a value or result of a task this one does not depend
on — a validation error, never a parameter left unreplaced or silently empty.
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
          *(f"job.start_time.{p}" for p in _START_PARTS), *(f"job.trigger.time.{p}" for p in _START_PARTS),
          # deprecated forms Databricks still fills in
          "job_id", "run_id", "parent_run_id", "task_key", "task_retry_count", "start_date", "start_time")
_PARAMETER = re.compile(r"job\.parameters\.(?:\[(?P<quoted>[^\]]+)\]|(?P<plain>[A-Za-z0-9_.\-]+))$")
_TASK_VALUE = re.compile(r"tasks\.(?P<task>[^.]+)\.values\.(?P<key>.+)$")
_TASK_RESULT = re.compile(r"tasks\.(?P<task>[^.]+)\.(?P<field>result_state|error_code|execution_count|run_id)$")
#: the runner's end states of a task, as Databricks' ``result_state`` says them
RESULT_STATES = {"succeeded": "success", "failed": "failed", "timed_out": "timedout", "cancelled": "canceled",
                 "excluded": "excluded", "upstream_failed": "upstream_failed"}


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
    #: when the run was triggered (created), Unix seconds; 0: its start
    trigger_time: float = 0.0
    #: the run's ended tasks: task → {result_state, error_code, execution_count, run_id}
    task_results: dict[str, dict[str, str]] = field(default_factory=dict)


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
        value = _TASK_VALUE.match(name) or _TASK_RESULT.match(name)
        if value is not None:
            what = "a value" if value.re is _TASK_VALUE else "the result"
            if value.group("task") not in before:
                problems.append(f"'{{{{{name}}}}}' reads {what} of task '{value.group('task')}', which this task "
                                f"does not depend on{did_you_mean(value.group('task'), before)}")
            continue
        if name.startswith("tasks."):
            problems.append(f"'{{{{{name}}}}}': of another task, {{{{tasks.<task>.values.<key>}}}}, .result_state, "
                            ".error_code, .execution_count and .run_id are filled in")
            continue
        problems.append(f"unknown reference '{{{{{name}}}}}'{did_you_mean(name, list(_NAMES), cutoff=0.7)}; "
                        f"valid: {', '.join('{{' + n + '}}' for n in _NAMES[:11])}, {{{{job.start_time.<part>}}}}, "
                        "{{job.trigger.time.<part>}}, {{job.parameters.<name>}}, {{tasks.<task>.values.<key>}}, "
                        "{{tasks.<task>.result_state}}")
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
    triggered = context.trigger_time or context.start_time
    values = {**_moment("job.start_time", start, context.start_time),
              **_moment("job.trigger.time", dt.datetime.fromtimestamp(triggered, dt.UTC), triggered),
        "job.id": context.job_key, "job_id": context.job_key, "job.name": context.job_name,
        "job.run_id": str(context.run_id), "run_id": str(context.attempt_id), "parent_run_id": str(context.run_id),
        "job.repair_count": "0", "job.trigger.type": context.trigger,
        "task.name": context.task_key, "task_key": context.task_key, "task.run_id": str(context.attempt_id),
        "task.execution_count": str(context.attempt), "task_retry_count": str(context.attempt - 1),
        "task.notebook_path": context.notebook_path, "workspace.id": context.workspace,
        "workspace.url": f"file://{context.workspace}" if context.workspace else "",
        "start_date": start.date().isoformat(), "start_time": str(int(context.start_time * 1000)),
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
        result = _TASK_RESULT.match(name)
        if result is not None:
            # check() let only tasks this one depends on through, and those have ended
            return context.task_results.get(result.group("task"), {}).get(result.group("field"), "")
        if name == "input" and context.input is not None:
            return context.input
        return values.get(name, match.group(0))

    return REFERENCE.sub(fill, text)


def _moment(prefix: str, when: dt.datetime, seconds: float) -> dict[str, str]:
    """``{{<prefix>.<part>}}`` of a moment, in UTC, as Databricks gives them."""
    return {f"{prefix}.iso_date": when.date().isoformat(),
            f"{prefix}.iso_datetime": when.isoformat(timespec="seconds").replace("+00:00", "Z"),
            f"{prefix}.year": str(when.year), f"{prefix}.month": str(when.month), f"{prefix}.day": str(when.day),
            f"{prefix}.hour": str(when.hour), f"{prefix}.minute": str(when.minute),
            f"{prefix}.second": str(when.second), f"{prefix}.timestamp_ms": str(int(seconds * 1000)),
            f"{prefix}.is_weekday": "true" if when.weekday() < 5 else "false"}


def task_results(tasks: Iterable[Mapping[str, Any]],
                 attempts: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """What ``{{tasks.<task>.result_state}}``… read: the run's ended tasks from the run store's rows."""
    last_attempt = {str(a["task_key"]): str(a["id"]) for a in attempts}  # ordered by id: the last one wins
    out = {}
    for task in tasks:
        state = RESULT_STATES.get(str(task["state"]))
        if state is None:  # not ended
            continue
        key = str(task["task_key"])
        failed = state in ("failed", "timedout")
        out[key] = {"result_state": state, "error_code": "RunExecutionError" if failed else "",
                    "execution_count": str(int(task["attempts"] or 0)), "run_id": last_attempt.get(key, "")}
    return out


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
