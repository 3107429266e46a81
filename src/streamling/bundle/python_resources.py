"""Resources defined in Python (``python: {resources: [...], mutators: [...]}``) as the Databricks CLI loads them.

The ``databricks-bundles`` package defines jobs and pipelines in Python
(``load_resources(bundle) -> Resources``) and mutators that change them. The Databricks CLI runs
its entry point ``python -m databricks.bundles.build --phase load_resources`` (then
``apply_mutators``) with the bundle's configuration as JSON and reads the resulting configuration
back; this module does the same, in the bundle folder, with ``python.venv_path``'s interpreter (or
streamling's own), so a bundle's Python resources load here as they do there. What the package
reports (an import error, a bad resource) comes back as located problems and warnings.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamling.errors import StreamlingError

PHASES = ("load_resources", "apply_mutators")


@dataclass
class Diagnostic:
    severity: str
    summary: str
    detail: str = ""
    file: str | None = None
    line: int | None = None
    path: str | None = None


@dataclass
class PythonResources:
    """The configuration after both phases, where each Python-defined resource was defined, and what
    the package reported."""

    data: dict[str, Any]
    locations: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)


def interpreter(root: Path, venv_path: str | None) -> str:
    """``python.venv_path``'s interpreter (relative to the bundle folder), else streamling's own."""
    if not venv_path:
        return sys.executable
    python = (root / venv_path).resolve() / "bin" / "python"
    if not python.exists():
        raise StreamlingError(f"python.venv_path {venv_path} has no bin/python", code="bundle_python_venv",
                              hint="create it (python -m venv) and install databricks-bundles and your code there, "
                                   "or drop venv_path to use streamling's environment")
    return str(python)


def load(root: Path, data: dict[str, Any], target: str, variables: dict[str, Any], python: str) -> PythonResources:
    """Run the package's phases over ``data`` (the bundle's merged configuration for ``target``)."""
    conf = data.get("python") or {}
    current = {**data, "bundle": {**(data.get("bundle") or {}), "target": target},
               "variables": {k: {"value": v} for k, v in variables.items()}}
    result = PythonResources(current)
    for phase in PHASES:
        if not conf.get("resources" if phase == "load_resources" else "mutators"):
            continue
        with tempfile.TemporaryDirectory(prefix="streamling-python-resources-") as tmp:
            files = {name: Path(tmp) / f"{name}.json" for name in ("input", "output", "diagnostics", "locations")}
            files["input"].write_text(json.dumps(current))
            done = subprocess.run([python, "-m", "databricks.bundles.build", "--phase", phase,
                                   *(a for name, path in files.items() for a in (f"--{name}", str(path)))],
                                  cwd=root, capture_output=True, text=True, check=False, timeout=300)
            if "No module named databricks.bundles" in done.stderr or "No module named 'databricks" in done.stderr:
                raise StreamlingError("python.resources needs the databricks-bundles package, which is not installed "
                                      f"for {python}", code="bundle_python_missing",
                                      hint="pip install databricks-bundles into that environment (python.venv_path, "
                                           "or streamling's own)")
            result.diagnostics += _diagnostics(files["diagnostics"])
            if done.returncode != 0 and not any(d.severity == "error" for d in result.diagnostics):
                tail = "\n".join(done.stderr.strip().splitlines()[-3:])
                raise StreamlingError(f"Python resources ({phase}) failed: {tail}", code="bundle_python_failed")
            if files["output"].exists() and files["output"].stat().st_size:
                current = json.loads(files["output"].read_text())
            result.locations.update(_locations(files["locations"], root))
    result.data = current
    return result


def _diagnostics(path: Path) -> list[Diagnostic]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        location = item.get("location") or {}
        out.append(Diagnostic(str(item.get("severity") or "error"), str(item.get("summary") or ""),
                              str(item.get("detail") or ""), location.get("file"), location.get("line"),
                              item.get("path")))
    return out


def _locations(path: Path, root: Path) -> dict[str, tuple[str, int | None]]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            file = Path(item.get("file") or "")
            shown = str(file.relative_to(root)) if file.is_absolute() and file.is_relative_to(root) else str(file)
            out[str(item["path"])] = (shown, item.get("line"))
    return out
