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

``check`` finds what cannot be filled in before anything runs: an unknown reference (naming the
valid ones), a job parameter the job does not declare, and the references to other tasks' results
and values (``{{tasks.<task>.…}}``), which this runner does not record yet — a validation error,
never a parameter left unreplaced or silently empty.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streamling.util import did_you_mean

REFERENCE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_START_PARTS = ("iso_date", "iso_datetime", "year", "month", "day", "hour", "minute", "second", "timestamp_ms",
                "is_weekday")
_NAMES = ("job.id", "job.name", "job.run_id", "job.repair_count", "job.trigger.type", "task.name", "task.run_id",
          "task.execution_count", "task.notebook_path", "workspace.id", "workspace.url",
          *(f"job.start_time.{p}" for p in _START_PARTS),
          # deprecated forms Databricks still fills in
          "job_id", "run_id", "parent_run_id", "task_key", "task_retry_count", "start_date", "start_time")
_PARAMETER = re.compile(r"job\.parameters\.(?:\[(?P<quoted>[^\]]+)\]|(?P<plain>[A-Za-z0-9_.\-]+))$")


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


def check(text: str, job_parameters: Iterable[str]) -> list[str]:
    """The problems of the references in ``text`` (empty: every one can be filled in)."""
    declared = list(job_parameters)
    problems = []
    for match in REFERENCE.finditer(text):
        name = match.group(1)
        if name in _NAMES:
            continue
        param = _PARAMETER.match(name)
        if param is not None:
            wanted = param.group("quoted") or param.group("plain")
            if wanted not in declared:
                problems.append(f"'{{{{{name}}}}}' names job parameter '{wanted}', which the job does not declare"
                                f"{did_you_mean(wanted, declared)}")
            continue
        if name.startswith("tasks."):
            problems.append(f"'{{{{{name}}}}}': references to other tasks' results and values are not filled in "
                            "by this runner yet")
            continue
        problems.append(f"unknown reference '{{{{{name}}}}}'{did_you_mean(name, list(_NAMES), cutoff=0.7)}; "
                        f"valid: {', '.join('{{' + n + '}}' for n in _NAMES[:11])}, {{{{job.start_time.<part>}}}}, "
                        "{{job.parameters.<name>}}")
    return problems


def resolve(text: str, context: RunContext, job_parameters: Mapping[str, str]) -> str:
    """``text`` with every reference filled in (``check`` has passed at deploy)."""
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
        return values.get(name, match.group(0))

    return REFERENCE.sub(fill, text)
