"""One task attempt of a deployed job: ``python -m streamling.bundle.driver …`` (started by the runner).

A notebook task compiles its deployed notebook snapshot with the run's parameters and runs the
pipeline on the target's Spark master (client mode: this process is the Spark driver, the
executors run on the cluster). SIGTERM finishes the current epoch and exits 0, so the runner can
stop a run or move it to a new deployment without leaving an epoch half-written; a killed
driver resumes from its checkpoint on the next attempt.

The exit code is also written to ``<log>.exit``: a runner that restarted meanwhile reads it
there, since it cannot ``wait()`` on a process it did not start.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from streamling.errors import StreamlingError

log = logging.getLogger("streamling.bundle.driver")


def run_task(root: Path, version: int, job_key: str, task_key: str, params: dict[str, str]) -> int:
    from streamling.bundle.deploy import task_parameters
    from streamling.bundle.workspace import Workspace

    ws = Workspace(str(root))
    deployment = ws.deployment(version)
    if deployment is None:
        raise StreamlingError(f"deployment {version} does not exist under {root}", code="bundle_deployment_missing",
                              hint="deploy again with `streamling bundle deploy`")
    job = deployment["jobs"][job_key]
    task = next(t for t in job["tasks"] if t["task_key"] == task_key)
    values = task_parameters(job, task, params)
    os.environ["STREAMLING_JOB_PARAMETERS"] = json.dumps(values)
    files = Path(deployment["file_path"])
    if task["kind"] == "notebook":
        return _notebook_task(ws, deployment, task, values, files)
    # A plain CLI task gets the target's settings as STREAMLING__ variables (the same layer users
    # have), with checkpoints under the target root rather than next to wherever it runs.
    from streamling.config import env_variables

    os.environ.update(env_variables({"state_dir": deployment["state_dir"], **(deployment.get("config") or {})}))
    if task["kind"] == "spark_python":
        script = files / task["python_file"]
        os.chdir(script.parent)
        os.execv(sys.executable, [sys.executable, str(script), *task["parameters"]])
    from streamling.cli import main

    os.chdir(files)
    return main(list(task["parameters"]))


def _notebook_task(ws: Any, deployment: dict[str, Any], task: dict[str, Any], values: dict[str, str],
                   files: Path) -> int:
    from streamling.bundle.compile import compile_notebook
    from streamling.cli import execute
    from streamling.config import deep_merge, load_settings
    from streamling.spec import parse_pipeline

    snapshot = ws.deployment_dir(int(deployment["version"])) / task["notebook_snapshot"]
    compiled = compile_notebook(snapshot, values)
    # Relative paths in the notebook resolve in its folder of the synced files, as on Databricks.
    cwd = files / Path(task["notebook_path"]).parent
    cwd.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)
    overrides = deep_merge(deployment.get("config") or {}, {
        "application_id": task["application_id"], "state_dir": deployment["state_dir"]})
    if compiled.run.get("rows"):
        overrides["num_records_before_stop"] = int(compiled.run["rows"])
    settings = load_settings(compiled.config_name, cwd=cwd, overrides=overrides)
    spec = parse_pipeline(compiled.to_yaml(), source=f"{task['notebook_path']} (deployment {deployment['version']})")
    log.info("job task '%s': notebook %s, deployment %s, parameters %s, master %s", task["task_key"],
             task["notebook_path"], deployment["version"], json.dumps(values), settings.spark.master)
    seconds = compiled.run.get("seconds")
    return execute(spec, settings, stop_after_secs=float(seconds) if seconds else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamling-driver")
    p.add_argument("--root", required=True)
    p.add_argument("--deployment", type=int, required=True)
    p.add_argument("--job", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--params", default="{}")
    p.add_argument("--exit-file")
    args = p.parse_args(argv)
    from streamling.cli import STATS_FILE_ENV, setup_logging
    from streamling.util import free_port

    if args.exit_file:
        # The run's figures next to its log (``bundle runs`` / ``summary`` show them), and an admin API
        # on a port of its own: several drivers run side by side (set admin_api_port to pin one).
        os.environ[STATS_FILE_ENV] = args.exit_file.removesuffix(".exit") + ".stats.json"
        os.environ.setdefault("STREAMLING__ADMIN_API_PORT", str(free_port()))

    setup_logging(os.environ.get("STREAMLING__LOG_FORMAT", "text"), debug=False)
    code = 2
    try:
        code = run_task(Path(args.root), args.deployment, args.job, args.task, json.loads(args.params))
    except StreamlingError as exc:
        log.error("%s", exc.describe())
        code = 1 if exc.user else 2
    except Exception:  # noqa: BLE001 - reported in the driver log, the run fails
        log.exception("the job task failed")
        code = 2
    finally:
        if args.exit_file:
            Path(args.exit_file).write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
