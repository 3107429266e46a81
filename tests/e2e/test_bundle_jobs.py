"""The job runner as a user meets it through ``streamling bundle``: real processes, a real store.

Tasks here are small Python files (``spark_python_task``), so retries, timeouts, schedules,
dependencies, concurrency limits, cancellation and notifications are checked in seconds without
a JVM; the Spark-backed jobs are in tests/integration/bundle.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jobs
import pytest
from jobs import wait_for

pytestmark = pytest.mark.slow
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLING__", "BUNDLE_VAR_"))}


def bundle(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return jobs.bundle(root, ENV, *args)


def runs(root: Path, job: str | None = None) -> list[dict[str, Any]]:
    return jobs.runs(root, ENV, *([job] if job else []))


class _Hooks(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def hooks() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _Hooks.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook", _Hooks.received
    server.shutdown()


@pytest.fixture
def project(tmp_path: Path, hooks: tuple[str, list[dict[str, Any]]]) -> Iterator[Path]:
    root = tmp_path / "project"
    (root / "jobs").mkdir(parents=True)
    (root / "jobs" / "flaky.py").write_text(textwrap.dedent("""
        import sys, pathlib
        marker = pathlib.Path(sys.argv[1])
        if not marker.exists():
            marker.write_text("failed once")
            sys.exit("first attempt fails on purpose")
        print("second attempt succeeds")
    """))
    (root / "jobs" / "record.py").write_text(textwrap.dedent("""
        import json, os, sys, time
        from streamling.notebook.dbutils import dbutils
        t = time.time()
        with open(sys.argv[1], "a") as out:
            out.write(json.dumps({"t": t, "params": json.loads(os.environ["STREAMLING_JOB_PARAMETERS"]),
                                  "args": sys.argv[2:],
                                  "upstream": dbutils.jobs.taskValues.get("first", "t", default=None)}) + "\\n")
        dbutils.jobs.taskValues.set("t", t)
        time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].replace(".", "", 1).isdigit() else 0)
    """))
    (root / "jobs" / "count.py").write_text(textwrap.dedent("""
        import sys
        from databricks.sdk.runtime import dbutils  # as written for Databricks
        dbutils.jobs.taskValues.set("rows", int(sys.argv[1]))
    """))
    (root / "jobs" / "items.py").write_text(textwrap.dedent("""
        from streamling.notebook.dbutils import dbutils
        dbutils.jobs.taskValues.set("items", ["a", "b", {"c": 3}])
    """))
    (root / "jobs" / "item.py").write_text(textwrap.dedent("""
        import sys
        if sys.argv[1] == "boom":
            sys.exit("this item fails")
    """))
    (root / "jobs" / "secretive.py").write_text(textwrap.dedent("""
        import hashlib, logging, sys
        from streamling.notebook.dbutils import dbutils
        token = dbutils.secrets.get("app", "token")
        print("token is", token, flush=True)
        logging.getLogger("secretive").warning("connecting with %s", token)
        assert dbutils.secrets.getBytes("app", "blob") == bytes([0, 1, 2])
        print([m.key for m in dbutils.secrets.list("app")], [s.name for s in dbutils.secrets.listScopes()])
        digest = hashlib.sha256(token.encode()).hexdigest()[:12]
        open(sys.argv[1], "w").write("ok" if digest == "1f3fa74b1208" else "wrong")
    """))
    out = tmp_path / "out"
    out.mkdir()
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: runner_checks}}
        workspace: {{root_path: {tmp_path / 'root'}}}
        resources:
          jobs:
            flaky:
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/flaky.py, parameters: ["{out / 'marker'}"]}}
                  max_retries: 1
                  min_retry_interval_millis: 300
              webhook_notifications:
                on_start: [{{url: "{hooks[0].replace('//', '//ops:hook-secret@')}?token=hook-token"}}]
                on_success: [{{url: "{hooks[0]}"}}]
              email_notifications: {{on_success: [ops@example.com]}}
            chain:
              parameters: [{{name: who, default: job-default}}]
              tasks:
                - task_key: second
                  depends_on: [{{task_key: first}}]
                  spark_python_task:
                    python_file: ./jobs/record.py
                    parameters: ["{out / 'chain.jsonl'}", "run={{{{job.run_id}}}}", "who={{{{job.parameters.who}}}}",
                                 "task={{{{task.name}}}}#{{{{task.execution_count}}}}",
                                 "day={{{{job.start_time.iso_date}}}}", "first={{{{tasks.first.values.t}}}}",
                                 "ended={{{{tasks.first.result_state}}}}#{{{{tasks.first.execution_count}}}}"]
                - task_key: first
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'chain.jsonl'}"]}}
            branch:
              parameters: [{{name: rows, default: "5"}}, {{name: threshold, default: "3"}}]
              tasks:
                - task_key: count
                  spark_python_task: {{python_file: ./jobs/count.py, parameters: ["{{{{job.parameters.rows}}}}"]}}
                - task_key: many
                  depends_on: [{{task_key: count}}]
                  condition_task: {{op: GREATER_THAN, left: "{{{{tasks.count.values.rows}}}}",
                                    right: "{{{{job.parameters.threshold}}}}"}}
                - task_key: on_many
                  depends_on: [{{task_key: many, outcome: "true"}}]
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'branch.jsonl'}", "many"]}}
                - task_key: on_few
                  depends_on: [{{task_key: many, outcome: "false"}}]
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'branch.jsonl'}", "few"]}}
                - task_key: cleanup
                  depends_on: [{{task_key: on_many}}, {{task_key: on_few}}]
                  run_if: ALL_DONE
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'branch.jsonl'}", "end"]}}
            slow:
              max_concurrent_runs: 1
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'slow.jsonl'}", "2"]}}
            stuck:
              tasks:
                - task_key: main
                  timeout_seconds: 1
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'stuck.jsonl'}", "60"]}}
            caller:
              parameters: [{{name: name, default: caller-default}}]
              tasks:
                - task_key: call
                  run_job_task: {{job_id: "${{resources.jobs.chain.id}}",
                                  job_parameters: {{who: "{{{{job.parameters.name}}}}"}}}}
                - task_key: after
                  depends_on: [{{task_key: call}}]
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'caller.jsonl'}"]}}
            broken_caller:
              tasks:
                - task_key: call
                  run_job_task: {{job_id: "${{resources.jobs.branch.id}}", job_parameters: {{threshold: lots}}}}
            waiter:
              tasks:
                - task_key: call
                  run_job_task: {{job_id: "${{resources.jobs.sleeper.id}}"}}
            sleeper:
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'sleeper.jsonl'}", "60"]}}
            fan:
              parameters: [{{name: prefix, default: p}}]
              tasks:
                - task_key: list
                  spark_python_task: {{python_file: ./jobs/items.py}}
                - task_key: each
                  depends_on: [{{task_key: list}}]
                  for_each_task:
                    inputs: "{{{{tasks.list.values.items}}}}"
                    concurrency: 2
                    task:
                      task_key: one
                      spark_python_task:
                        python_file: ./jobs/record.py
                        parameters: ["{out / 'fan.jsonl'}", "item={{{{input}}}}", "p={{{{job.parameters.prefix}}}}",
                                     "run={{{{job.run_id}}}}"]
                - task_key: after
                  depends_on: [{{task_key: each}}]
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'fan_after.jsonl'}"]}}
            fan_fail:
              tasks:
                - task_key: each
                  for_each_task:
                    inputs: '["ok", "boom", "fine"]'
                    task:
                      task_key: one
                      spark_python_task: {{python_file: ./jobs/item.py, parameters: ["{{{{input}}}}"]}}
            secretive:
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/secretive.py, parameters: ["{out / 'secret.txt'}"]}}
            ticking:
              schedule: {{quartz_cron_expression: "0/2 * * * * ?", timezone_id: Europe/Paris, pause_status: PAUSED}}
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/record.py, parameters: ["{out / 'ticks.jsonl'}"]}}
          secret_scopes:
            app: {{name: app}}
        targets:
          prod: {{default: true, mode: production}}
    """))
    yield root
    bundle(root, "destroy", "--auto-approve")


def test_retries_dependencies_parameters_concurrency_timeouts_and_notifications(
        project: Path, hooks: tuple[str, list[dict[str, Any]]]) -> None:
    out = project.parent / "out"
    deployed = bundle(project, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    assert "Deployed version 1" in deployed.stdout

    # A failed attempt is retried after min_retry_interval_millis; the run succeeds on attempt 2.
    flaky = bundle(project, "run", "flaky")
    assert flaky.returncode == 0, flaky.stdout + flaky.stderr
    [run] = runs(project, "flaky")
    assert run["state"] == "succeeded"
    assert [a["state"] for a in run["attempts"]] == ["failed", "succeeded"]
    assert run["attempts"][1]["started_at"] - run["attempts"][0]["ended_at"] >= 0.3
    logs = bundle(project, "logs", str(run["run_id"]))
    assert "first attempt fails on purpose" in logs.stdout and "second attempt succeeds" in logs.stdout
    events = wait_for(lambda: [h["event"] for h in hooks[1]] if len(hooks[1]) >= 2 else None, 10, "webhooks")
    assert events == ["on_start", "on_success"]
    assert hooks[1][1]["run"]["id"] == run["run_id"] and hooks[1][1]["run"]["state"] == "succeeded"

    # Tasks run in depends_on order; run-time parameter values beat the job's defaults.
    chain = bundle(project, "run", "chain", "--param", "who=run-time")
    assert chain.returncode == 0, chain.stderr
    lines = [json.loads(line) for line in (out / "chain.jsonl").read_text().splitlines()]
    assert [line["params"] for line in lines] == [{"who": "run-time"}, {"who": "run-time"}]
    assert lines[0]["t"] < lines[1]["t"]
    # Databricks' dynamic value references in a task's parameters, filled in when it starts
    [chain_run] = runs(project, "chain")
    day = datetime.datetime.fromtimestamp(chain_run["started_at"], datetime.UTC).date().isoformat()
    assert lines[1]["args"] == [f"run={chain_run['run_id']}", "who=run-time", "task=second#1", f"day={day}",
                                f"first={json.dumps(lines[0]['t'])}", "ended=success#1"]
    # the value the first task set reaches the second through dbutils.jobs.taskValues too
    assert lines[0]["upstream"] is None and lines[1]["upstream"] == lines[0]["t"]

    # A condition task on a task value picks the branch; the other is excluded; ALL_DONE cleans up.
    for rows in ("5", "1"):
        branch = bundle(project, "run", "branch", "--param", f"rows={rows}")
        assert branch.returncode == 0, branch.stdout + branch.stderr
    steps = [json.loads(line)["args"][0] for line in (out / "branch.jsonl").read_text().splitlines()]
    assert steps == ["many", "end", "few", "end"]
    by_rows = {r["params"]["rows"]: r for r in runs(project, "branch")}
    many, few = by_rows["5"], by_rows["1"]
    assert {t["task_key"]: (t["state"], t["message"]) for t in many["tasks"]} == {
        "count": ("succeeded", "finished"), "many": ("succeeded", "true"), "on_many": ("succeeded", "finished"),
        "on_few": ("excluded", "excluded: its dependencies do not meet run_if ALL_SUCCESS"),
        "cleanup": ("succeeded", "finished")}
    assert many["state"] == few["state"] == "succeeded"
    assert [t["state"] for t in few["tasks"] if t["task_key"] in ("many", "on_many", "on_few")] == [
        "succeeded", "excluded", "succeeded"]
    # A condition that cannot be evaluated fails the run, saying why; both branches are skipped as
    # failed upstream, and the ALL_DONE cleanup still runs.
    bad = bundle(project, "run", "branch", "--param", "threshold=lots")
    assert bad.returncode != 0
    [failed] = [r for r in runs(project, "branch") if r["params"].get("threshold") == "lots"]
    assert failed["state"] == "failed" and "GREATER_THAN compares numbers, and 'lots' is not one" in failed["message"]
    assert {t["task_key"]: t["state"] for t in failed["tasks"]} == {
        "count": "succeeded", "many": "failed", "on_many": "upstream_failed", "on_few": "upstream_failed",
        "cleanup": "succeeded"}
    assert [json.loads(line)["args"][0] for line in (out / "branch.jsonl").read_text().splitlines()][4:] == ["end"]

    # max_concurrent_runs: 1 — the second run waits until the first ended.
    first = bundle(project, "run", "slow", "--no-wait")
    second = bundle(project, "run", "slow", "--no-wait")
    assert first.returncode == 0 and second.returncode == 0
    slow = wait_for(lambda: (r := runs(project, "slow")) and all(x["state"] == "succeeded" for x in r) and r,
                    60, "both slow runs")
    assert len(slow) == 2 and slow[1]["started_at"] >= slow[0]["ended_at"]

    # timeout_seconds stops the attempt; without retry_on_timeout the run fails.
    stuck = bundle(project, "run", "stuck")
    assert stuck.returncode == 1
    [run] = runs(project, "stuck")
    assert run["state"] == "failed" and run["attempts"][0]["state"] == "timed_out"
    assert run["ended_at"] - run["started_at"] < 30

    # A paused schedule never fires; unpaused (redeploy) it fires within its 2 s period.
    assert not runs(project, "ticking")
    text = (project / "bundle.yml").read_text().replace("pause_status: PAUSED", "pause_status: UNPAUSED")
    (project / "bundle.yml").write_text(text)
    redeployed = bundle(project, "deploy")
    assert redeployed.returncode == 0, redeployed.stderr
    assert "Deployed version 2" in redeployed.stdout
    ticks = wait_for(lambda: [r for r in runs(project, "ticking") if r["state"] == "succeeded"], 20, "a scheduled run")
    assert ticks[0]["trigger"] == "schedule"

    # The e-mail notification is recorded in the store (no mail server here).
    import sqlite3

    with sqlite3.connect(project.parent / "root" / "runs.db") as conn:
        emails = conn.execute("SELECT target, event FROM notifications WHERE channel='email'").fetchall()
        webhooks = conn.execute("SELECT target, event, status FROM notifications WHERE channel='webhook' "
                                "ORDER BY id").fetchall()
    assert emails == [("ops@example.com", "on_success")]
    # The webhook's credentials reached the endpoint, never the run store or a log.
    assert webhooks[:2] == [(hooks[0] + "?…", "on_start", "sent"), (hooks[0], "on_success", "sent")]
    stored = b"".join(f.read_bytes() for f in (project.parent / "root").rglob("*")
                      if f.is_file() and (f.name.startswith("runs.db") or f.suffix in (".log", ".exit")))
    assert b"hook-secret" not in stored and b"hook-token" not in stored


def test_run_job_tasks_run_another_job_with_parameters_and_follow_it(project: Path) -> None:
    out = project.parent / "out"
    assert bundle(project, "deploy").returncode == 0
    called = bundle(project, "run", "caller", "--param", "name=ada")
    assert called.returncode == 0, called.stderr
    [caller] = runs(project, "caller")
    [chain] = runs(project, "chain")  # the run the task started, with the caller's parameter
    assert chain["trigger"] == "run_job" and chain["state"] == "succeeded"
    assert {t["task_key"]: t["message"] for t in caller["tasks"]}["call"] == \
        f"run {chain['run_id']} of job 'chain' succeeded"
    records = [json.loads(line) for line in (out / "chain.jsonl").read_text().splitlines()]
    assert {r["params"]["who"] for r in records} == {"ada"} and "who=ada" in records[-1]["args"]
    assert (out / "caller.jsonl").exists()  # the task after it ran once it had succeeded

    broken = bundle(project, "run", "broken_caller")
    assert broken.returncode == 1
    [failed] = runs(project, "broken_caller")
    message = {t["task_key"]: t["message"] for t in failed["tasks"]}["call"]
    assert message.startswith("run ") and "of job 'branch' failed" in message and "'lots' is not one" in message

    assert bundle(project, "run", "waiter", "--no-wait").returncode == 0
    sleeping = wait_for(lambda: next((r for r in runs(project, "sleeper") if r["state"] == "running"), None), 60,
                        "the called job to run")
    [waiter] = runs(project, "waiter")
    assert bundle(project, "cancel", str(waiter["run_id"])).returncode == 0
    wait_for(lambda: runs(project, "sleeper")[-1]["state"] == "cancelled", 60, "the called run to be cancelled")
    assert runs(project, "sleeper")[-1]["run_id"] == sleeping["run_id"]
    assert wait_for(lambda: runs(project, "waiter")[-1]["state"] != "running" and runs(project, "waiter")[-1], 60,
                    "the calling run to end")["state"] == "cancelled"


def test_for_each_tasks_run_their_task_once_per_input(project: Path) -> None:
    out = project.parent / "out"
    assert bundle(project, "deploy").returncode == 0
    fanned = bundle(project, "run", "fan", "--param", "prefix=x")
    assert fanned.returncode == 0, fanned.stderr
    [run] = runs(project, "fan")
    assert {t["task_key"]: t["message"] for t in run["tasks"]}["each"] == "3 iterations succeeded"
    records = [json.loads(line) for line in (out / "fan.jsonl").read_text().splitlines()]
    # each iteration got its input (JSON for a non-string), the job's parameter and the outer run's id
    assert sorted(r["args"][0] for r in records) == ["item=a", "item=b", 'item={"c": 3}']
    assert {tuple(r["args"][1:]) for r in records} == {("p=x", f"run={run['run_id']}")}
    iterations = runs(project, "fan[each]")
    assert len(iterations) == 3 and {i["trigger"] for i in iterations} == {"for_each"}
    assert (out / "fan_after.jsonl").exists()
    # `bundle runs` nests the iterations under their task, in input order, as Databricks does.
    each = {t["task_key"]: t for t in run["tasks"]}["each"]
    assert [(i["index"], i["input"], i["state"]) for i in each["iterations"]] == [
        (0, "a", "succeeded"), (1, "b", "succeeded"), (2, '{"c": 3}', "succeeded")]
    assert {i["run_id"] for i in each["iterations"]} == {i["run_id"] for i in iterations}
    listed = bundle(project, "runs")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert not any(" fan[each] " in line for line in lines), listed.stdout  # not at the top level
    at = next(i for i, line in enumerate(lines) if re.match(rf"\s*{run['run_id']}\s+fan\s", line))
    assert [re.sub(r"\s+", " ", line.strip()) for line in lines[at + 1:at + 4]] == [
        f"{it['run_id']} └ each[{it['index']}] succeeded input {it['input']}" for it in each["iterations"]]

    failed = bundle(project, "run", "fan_fail")
    assert failed.returncode == 1
    [bad] = runs(project, "fan_fail")
    message = bad["tasks"][0]["message"]
    assert message.startswith("1 of 3 iterations did not succeed; run ") and \
        message.endswith("failed: one: the driver exited with code 1: this item fails"), message
    assert sorted(i["state"] for i in runs(project, "fan_fail[each]")) == ["failed", "succeeded", "succeeded"]


def test_secrets_are_read_by_tasks_and_never_shown(project: Path) -> None:
    out = project.parent / "out"
    root = project.parent / "root"
    assert bundle(project, "deploy").returncode == 0
    assert bundle(project, "secrets", "list-scopes").stdout.split() == ["app"]  # created by the deploy
    put = jobs.bundle(project, ENV, "secrets", "put-secret", "app", "token", stdin="s3cr3t-value\n")
    assert put.returncode == 0, put.stderr
    assert bundle(project, "secrets", "put-secret", "app", "blob", "--bytes-value", "AAEC").returncode == 0
    assert bundle(project, "secrets", "list-secrets", "app").stdout.split() == ["blob", "token"]
    assert oct((root / "secrets").stat().st_mode & 0o777) == "0o700"
    assert oct((root / "secrets" / "app.json").stat().st_mode & 0o777) == "0o600"
    ran = bundle(project, "run", "secretive")
    assert ran.returncode == 0, ran.stderr
    assert (out / "secret.txt").read_text() == "ok"
    [run] = runs(project, "secretive")
    log = bundle(project, "logs", str(run["run_id"])).stdout
    assert "token is [REDACTED]" in log and "connecting with [REDACTED]" in log and "['blob', 'token'] ['app']" in log
    leaks = [p for p in root.rglob("*") if p.is_file() and "secrets" not in p.parts
             and b"s3cr3t-value" in p.read_bytes()]
    assert leaks == []  # not in the run store, the logs or the deployment
    missing = bundle(project, "secrets", "delete-secret", "app", "nope")
    assert missing.returncode == 1 and "secret scope 'app' has no key 'nope'" in missing.stderr


def test_a_deploy_that_changes_nothing_is_a_no_op(project: Path) -> None:
    assert bundle(project, "deploy").returncode == 0
    again = bundle(project, "deploy")
    assert again.returncode == 0, again.stderr
    assert "Deployment 1 is up to date" in again.stdout
    summary = json.loads(bundle(project, "summary", "-o", "json").stdout)
    assert summary["deployment"]["version"] == 1
    assert summary["jobs"]["flaky"]["working_copy"] == "up to date"
    # A file no task names (a helper module, a data file) changed: a new version, no task changed.
    (project / "jobs" / "helper.py").write_text("VALUE = 2\n")
    helper = bundle(project, "deploy")
    assert helper.returncode == 0 and "Deployed version 2" in helper.stdout, helper.stdout + helper.stderr
    assert (project.parent / "root" / "files" / "jobs" / "helper.py").read_text() == "VALUE = 2\n"
    assert "Deployment 2 is up to date" in bundle(project, "deploy").stdout
    (project / "jobs" / "flaky.py").write_text("print('changed')\n")
    # A Python file is not compiled: the task record is what decides; the files are synced on deploy.
    (project / "bundle.yml").write_text((project / "bundle.yml").read_text().replace("max_retries: 1",
                                                                                      "max_retries: 2"))
    summary = json.loads(bundle(project, "summary", "-o", "json").stdout)
    assert summary["jobs"]["flaky"]["working_copy"] == "differs (main)"


@pytest.mark.spark
def test_a_notebook_whose_pipeline_fails_fails_its_run_with_the_node_and_message(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "broken.py").write_text(textwrap.dedent("""\
        # Databricks notebook source
        # MAGIC %load_ext streamling

        # COMMAND ----------

        # MAGIC %%streamling source orders
        # MAGIC type: generate
        # MAGIC rows: 10

        # COMMAND ----------

        # MAGIC %%streamling transform totals --from orders
        # MAGIC SELECT id, amount * quantiy AS total FROM orders

        # COMMAND ----------

        # MAGIC %%streamling sink out --from totals
        # MAGIC type: blackhole
    """))
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: failing}}
        workspace: {{root_path: {tmp_path / 'root'}}}
        resources:
          jobs:
            broken:
              tasks: [{{task_key: main, notebook_task: {{notebook_path: ./broken.py}}}}]
        targets: {{prod: {{default: true, mode: production}}}}
    """))
    try:
        assert bundle(root, "deploy").returncode == 0  # a column is only known to Spark: the run finds it
        run = bundle(root, "run", "broken")
        assert run.returncode == 1
        assert "Error: run 1 failed: main: " in run.stderr and "quantiy" in run.stderr, run.stderr
        [failed] = runs(root, "broken")
        assert failed["state"] == "failed" and failed["attempts"][0]["exit_code"] == 1
        assert "Traceback" not in bundle(root, "logs", "1").stdout
    finally:
        bundle(root, "destroy", "--auto-approve")


def test_a_wheel_built_from_artifacts_runs_with_its_pypi_dependency(tmp_path: Path) -> None:
    root = tmp_path / "project"
    package = root / "greeter"
    package.mkdir(parents=True)
    (package / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "greeter"
        version = "0.1.0"

        [project.scripts]
        greet = "greeter:main"
    """))
    (package / "greeter.py").write_text(textwrap.dedent("""
        import argparse, json, sys
        import humanize  # from the job environment's dependencies, not streamling's own environment
        from databricks.sdk.runtime import dbutils

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--out")
            parser.add_argument("--n", type=int)
            args = parser.parse_args()
            with open(args.out, "w") as out:
                json.dump({"n": humanize.intcomma(args.n), "argv0": sys.argv[0]}, out)
            dbutils.jobs.taskValues.set("done", True)
    """))
    out = tmp_path / "out.json"
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: wheels}}
        workspace: {{root_path: {tmp_path / 'root'}}}
        artifacts:
          greeter: {{type: whl, path: ./greeter}}
        resources:
          jobs:
            wheel:
              environments:
                - environment_key: default
                  spec: {{client: "1", dependencies: ["humanize==4.9.0"]}}
              tasks:
                - task_key: main
                  environment_key: default
                  libraries: [{{whl: ./greeter/dist/*.whl}}]
                  python_wheel_task:
                    package_name: greeter
                    entry_point: greet
                    named_parameters: {{out: "{out}", n: "1234567"}}
        targets: {{prod: {{default: true, mode: production}}}}
    """))
    try:
        deployed = jobs.bundle(root, ENV, "deploy", timeout=600)
        assert deployed.returncode == 0, deployed.stderr
        assert list((package / "dist").glob("greeter-0.1.0-*.whl"))  # deploy built the artifact
        ran = bundle(root, "run", "wheel")
        assert ran.returncode == 0, ran.stderr + bundle(root, "logs", "1").stdout
        assert json.loads(out.read_text()) == {"n": "1,234,567", "argv0": "greeter"}
        # the task's environment is its own: streamling's environment did not gain the dependency
        missing = subprocess.run([sys.executable, "-c", "import humanize"], capture_output=True, text=True)
        assert missing.returncode != 0
        again = bundle(root, "deploy")  # same content: the environment is reused, the deploy is a no-op
        assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout
    finally:
        bundle(root, "destroy", "--auto-approve")


def test_jobs_defined_in_python_load_as_the_databricks_cli_loads_them(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    out = tmp_path / "python_jobs.jsonl"
    (root / "record.py").write_text("import json, sys\n"
                                    "open(sys.argv[1], 'a').write(json.dumps(sys.argv[2:]) + '\\n')\n")
    (root / "resources.py").write_text(textwrap.dedent(f"""
        from dataclasses import replace

        from databricks.bundles.core import Bundle, Resources, job_mutator
        from databricks.bundles.jobs import Job


        def load_resources(bundle: Bundle) -> Resources:
            resources = Resources()
            for region in bundle.variables["regions"].split(","):
                resources.add_resource(f"load_{{region}}", Job.from_dict({{
                    "name": f"load {{region}}",
                    "tasks": [{{"task_key": "main", "spark_python_task": {{
                        "python_file": "./record.py", "parameters": ["{out}", region]}}}}]}}))
            return resources


        @job_mutator
        def tag_owner(bundle: Bundle, job: Job) -> Job:
            return replace(job, tags={{**(job.tags or {{}}), "owner": "data"}})
    """))
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: pythonic}}
        workspace: {{root_path: {tmp_path / 'root'}}}
        python:
          resources: ["resources:load_resources"]
          mutators: ["resources:tag_owner"]
        variables: {{regions: {{default: "eu,us"}}}}
        resources:
          jobs:
            yaml_job:
              tasks: [{{task_key: main, spark_python_task: {{python_file: ./record.py, parameters: ["{out}", yaml]}}}}]
        targets: {{prod: {{default: true, mode: production}}}}
    """))
    try:
        validated = bundle(root, "validate", "-o", "json")
        assert validated.returncode == 0, validated.stderr
        jobs_json = json.loads(validated.stdout)["jobs"]
        assert sorted(jobs_json) == ["load_eu", "load_us", "yaml_job"]
        assert {k: j["tags"] for k, j in jobs_json.items()} == {k: {"owner": "data"} for k in jobs_json}
        assert bundle(root, "deploy").returncode == 0
        assert bundle(root, "run", "load_us").returncode == 0
        assert json.loads(out.read_text()) == ["us"]
        broken = root / "resources.py"
        broken.write_text(broken.read_text().replace('bundle.variables["regions"]', 'bundle.variables["nope"]'))
        failed = bundle(root, "validate")
        assert failed.returncode == 1 and "Failed to load resources" in failed.stderr, failed.stderr
    finally:
        bundle(root, "destroy", "--auto-approve")
