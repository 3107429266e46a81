"""``resources.pipelines``: declarative pipelines run by Apache Spark's ``pyspark.pipelines``.

A Lakeflow (Databricks) pipeline is defined by its source files; what only Databricks has (the ``dlt``
module, expectations, AUTO CDC in SQL, continuous mode, jar libraries) fails here with what to write
instead, and so does a location for its tables and checkpoints that the hosts of the target's Spark
master do not all reach. A job's ``pipeline_task`` must name one of these pipelines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamling.bundle.model import Job, Pipeline, pipeline_locations
from streamling.bundle.tree import as_dict, as_list, relative, yaml_text
from streamling.bundle.values import ValueReader
from streamling.bundle.variables import local_or_uri
from streamling.util import did_you_mean

_STORAGE_HINT = ("set resources.pipelines.{key}.storage to a location every host reaches, e.g. "
                 "hdfs://namenode:8020/pipelines/{key} or s3a://bucket/pipelines/{key}: its tables go to "
                 "<storage>/tables, its checkpoints to <storage>/checkpoints")


class PipelineBuilder(ValueReader):
    """Builds ``resources.pipelines`` and checks the jobs' pipeline tasks against them."""

    def pipeline(self, key: str, body: Any, master: str) -> Pipeline | None:
        """A declarative pipeline run by Spark's ``pyspark.pipelines``: Databricks-only parts (the
        ``dlt`` module, continuous mode) fail here with what to write instead, and so does a
        ``storage`` location that the hosts of ``master`` do not share."""
        from streamling import storage

        path, spec = f"resources.pipelines.{key}", as_dict(body)
        self.node = (key, "pipeline")
        if spec.get("continuous") in (True, "true", "True"):
            self.add(f"{path}.continuous", "a continuous pipeline cannot run here: Spark's declarative pipelines run "
                     "triggered updates", hint="drop continuous and refresh it from a job's pipeline_task (a "
                     "continuous job keeps it fresh)", code="bundle_unsupported")
        libraries: list[str] = []
        for i, item in enumerate(as_list(spec.get("libraries"))):
            at, lib = f"{path}.libraries.{i}", as_dict(item)
            for other in ("jar", "maven", "whl"):
                if other in lib:
                    self.add(f"{at}.{other}", f"a pipeline's {other} library cannot be loaded here",
                             hint="pipelines load Python and SQL source files", code="bundle_unsupported")
            raw = yaml_text(as_dict(lib.get("glob")).get("include") or as_dict(lib.get("file")).get("path")
                        or as_dict(lib.get("notebook")).get("path") or "")
            if not raw:
                continue
            folder_glob = raw.endswith("/**")
            if "*" in raw.removesuffix("/**") or ("*" in raw and not folder_glob):
                self.add(at, f"library pattern '{raw}' is not a file or a folder/**", hint="Spark's declarative "
                         "pipelines take a file path or a whole folder (transformations/**)")
                continue
            resolved, shown, hint = self.locate(at, raw.removesuffix("/**"), "a pipeline library")
            if "notebook" in lib and not resolved.exists() and resolved.with_suffix(".py").is_file():
                resolved = resolved.with_suffix(".py")  # Databricks leaves a notebook's extension out
            if not resolved.exists():
                self.add(at, f"pipeline library {shown} does not exist", hint=hint, code="bundle_missing_file")
                continue
            if not self.inside(at, resolved, "pipeline library"):
                continue
            files = sorted([*resolved.rglob("*.py"), *resolved.rglob("*.sql")]) if resolved.is_dir() else [resolved]
            for file in files:
                for issue, fix in _databricks_only(file):
                    self.add(at, f"{relative(file, self.ctx.root)} {issue}", hint=fix, code="bundle_unsupported")
            libraries.append(str(resolved) + ("/**" if resolved.is_dir() else ""))
        if not as_list(spec.get("libraries")):
            self.add(path, "no libraries: a pipeline is defined by its source files",
                     hint="libraries: [{glob: {include: transformations/**}}]")
        stored = self.str_(spec, "storage", path)
        if stored and (problem := storage.cluster_path_problem(stored, master, "storage", written_by_executors=True)):
            self.add(f"{path}.storage", problem, hint=_STORAGE_HINT.format(key=key), code="cluster_path")
        self.node = None
        return Pipeline(key, self.str_(spec, "name", path) or key, libraries, self.str_(spec, "catalog", path),
                        self.str_(spec, "schema", path) or self.str_(spec, "target", path),
                        self.strings(spec, "configuration", path), self.ctx.source(path),
                        local_or_uri(stored, self.ctx.root) if stored else None)

    def check_pipeline_tasks(self, jobs: Mapping[str, Job], declared: Mapping[str, Any],
                             pipelines: Mapping[str, Pipeline], config: Mapping[str, Any], root_path: str) -> None:
        """A pipeline_task names a pipeline of the bundle. On a master spanning hosts the pipeline's
        executors write its tables and checkpoints from every host, so both must be on storage every
        host reaches (``pipeline_locations``), not on the driver host's disk."""
        from streamling import storage

        master = str(as_dict(config.get("spark")).get("master") or "local[*]")
        for key, job in jobs.items():
            for i, task in enumerate(job.tasks):
                if task.pipeline is None:
                    continue
                where = f"resources.jobs.{key}.tasks.{i}.pipeline_task"
                if task.pipeline not in declared:
                    self.ctx.add(f"{where}.pipeline_id", f"updates pipeline '{task.pipeline}', which this bundle "
                                 f"does not define{did_you_mean(task.pipeline, list(declared))}",
                                 hint="pipeline_id: ${resources.pipelines.<key>.id}", node=task.key, node_kind="task")
                pipeline = pipelines.get(task.pipeline)
                if pipeline is None or pipeline.storage or not root_path:
                    continue  # a storage location of its own was checked with the pipeline
                checkpoints, tables = pipeline_locations(root_path, pipeline.key, None)
                problem = next((p for path, what in ((tables, "table"), (checkpoints, "checkpoint"))
                                if (p := storage.cluster_path_problem(path, master, f"the {what} folder of pipeline "
                                                                      f"'{pipeline.key}'", written_by_executors=True))),
                               None)
                if problem is not None:
                    self.ctx.add(where, problem, hint=_STORAGE_HINT.format(key=pipeline.key), node=task.key,
                                 node_kind="task", code="cluster_path")


#: What only Databricks' pipelines run, by the kind of library file: pattern, problem, the fix. Spark's
#: declarative pipelines would fail on each at run time (an unknown module, a SQL parse error).
_DATABRICKS_ONLY: dict[str, list[tuple[str, str, str]]] = {
    ".py": [(r"^\s*(import\s+dlt\b|from\s+dlt\s+import)", "uses Databricks' dlt module, which only Databricks has",
             "write it with Spark's declarative pipelines: from pyspark import pipelines as dp "
             "(@dp.materialized_view, @dp.table, dp.create_streaming_table); expectations (dlt.expect*) "
             "have no equivalent there")],
    ".sql": [(r"\bCONSTRAINT\s+\S+\s+EXPECT\b", "declares an expectation (CONSTRAINT … EXPECT), which only "
              "Databricks' pipelines have", "Spark's declarative pipelines have no expectations: filter the rows "
              "in the query (WHERE) or check them in a later task"),
             (r"\b(AUTO\s+CDC|APPLY\s+CHANGES)\s+INTO\b", "uses AUTO CDC / APPLY CHANGES INTO, which Spark's "
              "pipeline SQL does not have", "write the change flow in a Python library file with "
              "dp.create_auto_cdc_flow, or apply the changes with MERGE INTO in a task")],
}


def _databricks_only(file: Path) -> list[tuple[str, str]]:
    """What ``file`` uses that only Databricks runs: (problem, hint) pairs, SQL comments ignored."""
    rules = _DATABRICKS_ONLY.get(file.suffix.lower(), [])
    if not rules:
        return []
    text = file.read_text(errors="replace")
    if file.suffix.lower() == ".sql":
        text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    flags = re.M if file.suffix.lower() == ".py" else re.I
    return [(problem, hint) for pattern, problem, hint in rules if re.search(pattern, text, flags)]
