"""A job's tasks: what each payload runs, the files it names, its cluster's settings and its libraries.

Each payload (``notebook_task``, ``spark_python_task``, ``python_wheel_task``, ``condition_task``, ``sql_task``,
``run_job_task``, ``for_each_task``, ``pipeline_task``) is checked as Databricks defines it, and what OSS Spark
cannot run fails with what to write instead. A for-each task's nested task becomes a hidden job, run once per
input. What a task's cluster and environment say is kept as Spark settings and pip requirements.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, cast

from streamling.bundle.model import PAYLOADS, UNSUPPORTED_PAYLOADS, ForEach, Job, Task
from streamling.bundle.tree import Context, as_dict, as_list, relative, yaml_text
from streamling.bundle.values import ValueReader
from streamling.util import did_you_mean

NOTEBOOK_HEADER = "# Databricks notebook source"
SQL_NOTEBOOK_HEADER = "-- Databricks notebook source"
#: Databricks' condition_task operators
CONDITION_OPS = ("EQUAL_TO", "NOT_EQUAL", "GREATER_THAN", "GREATER_THAN_OR_EQUAL", "LESS_THAN", "LESS_THAN_OR_EQUAL")
#: Databricks' run_if values: when a task runs, given how its dependencies ended
RUN_IF = ("ALL_SUCCESS", "AT_LEAST_ONE_SUCCESS", "NONE_FAILED", "ALL_DONE", "AT_LEAST_ONE_FAILED", "ALL_FAILED")


class TaskBuilder(ValueReader):
    """Builds the tasks of the job being built (``environments`` and ``job_clusters`` are that job's)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        #: the job being built: its environments' dependencies by environment_key, its job clusters by key
        self.environments: dict[str, list[str]] = {}
        self.job_clusters: dict[str, dict[str, Any]] = {}
        #: ``resources.clusters`` (what ``existing_cluster_id: ${resources.clusters.<key>.id}`` names)
        self.clusters: dict[str, dict[str, Any]] = {}
        #: jobs that run one iteration of a for-each task, added next to the bundle's own
        self.iteration_jobs: dict[str, Job] = {}

    def task(self, job: str, path: str, body: Any) -> Task | None:
        if not isinstance(body, dict):
            return None
        key = self.str_(body, "task_key", path)
        if key is None:
            self.add(f"{path}.task_key", "a task has no task_key", hint="give every task a task_key, unique in its job")
            return None
        self.node = (key, "task")
        for payload in UNSUPPORTED_PAYLOADS:
            if payload in body:
                self.add(f"{path}.{payload}", f"{payload} is not supported", code="bundle_unsupported",
                         hint="use notebook_task, spark_python_task, python_wheel_task, sql_task or run_job_task")
        given = [p for p in body if p in PAYLOADS or p in UNSUPPORTED_PAYLOADS]
        if len(given) > 1:
            self.add(f"{path}.{given[1]}", f"has {len(given)} payloads ({', '.join(given)}); a task runs exactly one",
                     hint="split it into tasks ordered with depends_on")
        elif not given:
            self.add(path, "has nothing to run",
                     hint="give it a notebook_task, spark_python_task, python_wheel_task, sql_task, run_job_task "
                          "or condition_task")
        depends = [dep for i, item in enumerate(as_list(body.get("depends_on")))
                   if (dep := self.str_(as_dict(item), "task_key", f"{path}.depends_on.{i}", required=True))]
        outcomes: dict[str, str] = {}
        for i, item in enumerate(as_list(body.get("depends_on"))):
            outcome = as_dict(item).get("outcome")
            if outcome is None or not isinstance(as_dict(item).get("task_key"), str):
                continue
            if str(outcome).lower() not in ("true", "false"):
                self.add(f"{path}.depends_on.{i}.outcome", f"outcome is '{outcome}'; a condition task's outcome is "
                         "\"true\" or \"false\"", hint='outcome: "true"')
            else:
                outcomes[str(as_dict(item)["task_key"])] = str(outcome).lower()
        run_if = str(body.get("run_if") or "ALL_SUCCESS")
        if run_if not in RUN_IF:
            self.add(f"{path}.run_if", f"run_if is '{run_if}'{did_you_mean(run_if, list(RUN_IF))}",
                     hint=f"one of {', '.join(RUN_IF)}")
        kind = next((p for p in PAYLOADS if p in body), "notebook_task")
        where = f"{path}.{kind}"
        spec = as_dict(body.get(kind))
        notebook = python_file = package = entry = sql_file = run_job = None
        for_each: ForEach | None = None
        pipeline: str | None = None
        full_refresh = False
        condition: dict[str, str] | None = None
        job_parameters: dict[str, str] = {}
        base_parameters = self.strings(spec, "base_parameters", where)
        parameters = [yaml_text(p) for p in as_list(spec.get("parameters"))]
        if kind == "notebook_task" and "notebook_task" in body:
            raw = self.str_(spec, "notebook_path", where, required=True)
            notebook = self.notebook(f"{where}.notebook_path", raw) if raw is not None else None
        elif kind == "spark_python_task":
            raw = self.str_(spec, "python_file", where, required=True)
            if raw is not None:
                python_file = self.file(f"{where}.python_file", raw, "python_file", "python file")
        elif kind == "python_wheel_task":
            package = self.str_(spec, "package_name", where, required=True)
            entry = self.str_(spec, "entry_point", where, required=True)
            if package is not None and package != "streamling" and not body.get("libraries") \
                    and body.get("environment_key") is None:
                self.add(f"{where}.package_name", f"package_name is '{package}', but the task installs no wheel",
                         hint="add libraries: [{whl: ./dist/*.whl}] (built by artifacts), or an environment_key "
                              "whose dependencies provide it")
            named = as_dict(spec.get("named_parameters"))
            if named and parameters:
                self.add(f"{where}.named_parameters", "has both parameters and named_parameters",
                         hint="keep one of them")
            elif named:  # Databricks passes them as --name=value
                parameters = [f"--{k}={yaml_text(v)}" for k, v in named.items()]
        elif kind == "condition_task":
            op = self.str_(spec, "op", where, required=True)
            if op is not None and op not in CONDITION_OPS:
                self.add(f"{where}.op", f"op is '{op}'{did_you_mean(op, list(CONDITION_OPS))}",
                         hint=f"one of {', '.join(CONDITION_OPS)}")
            missing = [side for side in ("left", "right") if spec.get(side) is None]
            for side in missing:
                self.add(f"{where}.{side}", f"a condition task needs '{side}'",
                         hint="left and right are values or references such as {{tasks.t.values.rows}}")
            if op in CONDITION_OPS and not missing:
                condition = {"op": op, "left": yaml_text(spec["left"]), "right": yaml_text(spec["right"])}
        elif kind == "sql_task":
            for other in ("query", "dashboard", "alert"):
                if other in spec:
                    self.add(f"{where}.{other}", f"sql_task.{other} is not supported here: a SQL task runs a file "
                             "of statements on the target's Spark", hint="sql_task: {file: {path: ./report.sql}}",
                             code="bundle_unsupported")
            if "file" not in spec and not any(o in spec for o in ("query", "dashboard", "alert")):
                self.add(where, "sql_task has no file: a SQL task runs a file of statements here",
                         hint="sql_task: {file: {path: ./report.sql}}")
            elif "file" in spec:
                raw = self.str_(as_dict(spec.get("file")), "path", f"{where}.file", required=True)
                if raw is not None:
                    sql_file = self.file(f"{where}.file.path", raw, "sql_task.file.path", "SQL file")
            base_parameters = self.strings(spec, "parameters", where)
            parameters = []
        elif kind == "for_each_task":
            for_each = self.for_each(job, key, where, spec, body)
        elif kind == "pipeline_task":
            pipeline = self.str_(spec, "pipeline_id", where, required=True)
            full_refresh = self.bool_(spec, "full_refresh", where)
        elif kind == "run_job_task":
            for other in ("notebook_params", "python_params", "jar_params", "python_named_params",
                          "spark_submit_params", "sql_params", "dbt_commands"):
                if other in spec:
                    self.add(f"{where}.{other}", f"run_job_task.{other} is not supported here",
                             hint="pass the run's values as job_parameters (the job declares them as parameters)",
                             code="bundle_unsupported")
            run_job = self.str_(spec, "job_id", where, required=True)
            job_parameters = self.strings(spec, "job_parameters", where)
        libraries = self.libraries(path, body.get("libraries"), self.environments, body.get("environment_key"))
        cluster = self.cluster(path, body)
        return Task(
            key=key, depends_on=depends, libraries=libraries,
            spark_conf=self.strings(cluster, "spark_conf", path), spark_env_vars=self.strings(cluster, "spark_env_vars",
                                                                                            path),
            kind=cast(Literal["notebook", "spark_python", "python_wheel", "condition", "sql", "run_job", "for_each",
                               "pipeline"], kind[:-5]),
            condition=condition, outcomes=outcomes, run_if=run_if, sql_file=sql_file, run_job=run_job,
            for_each=for_each, pipeline=pipeline, full_refresh=full_refresh,
            job_parameters=job_parameters, notebook_path=notebook, base_parameters=base_parameters,
            python_file=python_file, package_name=package, entry_point=entry, parameters=parameters,
            max_retries=self.int_(body, "max_retries", path, 0, -1),
            min_retry_interval_millis=self.int_(body, "min_retry_interval_millis", path, 0, 0),
            retry_on_timeout=self.bool_(body, "retry_on_timeout", path),
            timeout_seconds=self.int_(body, "timeout_seconds", path, 0, 0), source=self.ctx.source(path))

    def notebook(self, path: str, raw: str) -> Path | None:
        resolved, shown, hint = self.locate(path, raw, "notebook_path")
        # the extension may be left out
        candidates = [resolved] if resolved.suffix in (".ipynb", ".py", ".sql") else [
            resolved.with_name(resolved.name + ext) for ext in (".ipynb", ".py", ".sql")]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            tried = " (tried .ipynb, .py and .sql)" if len(candidates) > 1 else ""
            self.add(path, f"notebook {shown} does not exist{tried}", hint=hint, code="bundle_missing_file")
            return None
        if not self.inside(path, found, "notebook"):
            return None
        if found.suffix in (".py", ".sql"):
            header = NOTEBOOK_HEADER if found.suffix == ".py" else SQL_NOTEBOOK_HEADER
            with found.open(encoding="utf-8", errors="replace") as handle:
                first = handle.readline().lstrip("\ufeff").rstrip()
            if first != header:
                self.add(path, f"{relative(found, self.ctx.root)} is not a notebook: a source notebook starts with "
                               f"'{header}'", hint="add that line at the top" + (
                                   ", or run the file as spark_python_task.python_file" if found.suffix == ".py" else
                                   ""))
                return None
        return found

    def for_each(self, job: str, key: str, where: str, spec: dict[str, Any], body: dict[str, Any]) -> ForEach | None:
        """A for-each task: its nested task becomes a hidden job run once per input (``{{input}}``)."""
        raw = spec.get("inputs")
        if raw is None:
            self.add(where, "a for_each_task needs inputs", hint='inputs: \'["a", "b"]\' or a reference such as '
                     '"{{tasks.list.values.items}}"')
            return None
        inputs = json.dumps(raw) if isinstance(raw, list) else yaml_text(raw)
        if "{{" not in inputs:
            try:
                parsed = json.loads(inputs)
            except ValueError:
                parsed = None
            if not isinstance(parsed, list):
                shown = inputs if len(inputs) <= 60 else inputs[:59] + "…"
                self.add(f"{where}.inputs", f"inputs {shown!r} is not a JSON array",
                         hint='e.g. inputs: \'["a", "b"]\' (or a reference to a task value or job parameter)')
        concurrency = self.int_(spec, "concurrency", where, 1, 1)
        if concurrency > 100:
            self.add(f"{where}.concurrency", f"concurrency is {concurrency}; Databricks allows at most 100",
                     hint="concurrency: 100 or less")
        nested_body = spec.get("task")
        if not isinstance(nested_body, dict):
            self.add(where, "a for_each_task needs the task it runs per input",
                     hint="task: {task_key: one, notebook_task: {notebook_path: …, base_parameters: {x: "
                          "'{{input}}'}}}")
            return None
        inner = [p for p in nested_body if p in PAYLOADS]
        if inner and inner[0] in ("for_each_task", "condition_task"):
            self.add(f"{where}.task.{inner[0]}", f"a for_each_task cannot run a {inner[0]}",
                     hint="run a notebook, Python, wheel, SQL or run-job task per input")
            return None
        if nested_body.get("depends_on"):
            self.add(f"{where}.task.depends_on", "the task of a for_each_task has no dependencies of its own",
                     hint="give the for_each_task itself depends_on")
        nested = self.task(job, f"{where}.task", nested_body)
        self.node = (key, "task")
        if nested is None:
            return None
        hidden = f"{job}[{key}]"
        self.iteration_jobs[hidden] = Job(
            key=hidden, name=f"{job} · {key} (one iteration)", tasks=[nested], parameters={}, schedule=None,
            periodic=None, continuous=None, max_concurrent_runs=1000, timeout_seconds=0, tags={},
            webhook_notifications={}, email_notifications={}, source=self.ctx.source(f"{where}.task"),
            iteration_of=(job, key))
        return ForEach(inputs, concurrency, hidden)

    def file(self, path: str, raw: str, key: str, what: str) -> Path | None:
        """The file a SQL or Python-file task runs (``key`` names it in hints, ``what`` in messages):
        it must exist, inside the bundle folder."""
        resolved, shown, hint = self.locate(path, raw, key)
        if not resolved.is_file():
            self.add(path, f"{what} {shown} does not exist", hint=hint, code="bundle_missing_file")
            return None
        return resolved if self.inside(path, resolved, what) else None

    def cluster(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The cluster spec a task names (inline, a job cluster or a bundle cluster); {} for none."""
        if "new_cluster" in body:
            return as_dict(body["new_cluster"])
        if body.get("job_cluster_key") is not None:
            key = yaml_text(body["job_cluster_key"])
            if key not in self.job_clusters:
                self.add(f"{path}.job_cluster_key", f"job_cluster_key '{key}' is not one of the job's job_clusters"
                         f"{did_you_mean(key, list(self.job_clusters))}",
                         hint=f"job clusters: {', '.join(self.job_clusters) or 'none declared'}")
            return self.job_clusters.get(key, {})
        if body.get("existing_cluster_id") is not None:
            # a cluster of this bundle by its key; any other id names a Databricks cluster: no settings to apply
            return self.clusters.get(yaml_text(body["existing_cluster_id"]), {})
        return {}

    def job_environments(self, path: str, items: Any) -> dict[str, list[str]]:
        """A job's ``environments``: each key's dependencies as pip requirements (paths made absolute)."""
        out: dict[str, list[str]] = {}
        for i, item in enumerate(as_list(items)):
            key = self.str_(as_dict(item), "environment_key", f"{path}.environments.{i}", required=True)
            deps = []
            for j, dep in enumerate(as_list(as_dict(as_dict(item).get("spec")).get("dependencies"))):
                text, at = yaml_text(dep).strip(), f"{path}.environments.{i}.spec.dependencies.{j}"
                if text.startswith("-r "):
                    deps.append(f"-r {self.library_path(at, text[3:].strip())}")
                elif text.startswith(("./", "../", "/")) or text.endswith(".whl"):
                    deps.append(self.library_path(at, text))
                else:
                    deps.append(text)
            if key is not None:
                out[key] = deps
        return out

    def libraries(self, where: str, items: Any, environments: dict[str, list[str]], environment_key: Any) -> list[str]:
        """A task's ``libraries`` and its ``environment_key``'s dependencies, as pip requirements."""
        out: list[str] = []
        for i, item in enumerate(as_list(items)):
            spec, at = as_dict(item), f"{where}.libraries.{i}"
            for other in ("jar", "maven", "egg", "cran"):
                if other in spec:
                    self.add(f"{at}.{other}", f"{other} libraries cannot be installed here: tasks run Python",
                             hint="use whl, pypi or requirements", code="bundle_unsupported")
            if "whl" in spec:
                out.append(self.library_path(f"{at}.whl", yaml_text(spec["whl"])))
            elif "pypi" in spec:
                package = self.str_(as_dict(spec["pypi"]), "package", f"{at}.pypi", required=True)
                if package:
                    repo = as_dict(spec["pypi"]).get("repo")
                    out.append(f"{package} --index-url {yaml_text(repo)}" if repo else package)
            elif "requirements" in spec:
                out.append(f"-r {self.library_path(f'{at}.requirements', yaml_text(spec['requirements']))}")
        if environment_key is not None:
            key = yaml_text(environment_key)
            if key not in environments:
                self.add(f"{where}.environment_key", f"environment_key '{key}' is not one of the job's environments"
                         f"{did_you_mean(key, list(environments))}",
                         hint=f"environments: {', '.join(environments) or 'none declared'}")
            out.extend(environments.get(key, []))
        return out

    def library_path(self, where: str, raw: str) -> str:
        """A wheel or requirements file, relative to the YAML file naming it (it may not exist before
        ``deploy`` builds the artifacts)."""
        resolved, _, _ = self.locate(where, raw, "a library path")
        return str(resolved)
