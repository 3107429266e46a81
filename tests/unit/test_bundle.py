"""bundle.yml deploys files that exist: a renamed notebook or pipeline must not leave a dead job."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_every_job_task_points_at_a_file_in_the_repository() -> None:
    bundle = yaml.safe_load((ROOT / "bundle.yml").read_text())
    tasks = [t for job in bundle["resources"]["jobs"].values() for t in job["tasks"]]
    notebooks = [t["notebook_task"]["notebook_path"] for t in tasks if "notebook_task" in t]
    assert notebooks, "the bundle deploys the notebooks as jobs"
    for path in notebooks:
        assert (ROOT / path).is_file(), path
    for task in tasks:
        for parameter in task.get("python_wheel_task", {}).get("parameters", []):
            if parameter.endswith(".yaml"):
                assert (ROOT / parameter.replace("${workspace.file_path}/", "")).is_file(), parameter
