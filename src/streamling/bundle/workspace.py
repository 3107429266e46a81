"""Where a target's deployments, checkpoints, run store and logs live (``workspace.root_path``).

```
<root_path>/
  deployments/<version>/deployment.json   the job definitions as deployed (immutable)
  deployments/<version>/pipelines/…       each notebook task's compiled pipeline YAML
  deployments/<version>/notebooks/…       the notebooks as deployed (snapshots)
  current                                  the live version number
  files/                                   the bundle's files as of the live version (workspace.file_path)
  state/                                   checkpoints and local state (state_dir of every task)
  runs.db                                  runs, attempts, requests, notifications
  logs/run-<id>/<task>-<attempt>.log       driver logs (+ .exit, .stats.json, and .swap / .deployment:
                                           the hot-redeploy handshake, see streamling.bundle.handover)
  runner.lock / runner.pid / runner.log    the job runner of this root
```
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from streamling.errors import StreamlingError


def local_root(root_path: str) -> Path:
    """The local folder of a root path; ``file:`` URIs are local too.

    Other schemes (``hdfs://``, ``s3a://``) are refused for now: the checkpoint metadata streamling
    keeps next to Spark's checkpoint is written with local file APIs.
    """
    parsed = urlparse(root_path)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else root_path).expanduser().resolve()
    raise StreamlingError(f"workspace.root_path '{root_path}' uses the '{parsed.scheme}' scheme; only local paths "
                          "and file: URIs are supported as a bundle root for now", code="bundle_root_unsupported",
                          hint="set workspace.root_path to a local folder (e.g. a mounted shared volume)")


class Workspace:
    """Paths and small records under one target root."""

    def __init__(self, root_path: str) -> None:
        self.root = local_root(root_path)

    @property
    def deployments(self) -> Path:
        return self.root / "deployments"

    @property
    def files(self) -> Path:
        return self.root / "files"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def store_path(self) -> Path:
        return self.root / "runs.db"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def runner_lock(self) -> Path:
        return self.root / "runner.lock"

    @property
    def runner_log(self) -> Path:
        return self.root / "runner.log"

    @property
    def deploy_lock(self) -> Path:
        return self.root / "deploy.lock"

    def current_version(self) -> int | None:
        try:
            return int((self.root / "current").read_text().strip())
        except (OSError, ValueError):
            return None

    def set_current(self, version: int) -> None:
        tmp = self.root / f"current.tmp.{os.getpid()}"
        tmp.write_text(f"{version}\n")
        tmp.replace(self.root / "current")

    def deployment_dir(self, version: int) -> Path:
        return self.deployments / str(version)

    def deployment(self, version: int | None = None) -> dict[str, Any] | None:
        """The deployment record of ``version`` (default: the live one), or None before the first deploy."""
        version = self.current_version() if version is None else version
        if version is None:
            return None
        path = self.deployment_dir(version) / "deployment.json"
        try:
            return dict(json.loads(path.read_text()))
        except OSError:
            return None

    def next_version(self) -> int:
        existing = [int(p.name) for p in self.deployments.glob("*") if p.name.isdigit()] if self.deployments.exists() \
            else []
        return max(existing, default=0) + 1

    def checkpoint_root(self, application_id: str) -> Path:
        return self.state_dir / application_id

    def has_checkpoint(self, application_id: str) -> bool:
        root = self.checkpoint_root(application_id)
        return root.exists() and any(root.glob("*/checkpoint/offsets"))
