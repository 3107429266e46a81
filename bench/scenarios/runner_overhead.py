"""``runner_overhead``: what the job runner adds around a task, as Databricks' figures would show it.

A temporary bundle (production target, its own root, SQLite run store) holds two jobs of plain
Python file tasks — no Spark, so the runner's own cost is all there is:

- **task start → first user line**: job ``one`` is a single task whose first line records
  ``time.time()``. The figure is that time minus the attempt's start as the runner records it
  (the moment it launched the driver process), i.e. interpreter start, streamling's driver imports,
  the deployment read, parameters and the file's own import. ``bundle run`` → first line is
  reported too (the CLI's request, the runner's pick-up, the launch).
- **10-task job vs the sum of its tasks**: job ``chain`` runs ten tasks one after another
  (``depends_on`` the previous), each sleeping ``SLEEP_SECS``. Wall time is the run's end minus its
  start (run store); the sum is the tasks' own sleeping (10 × ``SLEEP_SECS``) and, apart, the sum
  of the attempts' recorded durations. Their ratio is the scheduling overhead of a chain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from scenarios.common import Options, ScenarioResult, Side, log, temp_dir

NAME = "runner_overhead"
TASKS = 10
SLEEP_SECS = 1.0


def _cli(root: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLING__", "BUNDLE_VAR_"))}
    return subprocess.run([sys.executable, "-m", "streamling.cli", "bundle", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _project(work: Path) -> Path:
    root = work / "project"
    root.mkdir()
    (root / "first_line.py").write_text("import time, sys\nopen(sys.argv[1], 'w').write(repr(time.time()))\n")
    (root / "sleep.py").write_text(f"import time\ntime.sleep({SLEEP_SECS})\n")
    chain = "\n".join(
        f"        - task_key: t{i}\n" + (f"          depends_on: [{{task_key: t{i - 1}}}]\n" if i else "")
        + "          spark_python_task: {python_file: ./sleep.py}" for i in range(TASKS))
    (root / "bundle.yml").write_text(textwrap.dedent(f"""\
        bundle: {{name: overhead}}
        workspace: {{root_path: {work / 'root'}}}
        targets: {{prod: {{default: true, mode: production}}}}
        resources:
          jobs:
            one:
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./first_line.py, parameters: ["{work / 'first_line.txt'}"]}}
            chain:
              tasks:
        """) + chain + "\n")
    deployed = _cli(root, "deploy")
    if deployed.returncode != 0:
        raise RuntimeError(f"deploy failed: {deployed.stderr}")
    return root


def _latest(root: Path, job: str) -> dict[str, Any]:
    runs = json.loads(_cli(root, "runs", job, "-o", "json").stdout)
    return dict(runs[0])


def _round(root: Path, work: Path) -> dict[str, Any]:
    marker = work / "first_line.txt"
    marker.unlink(missing_ok=True)
    asked = time.time()
    ran = _cli(root, "run", "one")
    if ran.returncode != 0:
        raise RuntimeError(f"run one failed: {ran.stderr}")
    first_line = float(marker.read_text())
    attempt = _latest(root, "one")["attempts"][0]
    ran = _cli(root, "run", "chain")
    if ran.returncode != 0:
        raise RuntimeError(f"run chain failed: {ran.stderr}")
    chain = _latest(root, "chain")
    attempts = sum(a["ended_at"] - a["started_at"] for a in chain["attempts"])
    wall = chain["ended_at"] - chain["started_at"]
    return {"task_start_to_first_line_secs": first_line - attempt["started_at"],
            "run_command_to_first_line_secs": first_line - asked,
            "chain_wall_secs": wall, "chain_attempts_secs": attempts,
            "chain_wall_over_sleep": wall / (TASKS * SLEEP_SECS)}


def run(opts: Options) -> ScenarioResult:
    side = Side("runner")
    log(f"{NAME}: a trivial Python task and a chain of {TASKS} × {SLEEP_SECS:g} s tasks, {opts.runs} runs")
    with temp_dir(NAME) as work:
        root = _project(work)
        try:
            side.warmup = _round(root, work)
            for i in range(opts.runs):
                side.runs.append(_round(root, work))
                log(f"  run {i + 1}/{opts.runs}: " + ", ".join(f"{k}={v:.3f}" for k, v in side.runs[-1].items()))
        finally:
            _cli(root, "destroy", "--auto-approve")
    result = ScenarioResult(NAME, {"runs": opts.runs, "tasks": TASKS, "sleep_secs": SLEEP_SECS}, {"runner": side})
    result.figures = {
        "task start → first user line": (side.median("task_start_to_first_line_secs"), "s"),
        "bundle run → first user line": (side.median("run_command_to_first_line_secs"), "s"),
        f"{TASKS}-task chain: wall": (side.median("chain_wall_secs"), "s"),
        f"{TASKS}-task chain: sum of attempts": (side.median("chain_attempts_secs"), "s"),
        f"{TASKS}-task chain: wall / sum of the tasks' own {TASKS * SLEEP_SECS:g} s":
            (side.median("chain_wall_over_sleep"), "×"),
    }
    result.notes.append("no Spark in these tasks: the figures are the runner's and the driver's own cost")
    return result
