"""Databricks' dynamic value references in task parameters: which are known, and what they become."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from streamling.bundle.model import load_bundle
from streamling.bundle.references import RunContext, check, resolve
from streamling.errors import ValidationError

CONTEXT = RunContext(job_key="daily", job_name="[dev alice] daily", run_id=42, task_key="load", attempt_id=77,
                     attempt=2, start_time=dt.datetime(2026, 11, 27, 8, 5, 9, tzinfo=dt.UTC).timestamp(),
                     trigger="schedule", notebook_path="notebooks/load.ipynb", workspace="/srv/orders")


def test_references_are_filled_in_from_the_run() -> None:
    text = ("{{job.id}}/{{job.run_id}}/{{ task.name }}#{{task.execution_count}} {{job.start_time.iso_date}} "
            "{{job.start_time.iso_datetime}} {{job.start_time.is_weekday}} {{job.trigger.type}} "
            "{{job.parameters.region}} {{job.parameters.[day-of-run]}} {{task.run_id}} {{run_id}} "
            "{{task_retry_count}} {{start_date}}")
    assert resolve(text, CONTEXT, {"region": "eu", "day-of-run": "friday"}) == (
        "daily/42/load#2 2026-11-27 2026-11-27T08:05:09Z true schedule eu friday 77 77 1 2026-11-27")
    assert check(text, ["region", "day-of-run"]) == []


def test_a_reference_that_cannot_be_filled_in_is_named_before_anything_runs() -> None:
    assert check("{{job.run}}", []) == [
        "unknown reference '{{job.run}}' (did you mean 'job.run_id'?); valid: {{job.id}}, {{job.name}}, "
        "{{job.run_id}}, {{job.repair_count}}, {{job.trigger.type}}, {{task.name}}, {{task.run_id}}, "
        "{{task.execution_count}}, {{task.notebook_path}}, {{workspace.id}}, {{workspace.url}}, "
        "{{job.start_time.<part>}}, {{job.parameters.<name>}}"]
    assert check("{{job.parameters.regoin}}", ["region"]) == [
        "'{{job.parameters.regoin}}' names job parameter 'regoin', which the job does not declare "
        "(did you mean 'region'?)"]
    assert check("{{tasks.load.values.rows}}", []) == [
        "'{{tasks.load.values.rows}}': references to other tasks' results and values are not filled in by this "
        "runner yet"]
    assert check("no references, {single} braces", []) == []


def test_a_bundle_with_an_unknown_reference_does_not_validate(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text("print('hi')\n")
    (tmp_path / "bundle.yml").write_text("""\
bundle: {name: refs}
resources:
  jobs:
    daily:
      parameters: [{name: region, default: eu}]
      tasks:
        - task_key: load
          spark_python_task:
            python_file: run.py
            parameters: ["{{job.run_id}}", "{{job.parameters.regoin}}", "{{job.strat_time.iso_date}}"]
""")
    with pytest.raises(ValidationError) as info:
        load_bundle(tmp_path, environ={}, user="alice")
    heads = [p.headline().split(" — ")[0] for p in info.value.problems]
    assert heads[0].startswith("job 'daily': '{{job.parameters.regoin}}' names job parameter 'regoin'")
    assert "[bundle.yml: resources.jobs.daily.tasks.0.spark_python_task.parameters.1 (line 10)]" in heads[0]
    assert heads[1].startswith("job 'daily': unknown reference '{{job.strat_time.iso_date}}' (did you mean "
                               "'job.start_time.iso_date'")
    assert len(heads) == 2
