"""Helpers shared by the integration conftests that start services with ``fixtures/services/up``.

``up`` prints only ``export NAME=value`` lines (shell-quoted) on stdout and logs to stderr. The
parsed exports are handed to tests through fixtures rather than written into ``os.environ``, so tests
that read default settings from the environment are unaffected.

Importable as ``services`` from any test or conftest: pytest puts ``tests/`` on ``sys.path`` for
``tests/conftest.py`` (the test folders are not packages).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UP = ROOT / "fixtures" / "services" / "up"


def parse_exports(text: str) -> dict[str, str]:
    """``export NAME=value`` lines (shell-quoted) → a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            out[name] = value
    return out


def start_services(*names: str, timeout: float = 600) -> dict[str, str]:
    """Run ``fixtures/services/up NAMES…`` (reusing running services) and return its exports.

    Fails the calling test, with the script's last log lines, when a service cannot be started.
    """
    env = {**os.environ, "STREAMLING_CACHE_DIR": os.environ.get("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))}
    command = [str(UP), *names]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"fixtures/services/up {' '.join(names)} failed:\n{proc.stderr[-3000:]}")
    return parse_exports(proc.stdout)
