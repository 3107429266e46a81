"""Where a target's deployments, checkpoints, run store and logs live (``workspace.root_path``).

```
<root_path>/
  deployments/<version>/deployment.json   the job definitions as deployed (immutable)
  deployments/<version>/pipelines/…       each notebook task's compiled pipeline YAML
  deployments/<version>/notebooks/…       the notebooks as deployed (snapshots)
  current                                  the live version number
  files/                                   the bundle's files as of the live version (workspace.file_path)
  state/                                   checkpoints and local state (state_dir of every task)
  runs.db                                  runs, attempts, requests, notifications (job_runner.store: sqlite)
  store.json                               which run store the root uses (fixed by its first deploy)
  logs/run-<id>/<task>-<attempt>.log       driver logs (+ .exit, .stats.json, and .swap / .deployment:
                                           the hot-redeploy handshake, see streamling.bundle.handover)
  runner.lock / runner.pid / runner.log    the job runner of this root
  secrets/<scope>.json                     secret scopes (0700 folder, 0600 files; see streamling.secrets)
```
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from streamling.errors import StreamlingError

if TYPE_CHECKING:
    from streamling.bundle.store import Store
    from streamling.config.settings import JobRunnerSettings


def local_root(root_path: str) -> Path:
    """The local folder of a root path; ``file:`` URIs are local too.

    The root is the runners' control-plane folder: ``bundle deploy`` serialises on a lock in it,
    publishes a version by renaming ``current``, drivers append their logs and answer redeploys through
    small files in it. Those need a POSIX file system, which object stores and HDFS are not (no
    locks, no appends on S3, no atomic rename on S3). On several hosts the root is a shared mount at
    the same path on each (NFS, EFS, Azure Files …); what jobs write (checkpoints, Delta tables) goes to
    any Hadoop URI through ``config.state_dir`` and the sinks' paths.
    """
    parsed = urlparse(root_path)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else root_path).expanduser().resolve()
    raise StreamlingError(
        f"workspace.root_path '{root_path}' uses the '{parsed.scheme}' scheme, but the bundle root must be a folder "
        "with POSIX semantics (deploys lock it, publish versions by atomic rename and append run logs to it)",
        code="bundle_root_unsupported",
        hint=f"keep the root on a local folder or a shared mount present at the same path on every runner host, "
             f"and put checkpoints on {parsed.scheme}:// with the target's config: {{state_dir: {root_path.rstrip('/')}"
             "/state}")


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
    def store_config(self) -> Path:
        return self.root / "store.json"

    def store_settings(self) -> JobRunnerSettings:
        """The run store this root's first deploy chose, with this process's ``STREAMLING__JOB_RUNNER__…``
        variables over it (a password kept out of the file, for instance)."""
        import os

        from streamling.config.settings import JobRunnerSettings, deep_merge, env_overrides

        try:
            recorded = dict(json.loads(self.store_config.read_text()))
        except (OSError, ValueError):
            recorded = {}
        return JobRunnerSettings.model_validate(deep_merge(recorded, env_overrides(os.environ).get("job_runner", {})))

    def open_store(self) -> Store:
        from streamling.bundle.store import open_store

        settings = self.store_settings()
        return open_store(self.root, settings, settings.postgres.schema_name or "streamling_runs")

    def record_store(self, settings: JobRunnerSettings, schema: str) -> None:
        """Fix the root's run store at its first deploy; a later deploy that names another one is refused
        (runs, attempts and the runner's lease would be split over two stores)."""
        wanted: dict[str, Any] = {"store": settings.store, "lease_secs": settings.lease_secs}
        if settings.store == "postgres":
            wanted["postgres"] = {**settings.postgres.model_dump(by_alias=True, exclude={"pass_"}),
                                  "schema_name": settings.postgres.schema_name or schema}
        try:
            recorded = dict(json.loads(self.store_config.read_text()))
        except (OSError, ValueError):
            recorded = None
        if recorded is None and self.deployments.exists() and settings.store != "sqlite":
            recorded = {"store": "sqlite"}  # deployed before store.json existed: its runs are in runs.db
        where = {k: v for k, v in wanted.items() if k != "lease_secs"}
        if recorded is not None and {k: v for k, v in recorded.items() if k != "lease_secs"} != where:
            raise StreamlingError(
                f"the target root {self.root} keeps its runs in {_store_name(recorded)}; the target now names "
                f"{_store_name(wanted)}", code="bundle_store_changed",
                hint="keep job_runner.* as it was, or `streamling bundle destroy` the target first (its runs and "
                     "checkpoints go with it)")
        if recorded != wanted:
            tmp = self.root / f"store.json.tmp.{os.getpid()}"
            tmp.write_text(json.dumps(wanted, indent=2) + "\n")
            tmp.chmod(0o600)
            tmp.replace(self.store_config)

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def secrets(self) -> Path:
        return self.root / "secrets"

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

    def has_checkpoint(self, application_id: str, state_dir: str | None = None, job_key: str = "",
                       task_key: str = "") -> bool:
        """Whether the task may have a checkpoint to resume. Under the root (or another local
        ``state_dir``) the folders say; on shared storage (``config.state_dir: hdfs://…``), which a
        deploy cannot list without a JVM, or relative to where the driver runs, any attempt the run
        store recorded for the task counts."""
        from streamling import storage

        if state_dir and (not storage.is_local(state_dir) or not storage.local_path(state_dir).is_absolute()):
            store = self.open_store()
            try:
                return store.task_ran(job_key, task_key)
            finally:
                store.close()
        root = Path(storage.local_path(state_dir)) / application_id if state_dir else self.checkpoint_root(
            application_id)
        return root.exists() and any(root.glob("*/checkpoint/offsets"))


def _store_name(recorded: dict[str, Any]) -> str:
    if recorded.get("store") == "postgres":
        pg = recorded.get("postgres") or {}
        return (f"Postgres postgres://{pg.get('user')}@{pg.get('host')}:{pg.get('port')}/{pg.get('db')} "
                f"(schema {pg.get('schema_name')})")
    return "runs.db (SQLite)"
