"""The merged tree of the chosen target → the ``Bundle``: workspace, config, resources and artifacts.

The ``Builder`` is the one pass over the tree: it sets up the ``${…}`` values, checks the target's runtime
settings (``config``) and run store, then builds jobs (``jobs``, ``tasks``), pipelines (``pipelines``), secret
scopes and artifacts, each value checked on the way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import ValidationError as PydanticValidationError

from streamling.bundle.jobs import JobBuilder
from streamling.bundle.model import Artifact, Bundle, Target
from streamling.bundle.pipelines import PipelineBuilder
from streamling.bundle.schema import ARTIFACT, CLUSTER, JOB, PIPELINE, RESOURCE_KINDS, SECRET_SCOPE
from streamling.bundle.tree import Context, as_dict, as_list, yaml_text
from streamling.bundle.variables import Resolver, declare_variables, local_or_uri
from streamling.config.settings import Settings
from streamling.util import did_you_mean


class Builder(JobBuilder, PipelineBuilder):
    """Turns the merged tree of the chosen target into dataclasses, checking values on the way."""

    def __init__(self, ctx: Context, target: str, body: dict[str, Any], user: str) -> None:
        super().__init__(ctx)
        self.target = target
        self.body = body
        self.user = user
        self.resolver = Resolver(ctx)
        mode = body.get("mode")
        if mode is not None and mode not in ("development", "production"):
            ctx.add(f"targets.{target}.mode", f"mode must be development or production (got {mode!r})",
                    hint="development prefixes and pauses jobs; production requires a workspace.root_path")
            mode = None
        self.mode = cast(Literal["development", "production"] | None, mode)

    def build(self, cli_vars: Mapping[str, str], environ: Mapping[str, str]) -> Bundle:
        ctx, data, res = self.ctx, self.ctx.data, self.resolver
        meta = as_dict(data.get("bundle"))
        name = meta.get("name")
        if name is None or isinstance(name, (dict, list)) or not str(name).strip():
            ctx.add("bundle.name" if "bundle" in data else "bundle", "the bundle has no name",
                    hint="set bundle: {name: …}; it names deployments and the default root_path")
            name = "bundle"
        workspace = as_dict(data.get("workspace"))
        root_raw = workspace.get("root_path")
        if self.mode == "production" and root_raw is None:
            ctx.add(f"targets.{self.target}",
                    f"target '{self.target}' is in production mode and has no workspace.root_path",
                    hint=f"set targets.{self.target}.workspace.root_path to where deployments, checkpoints and "
                         "run logs live", code="bundle_production_root")
        res.raw["bundle.name"] = (yaml_text(name), ctx.loc("bundle.name"))
        res.raw["bundle.target"] = (self.target, ctx.loc(f"targets.{self.target}"))
        for key in ("short_name", "userName"):
            res.done[f"workspace.current_user.{key}"] = self.user
        res.raw["workspace.root_path"] = (
            yaml_text(root_raw) if root_raw is not None else f"~/.streamling/bundle/{name}/{self.target}",
            ctx.loc("workspace.root_path"))
        file_raw = workspace.get("file_path")
        res.raw["workspace.file_path"] = (yaml_text(file_raw) if file_raw is not None
                                          else "${workspace.root_path}/files", ctx.loc("workspace.file_path"))
        res.post["workspace.root_path"] = res.post["workspace.file_path"] = lambda t: local_or_uri(t, ctx.root)
        resources = as_dict(data.get("resources"))
        jobs = as_dict(resources.get("jobs"))
        for key in jobs:
            res.done[f"resources.jobs.{key}.id"] = str(key)
        for key in as_dict(resources.get("pipelines")):
            res.done[f"resources.pipelines.{key}.id"] = str(key)
        for key in as_dict(resources.get("clusters")):
            res.done[f"resources.clusters.{key}.id"] = str(key)
        for kind in resources:
            if kind in RESOURCE_KINDS:  # other names are unknown keys, reported by the schema check
                ctx.add(f"resources.{kind}", f"resources.{kind} is not supported here: only jobs are deployed",
                        hint="run the work as a job with a notebook_task, spark_python_task or python_wheel_task",
                        code="bundle_unsupported")
        names = declare_variables(res, self.target, self.body, cli_vars, environ)
        values = {n: res.ref(f"var.{n}") for n in names}
        root_path = res.ref("workspace.root_path") or ""
        file_path = res.ref("workspace.file_path") or ""
        bundle_name = res.ref("bundle.name") or yaml_text(name)
        config = res.tree("config", data.get("config")) if "config" in data else {}
        if not isinstance(config, dict):
            ctx.add("config", "config must be a mapping of runtime settings (the keys of config.yaml)")
            config = {}
        self.check_config(config)
        store = self.check_runner_store(config, environ)
        self.check_standby_executors(config)
        if root_path:
            from streamling.bundle.workspace import root_problem

            if (problem := root_problem(root_path, store)) is not None:
                ctx.add("workspace.root_path", problem.message, hint=problem.hint, code=problem.code)
        self.clusters = {str(k): as_dict(res.tree(f"resources.clusters.{k}", v, CLUSTER))
                         for k, v in as_dict(resources.get("clusters")).items()}
        built = {str(k): self.job(str(k), res.tree(f"resources.jobs.{k}", v, JOB)) for k, v in jobs.items()}
        self.check_run_jobs({**{k: v for k, v in built.items() if v is not None}, **self.iteration_jobs})
        built.update(self.iteration_jobs)
        target = Target(self.target, self.mode, root_path, root_raw is not None, file_path, config)
        self.node = None
        scopes = self.secret_scopes(as_dict(resources.get("secret_scopes")))
        pipelines = {str(k): p for k, v in as_dict(resources.get("pipelines")).items()
                     if (p := self.pipeline(str(k), res.tree(f"resources.pipelines.{k}", v, PIPELINE),
                                            str(as_dict(config.get("spark")).get("master") or "local[*]"))) is not None}
        self.check_pipeline_tasks({k: v for k, v in built.items() if v is not None},
                                  as_dict(resources.get("pipelines")), pipelines, config, root_path)
        artifacts = [a for k, v in as_dict(data.get("artifacts")).items()
                     if (a := self.artifact(str(k), res.tree(f"artifacts.{k}", v, ARTIFACT))) is not None]
        return Bundle(bundle_name, ctx.root, target, {k: v for k, v in values.items() if v is not None},
                      {k: v for k, v in built.items() if v is not None}, [f.path for f in ctx.files], self.user,
                      ctx.warnings, scopes, artifacts, pipelines)

    def artifact(self, name: str, body: Any) -> Artifact | None:
        path = f"artifacts.{name}"
        spec = as_dict(body)
        kind = str(spec.get("type") or "whl")
        if kind != "whl":
            self.ctx.add(f"{path}.type", f"artifact '{name}' is of type {kind!r}; only Python wheels (whl) are "
                         "built here", hint="type: whl", code="bundle_unsupported")
            return None
        raw = self.str_(spec, "path", path) or "."
        folder, shown, hint = self.locate(f"{path}.path" if "path" in spec else path, raw, "artifacts.path")
        if not folder.is_dir():
            self.add(f"{path}.path" if "path" in spec else path, f"artifact '{name}': folder {shown} does not exist",
                     hint=hint, code="bundle_missing_file")
            return None
        files = [str(folder / yaml_text(as_dict(f).get("source"))) for f in as_list(spec.get("files"))
                 if as_dict(f).get("source")] or [str(folder / "dist" / "*.whl")]
        return Artifact(name, folder, self.str_(spec, "build", path), files)

    def secret_scopes(self, declared: dict[str, Any]) -> list[str]:
        """Scopes of the local secret store (``streamling.secrets``); Azure Key Vault ones cannot be read here."""
        names: list[str] = []
        for key, body in declared.items():
            path = f"resources.secret_scopes.{key}"
            spec = as_dict(self.resolver.tree(path, body, SECRET_SCOPE))
            backend = str(spec.get("backend_type") or "DATABRICKS").upper()
            if backend != "DATABRICKS" or "keyvault_metadata" in spec:
                shown = backend if backend != "DATABRICKS" else "Azure Key Vault"
                self.ctx.add(f"{path}.backend_type" if "backend_type" in spec else f"{path}.keyvault_metadata",
                             f"secret scope '{key}' is backed by {shown}; only the target's own secret store is read "
                             "here",
                             hint="drop backend_type (DATABRICKS: the target's store) and put the values with "
                                  "`streamling bundle secrets put-secret`", code="bundle_unsupported")
                continue
            names.append(str(spec.get("name") or key))
        return names

    def check_runner_store(self, config: dict[str, Any], environ: Mapping[str, str]) -> str:
        """The target's run store; a target on several hosts whose runner keeps runs on one host's disk
        is warned: nobody can take over."""
        from streamling import storage

        master = str((config.get("spark") or {}).get("master") or "")
        runner = config.get("job_runner") or {}
        store = str(environ.get("STREAMLING__JOB_RUNNER__STORE") or (runner.get("store") if isinstance(runner, dict)
                                                                     else None) or "sqlite")
        if storage.is_multi_host(master) and store == "sqlite":
            self.ctx.warnings.append(
                f"target '{self.target}' runs on {master}, which spans hosts, but its job runner keeps runs in "
                "runs.db on one host's disk (job_runner.store: sqlite): if that host dies, no runner elsewhere can "
                "take over its jobs. Set job_runner.store: postgres (see README, Running on a cluster)")
        return store

    def check_standby_executors(self, config: dict[str, Any]) -> None:
        """``job_runner.standby_executors`` is kept only by a cluster standby that registers early
        (``session.idle_conf``); elsewhere it has no effect, and without ``spark.cores.max`` the
        active driver takes every core and leaves none to keep."""
        from streamling.runtime.session import chooses_executors

        runner, spark = as_dict(config.get("job_runner")), as_dict(config.get("spark"))
        kept = runner.get("standby_executors")
        if not isinstance(kept, int) or isinstance(kept, bool) or kept <= 0:
            return
        master, conf = str(spark.get("master") or "local[*]"), as_dict(spark.get("conf"))
        path = "config.job_runner.standby_executors"
        if master.startswith("local"):
            self.ctx.warn(path, "standby_executors", f"the target's master is {master}: a local standby has no "
                          "executors to keep (it already holds its whole SparkSession)")
        elif chooses_executors(conf):
            self.ctx.warn(path, "standby_executors", "the target's spark.conf chooses the executors itself "
                          "(spark.executor.instances or spark.dynamicAllocation.*), so a standby keeps only its "
                          "driver JVM; drop those settings to keep warm executors")
        elif "spark.cores.max" not in conf:
            self.ctx.warnings.append(
                f"{self.ctx.source(path)}: job_runner.standby_executors: the active driver takes every free core "
                f"of {master} (spark.cores.max is not set), so a standby gets its {kept} executor(s) only when that "
                "driver dies, cold. Set spark.cores.max to leave them free")

    def check_config(self, config: dict[str, Any]) -> None:
        """Runtime settings are checked now, so a typo in targets.<t>.config fails validate, not the first run."""
        top = sorted(Settings.model_fields)
        for key in config:  # Settings keeps unknown top-level keys (other builds' connectors): say so here
            if key not in Settings.model_fields:
                self.ctx.warn(f"config.{key}", str(key), f"not a streamling setting{did_you_mean(str(key), top)}")
        try:
            Settings.model_validate(config)
        except PydanticValidationError as exc:
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                path = ".".join(["config", *loc])
                if err["type"] == "extra_forbidden":
                    model: Any = Settings
                    for part in loc[:-1]:
                        field_info = model.model_fields.get(part) if hasattr(model, "model_fields") else None
                        model = field_info.annotation if field_info else None
                    keys = sorted(getattr(model, "model_fields", {}))
                    self.ctx.add(path, f"unknown key '{loc[-1]}' in {'.'.join(['config', *loc[:-1]])}"
                                 f"{did_you_mean(loc[-1], keys)}", code="bundle_unknown_key",
                                 hint=f"keys that apply here: {', '.join(keys)}" if keys else None)
                else:
                    text = str(err["msg"]).removeprefix("Value error, ").replace("Input should be", "must be")
                    self.ctx.add(path, f"{path}: {text}", hint="it takes the same values as in config.yaml")
