"""What a restart reads follows the state backend, as Streamling documents: ``InMemory`` starts every
process over from the sources' configured start; ``Sqlite`` and ``Postgres`` resume. A bundle task
gets a backend that resumes unless its settings choose one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamling import storage
from streamling.bundle.workspace import default_state_backend
from streamling.config import load_settings
from streamling.config.sections import JobRunnerSettings
from streamling.config.settings import DEPLOYMENT_DEFAULTS_ENV
from streamling.errors import StreamlingError
from streamling.runtime import checkpoints
from streamling.state import InMemoryStateBackend, SqliteStateBackend, is_durable

ROOT = Path(__file__).resolve().parents[2]


def _place(base: Path, state: object) -> checkpoints.Placement:
    return checkpoints.place(str(base), state, storage.LocalStorage())  # type: ignore[arg-type]


def test_a_durable_backend_resumes_the_flows_own_folder(tmp_path: Path) -> None:
    state = SqliteStateBackend(tmp_path / "state.db", "app")
    try:
        placed = _place(tmp_path / "app" / "main", state)
    finally:
        state.close()
    assert placed == checkpoints.Placement(str(tmp_path / "app" / "main"), True, "Sqlite")


def test_in_memory_gives_each_process_its_own_checkpoint_and_one_process_resumes_it(tmp_path: Path) -> None:
    base = tmp_path / "app" / "main"
    state = InMemoryStateBackend("restart-semantics", shared=False)
    first = _place(base, state)
    assert not first.durable and first.backend == "InMemory"
    assert Path(first.root).parent == base and Path(first.root).name.startswith(checkpoints.PROCESS_PREFIX)
    owner = json.loads((Path(first.root) / checkpoints.OWNER_FILE).read_text())
    assert owner["pid"] == os.getpid()
    # The same process (a notebook's next run, a warm driver's redeploy) resumes it ...
    assert _place(base, state).root == first.root
    # ... other flows of the application get theirs ...
    assert Path(_place(tmp_path / "app" / "other", state).root).parent == tmp_path / "app" / "other"
    # ... and once the backend forgets (a new process, `%streamling reset`), a run starts over.
    state.clear()
    assert _place(base, state).root != first.root


def test_a_checkpoint_left_by_a_killed_process_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    base = tmp_path / "app" / "main"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    host = checkpoints._host()
    folders = {"process-dead": {"host": host, "pid": int(dead.stdout), "started": 1},
               "process-live": {"host": host, "pid": os.getpid(), "started": checkpoints._start_ticks(os.getpid())},
               "process-elsewhere": {"host": "another-host|pid:[1]", "pid": int(dead.stdout), "started": 1}}
    for name, owner in folders.items():
        (base / name / "checkpoint" / "offsets").mkdir(parents=True)
        (base / name / checkpoints.OWNER_FILE).write_text(json.dumps(owner))
    (base / "process-starting").mkdir()  # no owner file yet: another process is creating it
    placed = _place(base, InMemoryStateBackend("restart-semantics-2", shared=False))
    left = sorted(p.name for p in base.iterdir())
    assert left == sorted(["process-live", "process-elsewhere", "process-starting", Path(placed.root).name])


def test_a_bundle_task_resumes_by_default_with_sqlite_on_one_host_and_the_run_stores_postgres_beyond(
        tmp_path: Path) -> None:
    sqlite_store = JobRunnerSettings()
    postgres_store = JobRunnerSettings.model_validate(
        {"store": "postgres", "postgres": {"host": "db", "port": 5433, "user": "u", "pass": "pw", "db": "runs",
                                           "sslmode": "disable", "schema_name": "runs_x"}})
    local = str(tmp_path / "state")
    assert default_state_backend(local, "local[2]", sqlite_store) == {
        "backend_type": "Sqlite", "sqlite": {"database_path": str(tmp_path / "state" / "state.db")}}
    assert default_state_backend(local, "spark://127.0.0.1:7077", sqlite_store)["backend_type"] == "Sqlite"
    # several hosts, or checkpoints on shared storage: a file on one disk would not do
    for state_dir, master in ((local, "spark://10.0.0.5:7077"), ("s3a://bucket/root/state", "local[2]")):
        assert default_state_backend(state_dir, master, postgres_store) == {
            "backend_type": "Postgres", "postgres": {"host": "db", "port": 5433, "db": "runs", "user": "u",
                                                     "password": "pw", "sslmode": "disable",
                                                     "state_schema_name": "runs_x"}}
        assert default_state_backend(state_dir, master, sqlite_store) == {}


def test_deployment_defaults_sit_under_the_config_file_and_the_environment(tmp_path: Path) -> None:
    defaults = {DEPLOYMENT_DEFAULTS_ENV: json.dumps({"state_backend": {"backend_type": "Sqlite"}})}
    assert not is_durable(load_settings(environ={}, cwd=tmp_path))  # Streamling's default: InMemory
    assert load_settings(environ=defaults, cwd=tmp_path).state_backend.backend_type == "Sqlite"
    chosen = {**defaults, "STREAMLING__STATE_BACKEND__BACKEND_TYPE": "InMemory"}
    assert load_settings(environ=chosen, cwd=tmp_path).state_backend.backend_type == "InMemory"
    (tmp_path / "config.yaml").write_text("state_backend: {backend_type: Postgres}\n")
    assert load_settings(environ=defaults, cwd=tmp_path).state_backend.backend_type == "Postgres"
    with pytest.raises(StreamlingError, match=f"{DEPLOYMENT_DEFAULTS_ENV} is not a JSON object"):
        load_settings(environ={DEPLOYMENT_DEFAULTS_ENV: "[1]"}, cwd=tmp_path)


@pytest.mark.parametrize(("config", "warned"), [
    ("{}", False),  # SQLite next to the checkpoints
    ("{state_backend: {backend_type: InMemory}}", True),  # chosen: said, not overridden
    ("{spark: {master: 'spark://10.0.0.5:7077'}}", True),  # several hosts and runs on one: nothing durable at hand
    ("{spark: {master: 'spark://10.0.0.5:7077'}, job_runner: {store: postgres}}", False)])
def test_a_continuous_task_that_would_start_over_on_each_driver_start_is_warned(
        tmp_path: Path, config: str, warned: bool) -> None:
    from streamling.bundle.deploy import build
    from streamling.bundle.loading import load_bundle

    shutil.copy(ROOT / "fixtures" / "notebooks" / "orders_job.ipynb", tmp_path / "job.ipynb")
    (tmp_path / "bundle.yml").write_text(f"""
bundle: {{name: b}}
workspace: {{root_path: {tmp_path / "root"}}}
resources:
  jobs:
    live:
      continuous: {{}}
      tasks: [{{task_key: t, notebook_task: {{notebook_path: ./job.ipynb}}}}]
    nightly:
      tasks: [{{task_key: t, notebook_task: {{notebook_path: ./job.ipynb}}}}]
targets:
  t: {{default: true, config: {config}}}
""")
    bundle = load_bundle(tmp_path, None, variables={}, environ={}, user="alice")
    build(bundle)
    hits = [w for w in bundle.warnings if "keeps no position between driver starts" in w]
    assert len(hits) == int(warned), bundle.warnings
    if warned:
        assert hits[0].startswith("task 't' of continuous job 'live': state_backend InMemory")
