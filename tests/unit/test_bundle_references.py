"""Databricks' dynamic value references in task parameters: which are known, and what they become."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from streamling.bundle.loading import load_bundle
from streamling.bundle.references import RunContext, check, resolve
from streamling.errors import StreamlingError, ValidationError
from streamling.notebook.dbutils import TASK_VALUES_ENV, TASK_VALUES_FILE_ENV, TaskValues

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


def test_an_upstream_tasks_value_is_filled_in_and_a_missing_one_fails_the_task() -> None:
    context = RunContext(**{**CONTEXT.__dict__, "task_values": {"extract": {"rows": 3, "day": "friday",
                                                                             "meta": {"a": [1]}}}})
    assert resolve("{{tasks.extract.values.rows}} {{tasks.extract.values.day}} {{tasks.extract.values.meta}}",
                   context, {}) == '3 friday {"a": [1]}'
    with pytest.raises(StreamlingError, match="task 'extract' set no value 'nope' in this run"):
        resolve("{{tasks.extract.values.nope}}", context, {})


def test_upstream_results_and_the_trigger_time_are_filled_in_as_databricks_words_them() -> None:
    from streamling.bundle.references import task_results

    tasks = [{"task_key": "extract", "state": "succeeded", "attempts": 2},
             {"task_key": "check", "state": "timed_out", "attempts": 1},
             {"task_key": "gate", "state": "succeeded", "attempts": 0},  # a condition: no process
             {"task_key": "skip", "state": "excluded", "attempts": 0},
             {"task_key": "later", "state": "running", "attempts": 1}]
    attempts = [{"id": 5, "task_key": "extract"}, {"id": 6, "task_key": "check"}, {"id": 7, "task_key": "extract"}]
    results = task_results(tasks, attempts)
    assert "later" not in results  # not ended: nothing to say yet
    triggered = dt.datetime(2026, 11, 27, 8, 4, 0, tzinfo=dt.UTC).timestamp()
    context = RunContext(**{**CONTEXT.__dict__, "task_results": results, "trigger_time": triggered})
    text = ("{{tasks.extract.result_state}}/{{tasks.extract.execution_count}}/{{tasks.extract.run_id}}/"
            "[{{tasks.extract.error_code}}] {{tasks.check.result_state}}/{{tasks.check.error_code}} "
            "{{tasks.gate.run_id}}|{{tasks.skip.result_state}} {{job.trigger.time.iso_datetime}} "
            "{{job.start_time.iso_datetime}}")
    assert resolve(text, context, {}) == ("success/2/7/[] timedout/RunExecutionError |excluded "
                                          "2026-11-27T08:04:00Z 2026-11-27T08:05:09Z")


def test_task_values_in_a_job_and_outside_one(tmp_path: Path) -> None:
    out = tmp_path / "load.log.values.json"
    job = TaskValues({TASK_VALUES_ENV: '{"extract": {"rows": 3}}', TASK_VALUES_FILE_ENV: str(out)})
    job.set("loaded", {"rows": 3, "tables": ["a"]})
    job.set("note", "done")
    assert json.loads(out.read_text()) == {"loaded": {"rows": 3, "tables": ["a"]}, "note": "done"}
    assert job.get("extract", "rows") == 3 and job.get("extract", "nope", default=0) == 0
    with pytest.raises(ValueError, match="task 'extract' set no task value 'nope'"):
        job.get("extract", "nope")
    with pytest.raises(TypeError, match="JSON-serializable"):
        job.set("bad", object())
    with pytest.raises(ValueError, match="the limit is 48 KiB"):
        job.set("big", "x" * 50_000)
    outside = TaskValues({})
    outside.set("ignored", 1)  # no job: nothing to hand it to, as on Databricks
    assert outside.get("extract", "rows", debugValue=7) == 7
    with pytest.raises(TypeError, match="outside a job: give debugValue="):
        outside.get("extract", "rows", default=1)


def test_a_reference_that_cannot_be_filled_in_is_named_before_anything_runs() -> None:
    assert check("{{job.run}}", []) == [
        "unknown reference '{{job.run}}' (did you mean 'job.run_id'?); valid: {{job.id}}, {{job.name}}, "
        "{{job.run_id}}, {{job.repair_count}}, {{job.trigger.type}}, {{task.name}}, {{task.run_id}}, "
        "{{task.execution_count}}, {{task.notebook_path}}, {{workspace.id}}, {{workspace.url}}, "
        "{{job.start_time.<part>}}, {{job.trigger.time.<part>}}, {{job.parameters.<name>}}, "
        "{{tasks.<task>.values.<key>}}, {{tasks.<task>.result_state}}"]
    assert check("{{job.parameters.regoin}}", ["region"]) == [
        "'{{job.parameters.regoin}}' names job parameter 'regoin', which the job does not declare "
        "(did you mean 'region'?)"]
    assert check("{{tasks.load.values.rows}}", [], upstream=["extract", "load"]) == []
    assert check("{{tasks.laod.values.rows}}", [], upstream=["load"]) == [
        "'{{tasks.laod.values.rows}}' reads a value of task 'laod', which this task does not depend on "
        "(did you mean 'load'?)"]
    assert check("{{tasks.load.run_id}} {{tasks.load.result_state}}", [], upstream=["load"]) == []
    assert check("{{tasks.extract.error_code}}", [], upstream=["load"]) == [
        "'{{tasks.extract.error_code}}' reads the result of task 'extract', which this task does not depend on"]
    assert check("{{tasks.load.state}}", [], upstream=["load"]) == [
        "'{{tasks.load.state}}': of another task, {{tasks.<task>.values.<key>}}, .result_state, .error_code, "
        ".execution_count and .run_id are filled in"]
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


def test_condition_outcomes_as_databricks_compares() -> None:
    from streamling.bundle.references import compare

    assert compare("EQUAL_TO", "eu", "eu") and compare("NOT_EQUAL", "1", "1.0")  # texts
    assert compare("GREATER_THAN", "10", "9") and compare("LESS_THAN_OR_EQUAL", "2.5", "2.50")  # numbers
    with pytest.raises(ValueError, match="GREATER_THAN compares numbers, and 'many' is not one"):
        compare("GREATER_THAN", "many", "3")


@pytest.mark.parametrize(("run_if", "deps", "expected"), [
    ("ALL_SUCCESS", ["succeeded", "succeeded"], "run"),
    ("ALL_SUCCESS", ["succeeded", "failed"], "upstream_failed"),
    ("ALL_SUCCESS", ["succeeded", "excluded"], "excluded"),
    ("ALL_SUCCESS", ["succeeded", "running"], "wait"),
    ("AT_LEAST_ONE_SUCCESS", ["excluded", "succeeded"], "run"),
    ("AT_LEAST_ONE_SUCCESS", ["excluded", "failed"], "upstream_failed"),
    ("NONE_FAILED", ["excluded", "succeeded"], "run"),
    ("NONE_FAILED", ["succeeded", "timed_out"], "upstream_failed"),
    ("ALL_DONE", ["failed", "excluded"], "run"),
    ("AT_LEAST_ONE_FAILED", ["succeeded", "failed"], "run"),
    ("AT_LEAST_ONE_FAILED", ["succeeded", "succeeded"], "excluded"),
    ("ALL_FAILED", ["failed", "upstream_failed"], "run"),
    ("ALL_FAILED", ["failed", "succeeded"], "excluded"),
])
def test_run_if_decides_from_how_the_dependencies_ended(run_if: str, deps: list[str], expected: str) -> None:
    from streamling.bundle.runner import _readiness

    tasks = {f"d{i}": {"state": state, "message": "finished"} for i, state in enumerate(deps)}
    assert _readiness({"depends_on": list(tasks), "run_if": run_if}, tasks) == expected


def test_a_dependency_on_a_conditions_outcome_holds_only_when_it_came_out_that_way() -> None:
    from streamling.bundle.runner import _readiness

    tasks = {"check": {"state": "succeeded", "message": "false"}}
    assert _readiness({"depends_on": ["check"], "outcomes": {"check": "false"}}, tasks) == "run"
    assert _readiness({"depends_on": ["check"], "outcomes": {"check": "true"}}, tasks) == "excluded"


def test_condition_tasks_and_run_if_are_checked_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text("print('hi')\n")
    (tmp_path / "bundle.yml").write_text("""\
bundle: {name: conditions}
resources:
  jobs:
    daily:
      tasks:
        - task_key: load
          spark_python_task: {python_file: run.py}
        - task_key: check
          depends_on: [{task_key: load}]
          condition_task: {op: GREATER, left: "1"}
        - task_key: after
          depends_on: [{task_key: load, outcome: "true"}, {task_key: check, outcome: "maybe"}]
          run_if: ALL_DONES
          spark_python_task: {python_file: run.py}
""")
    with pytest.raises(ValidationError) as info:
        load_bundle(tmp_path, environ={}, user="alice")
    heads = [p.headline().split(" [")[0] for p in info.value.problems]
    assert heads == [
        "task 'check': op is 'GREATER' (did you mean 'GREATER_THAN'?)",
        "task 'check': a condition task needs 'right'",
        "task 'after': outcome is 'maybe'; a condition task's outcome is \"true\" or \"false\"",
        "job 'daily': depends on the outcome of 'load', which is not a condition task",
        "task 'after': run_if is 'ALL_DONES' (did you mean 'ALL_DONE', 'ALL_SUCCESS'?)",
    ]
