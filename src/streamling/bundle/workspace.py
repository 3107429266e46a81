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

A root on shared storage, an object store (``root_path: s3a://bucket/prefix``) or HDFS
(``hdfs://namenode/path``, reached through WebHDFS), keeps what must outlive a host there
and the control plane on each host that works with it. The store holds ``current``, ``store.json``,
``deployments/<version>/`` (with the bundle's files as ``files/``: versions are immutable, so a host
that fetches one never sees half of the next), ``secrets/``, the finished attempts' ``logs/`` and,
through Spark, ``state/`` (checkpoints). Each host keeps a **mirror** of it, a local root of the layout
above (``$STREAMLING_MIRROR_DIR``, default ``~/.streamling/mirrors/<name>-<hash>``), with ``remote.json``
naming the store. Runners and drivers work on the mirror as on a local root: a runner fetches the live
version when ``current`` changes and a run's secrets before it starts a task, and uploads each
attempt's log when it ends. Neither store offers locks the CLI and runners can share, and an object
store has no appends or atomic renames, so what needs them lives elsewhere: runs, the runner's lease
and the deploy lock in the Postgres run store (which such a root requires), logs of running
attempts in the mirror.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from streamling import storage
from streamling.direct_storage import DIRECT_SCHEMES, DirectStorage, direct_conf, direct_storage
from streamling.errors import StreamlingError
from streamling.util import write_private

if TYPE_CHECKING:
    from streamling.bundle.model import Target
    from streamling.bundle.store import Store
    from streamling.config.sections import JobRunnerSettings

log = logging.getLogger(__name__)

#: where a host keeps its mirrors of object-store roots
MIRROR_DIR_ENV = "STREAMLING_MIRROR_DIR"
#: the file in a mirror naming its object-store root
REMOTE_LINK = "remote.json"


def local_root(root_path: str) -> Path:
    """The local folder of a local root path (``file:`` URIs are local too)."""
    parsed = urlparse(root_path)
    return Path(parsed.path if parsed.scheme else root_path).expanduser().resolve()


def root_problem(root_path: str, store: str) -> StreamlingError | None:
    """Why ``root_path`` cannot be a bundle root with run store ``store``, or None."""
    kind = storage.scheme(root_path)
    if kind in ("", "file"):
        return None
    if kind not in DIRECT_SCHEMES:
        return StreamlingError(
            f"workspace.root_path '{root_path}' uses the '{kind}' scheme; a bundle root is a local folder, a shared "
            "mount, an S3 bucket (s3a://) or HDFS (hdfs://): the bundle CLI and job runner reach it without Spark, "
            "and read only those that way", code="bundle_root_unsupported",
            hint=f"use s3a://bucket/prefix, hdfs://namenode/path or a folder mounted at the same path on every runner "
                 f"host, and keep "
                 f"checkpoints on {kind}:// with the target's config: {{state_dir: {root_path.rstrip('/')}/state}}")
    if store != "postgres":
        return StreamlingError(
            f"workspace.root_path '{root_path}' is on an object store, but the job runner would keep runs in runs.db "
            "(job_runner.store: sqlite), a file that needs a local disk: runs, the runner's lease and the deploy "
            "lock must live where every runner host reaches them", code="bundle_root_needs_shared_store",
            hint="set job_runner.store: postgres and job_runner.postgres.* in the target's config (see README, "
                 "Running on a cluster)")
    return None


def mirror_dir(uri: str) -> Path:
    """This host's working copy of the object-store root ``uri``."""
    base = os.environ.get(MIRROR_DIR_ENV) or str(Path.home() / ".streamling" / "mirrors")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", uri.split("://", 1)[-1]).strip("-")[-40:]
    return Path(base).expanduser().resolve() / f"{slug}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


class Workspace:
    """Paths and small records under one target root."""

    def __init__(self, root_path: str, spark_conf: Mapping[str, str] | None = None) -> None:
        """``root_path`` as the target names it (an ``s3a://`` root is reached with the ``fs.s3a.*``
        settings of ``spark_conf``), or a mirror's folder (runners and drivers are given those)."""
        self.uri: str | None = None
        self.remote: DirectStorage | None = None
        self._unreachable = False  #: the object store did not answer the last time
        if storage.is_local(root_path):
            self.root = local_root(root_path)
            try:
                link = json.loads((self.root / REMOTE_LINK).read_text())
            except (OSError, ValueError):
                return
            self.uri = str(link["uri"])
            self.remote = direct_storage(self.uri, dict(link.get("conf") or {}))
            return
        problem = root_problem(root_path, "postgres")
        if problem is not None:
            raise problem
        self.uri = root_path.rstrip("/")
        conf = direct_conf(spark_conf or {})
        self.remote = direct_storage(self.uri, conf)
        self.root = mirror_dir(self.uri)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the link holds the store's credentials, as ~/.aws/credentials does
        write_private(self.root / REMOTE_LINK, json.dumps({"uri": self.uri, "conf": conf}, indent=2))

    @classmethod
    def for_target(cls, target: Target) -> Workspace:
        """The root of ``target``, with its Spark settings (and ``STREAMLING__SPARK__CONF__…``) for an
        object-store root."""
        from streamling.config.settings import env_overrides

        conf = dict((target.config.get("spark") or {}).get("conf") or {})
        conf.update((env_overrides(os.environ).get("spark") or {}).get("conf") or {})
        return cls(target.root_path, conf)

    @property
    def where(self) -> str:
        """The root as users name it: its URI, or its folder."""
        return self.uri or str(self.root)

    def _remote(self, *parts: str) -> str:
        assert self.uri is not None
        return storage.join(self.uri, *parts)

    @property
    def deployments(self) -> Path:
        return self.root / "deployments"

    @property
    def files(self) -> Path:
        return self.root / "files"

    @property
    def state_dir(self) -> str:
        """Where tasks keep checkpoints by default: ``state/`` of the root (on the object store for a
        remote root: a driver on any host resumes them)."""
        return self._remote("state") if self.uri else str(self.root / "state")

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

        from streamling.config.sections import JobRunnerSettings
        from streamling.config.settings import deep_merge, env_overrides

        try:
            recorded = dict(json.loads(self.store_config.read_text()))
        except (OSError, ValueError):
            recorded = {}
            if self.remote is not None:  # a host new to the root
                try:
                    recorded = dict(json.loads(self.remote.read_text(self._remote("store.json"))))
                except FileNotFoundError:
                    pass
                else:
                    write_private(self.store_config, json.dumps(recorded, indent=2) + "\n")
        return JobRunnerSettings.model_validate(deep_merge(recorded, env_overrides(os.environ).get("job_runner", {})))

    def open_store(self) -> Store:
        from streamling.bundle.store_backends import open_store

        settings = self.store_settings()
        if self.uri and settings.store != "postgres":
            raise StreamlingError(f"nothing is deployed at {self.uri} (it names no run store)",
                                  code="bundle_not_deployed", hint="deploy the target first: streamling bundle deploy")
        return open_store(self.root, settings, settings.postgres.schema_name or "streamling_runs")

    def record_store(self, settings: JobRunnerSettings, schema: str) -> None:
        """Fix the root's run store at its first deploy; a later deploy that names another one is refused
        (runs, attempts and the runner's lease would be split over two stores)."""
        wanted: dict[str, Any] = {"store": settings.store, "lease_secs": settings.lease_secs}
        if settings.store == "postgres":
            wanted["postgres"] = {**settings.postgres.model_dump(by_alias=True, exclude={"pass_"}),
                                  "schema_name": settings.postgres.schema_name or schema}
        recorded: dict[str, Any] | None
        try:
            recorded = dict(json.loads(self.remote.read_text(self._remote("store.json")) if self.remote is not None
                                       else self.store_config.read_text()))
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
            if self.remote is not None:
                self.remote.write_text(self._remote("store.json"), json.dumps(wanted, indent=2) + "\n")
            write_private(self.store_config, json.dumps(wanted, indent=2) + "\n")

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

    def current_version(self, refresh: bool = True) -> int | None:
        """The live version; on an object-store root the store's, fetched into the mirror (with the
        bundle's files) when it changed — unless ``refresh`` is False: the mirror's, with no call to
        the store (the runner's loop, whose follower thread refreshes). An unreachable store leaves
        the mirror's (logged once per outage)."""
        local = self._local_current()
        if self.remote is None or not refresh:
            return local
        try:
            version = int(self.remote.read_text(self._remote("current")).strip())
        except FileNotFoundError:
            return local
        except (StreamlingError, ValueError) as exc:
            if not self._unreachable:  # once per outage: a runner asks every tick
                log.warning("cannot read the live version of %s (%s); going on with deployment %s", self.uri,
                            exc.headline() if isinstance(exc, StreamlingError) else exc, local)
            self._unreachable = True
            return local
        if self._unreachable:
            log.info("%s is reachable again", self.uri)
            self._unreachable = False
        if version != local:
            self._fetch(version)
            self._sync_files(version)
            self._set_local_current(version)
        return version

    def _local_current(self) -> int | None:
        try:
            return int((self.root / "current").read_text().strip())
        except (OSError, ValueError):
            return None

    def _set_local_current(self, version: int) -> None:
        tmp = self.root / f"current.tmp.{os.getpid()}"
        tmp.write_text(f"{version}\n")
        tmp.replace(self.root / "current")

    def set_current(self, version: int) -> None:
        """Make ``version`` live: on an object-store root, its upload is done, and writing ``current``
        there (one PUT) is what publishes it to every host."""
        if self.remote is not None:
            self.remote.write_text(self._remote("current"), f"{version}\n")
        self._set_local_current(version)

    def publish(self, version: int) -> None:
        """Upload deployment ``version`` (and the bundle's files as deployed) to the object store; a
        local root has nothing to do."""
        if self.remote is None:
            return
        folder = self.deployment_dir(version)
        record = json.loads((folder / "deployment.json").read_text())
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            self.remote.write_bytes(self._remote("deployments", str(version), *path.relative_to(folder).parts),
                                    path.read_bytes())
        for rel in record.get("files", []):
            self.remote.write_bytes(self._remote("deployments", str(version), "files", rel),
                                    (self.files / rel).read_bytes())

    def _fetch(self, version: int) -> None:
        """Fetch deployment ``version`` into the mirror once (versions never change); the record's
        paths become this host's."""
        assert self.remote is not None
        target = self.deployment_dir(version)
        if (target / "deployment.json").exists():
            return
        tmp = self.deployments / f".{version}.fetch.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        base = self._remote("deployments", str(version))
        for rel in self.remote.files(base):
            if rel.startswith("files/"):
                continue
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self.remote.read_bytes(storage.join(base, rel)))
        record = json.loads((tmp / "deployment.json").read_text())
        record.update(root_path=str(self.root), file_path=str(self.files))
        (tmp / "deployment.json").write_text(json.dumps(record, indent=2, default=str))
        try:
            tmp.rename(target)
        except OSError:  # another process of this host fetched it first
            shutil.rmtree(tmp, ignore_errors=True)

    def _sync_files(self, version: int) -> None:
        """The mirror's ``files/`` as of the live ``version`` (in place, as a deploy updates them)."""
        assert self.remote is not None
        record = self.deployment(version) or {}
        wanted = [str(f) for f in record.get("files", [])]
        for rel in wanted:
            data = self.remote.read_bytes(self._remote("deployments", str(version), "files", rel))
            dest = self.files / rel
            if dest.is_file() and dest.read_bytes() == data:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(dest)
        if self.files.exists():
            for path in [p for p in self.files.rglob("*") if p.is_file()]:
                if str(path.relative_to(self.files)) not in wanted:
                    path.unlink(missing_ok=True)

    def pull_secrets(self) -> None:
        """The object store's secret scopes into the mirror (before a task that may read them starts)."""
        if self.remote is None:
            return
        names = [n for n in self.remote.list_names(self._remote("secrets")) if n.endswith(".json")]
        for name in names:
            self.secrets.mkdir(parents=True, exist_ok=True)
            os.chmod(self.secrets, 0o700)
            write_private(self.secrets / name, self.remote.read_text(self._remote("secrets", name)))
        if self.secrets.is_dir():
            for gone in {p.name for p in self.secrets.glob("*.json")} - set(names):
                (self.secrets / gone).unlink(missing_ok=True)

    def push_secrets(self) -> None:
        """The mirror's secret scopes to the object store, after a change made here."""
        if self.remote is None:
            return
        local = {p.name: p for p in self.secrets.glob("*.json") if not p.name.startswith(".")} \
            if self.secrets.is_dir() else {}
        for name, path in local.items():
            self.remote.write_text(self._remote("secrets", name), path.read_text())
        for name in self.remote.list_names(self._remote("secrets")):
            if name.endswith(".json") and name not in local:
                self.remote.delete(self._remote("secrets", name))

    def push_log(self, log_path: Path) -> None:
        """An ended attempt's log (and its exit and figures) to the object store, where ``bundle logs``
        on any host finds it."""
        if self.remote is None:
            return
        for path in (log_path, Path(f"{log_path}.exit"), Path(f"{log_path}.stats.json")):
            if path.is_file():
                self.remote.write_bytes(self._remote(*self._log_key(path)), path.read_bytes())

    def read_log(self, log_path: str, suffix: str = "") -> str | None:
        """An attempt's log (``suffix``: ``.stats.json``, ``.exit``) from this host's disk, else from
        the object store; None when neither has it."""
        path = Path(f"{log_path}{suffix}")
        try:
            return path.read_text(errors="replace")
        except OSError:
            pass
        if self.remote is None:
            return None
        try:
            return self.remote.read_bytes(self._remote(*self._log_key(path))).decode(errors="replace")
        except (FileNotFoundError, StreamlingError):
            return None

    @staticmethod
    def _log_key(path: Path) -> tuple[str, ...]:
        """``logs/run-<id>/<file>``: the same key whichever host's mirror wrote it."""
        return ("logs", path.parent.name, path.name)

    def destroy(self) -> None:
        """Delete the root: the object store's copy too."""
        if self.remote is not None:
            assert self.uri is not None
            self.remote.delete(self.uri)
        shutil.rmtree(self.root, ignore_errors=True)

    def deployment_dir(self, version: int) -> Path:
        return self.deployments / str(version)

    def deployment(self, version: int | None = None) -> dict[str, Any] | None:
        """The deployment record of ``version`` (default: the live one), or None before the first deploy."""
        version = self.current_version() if version is None else version
        if version is None:
            return None
        path = self.deployment_dir(version) / "deployment.json"
        if self.remote is not None and not path.exists():
            self._fetch(version)
        try:
            return dict(json.loads(path.read_text()))
        except OSError:
            return None

    def next_version(self) -> int:
        existing = [int(p.name) for p in self.deployments.glob("*") if p.name.isdigit()] if self.deployments.exists() \
            else []
        if self.remote is not None:
            existing += [int(n) for n in self.remote.list_names(self._remote("deployments")) if n.isdigit()]
        return max(existing, default=0) + 1

    def checkpoint_root(self, application_id: str) -> Path:
        return self.root / "state" / application_id

    def has_checkpoint(self, application_id: str, state_dir: str | None = None, job_key: str = "",
                       task_key: str = "") -> bool:
        """Whether the task may have a checkpoint to resume. Under the root (or another local
        ``state_dir``) the folders say; on shared storage (``config.state_dir: hdfs://…``), which a
        deploy cannot list without a JVM, or relative to where the driver runs, any attempt the run
        store recorded for the task counts."""
        if state_dir and (not storage.is_local(state_dir) or not storage.local_path(state_dir).is_absolute()):
            store = self.open_store()
            try:
                return store.task_ran(job_key, task_key)
            finally:
                store.close()
        if self.uri and not state_dir:
            return self.has_checkpoint(application_id, self.state_dir, job_key, task_key)
        root = Path(storage.local_path(state_dir)) / application_id if state_dir else self.checkpoint_root(
            application_id)
        return root.exists() and any(root.glob("*/checkpoint/offsets"))


def _store_name(recorded: dict[str, Any]) -> str:
    if recorded.get("store") == "postgres":
        pg = recorded.get("postgres") or {}
        return (f"Postgres postgres://{pg.get('user')}@{pg.get('host')}:{pg.get('port')}/{pg.get('db')} "
                f"(schema {pg.get('schema_name')})")
    return "runs.db (SQLite)"



def default_state_backend(state_dir: str, master: str, store: JobRunnerSettings) -> dict[str, Any]:
    """A bundle task's ``state_backend`` where its settings name none: one that keeps positions, so a
    job resumes its checkpoint after a retry, a failover or a redeploy that restarts its driver, as a
    Databricks job resumes its ``checkpointLocation`` (the embedded ``InMemory`` starts every driver
    over). SQLite next to the checkpoints on one host; the run store's Postgres where the state
    directory or the executors are on other hosts; nothing (``InMemory``, warned at deploy) without it."""
    if storage.is_local(state_dir) and not storage.is_multi_host(master):
        return {"backend_type": "Sqlite", "sqlite": {"database_path": storage.join(state_dir, "state.db")}}
    if store.store == "postgres":
        pg = store.postgres
        return {"backend_type": "Postgres",
                "postgres": {"host": pg.host, "port": pg.port, "db": pg.db, "user": pg.user, "password": pg.pass_,
                             "sslmode": pg.sslmode, "state_schema_name": pg.schema_name or "streamling_runs"}}
    return {}
