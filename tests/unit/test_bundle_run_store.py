"""Which run store a bundle root uses: fixed by its first deploy, never split over two stores, and a
target that spans hosts while keeping its runs on one host's disk is told so at validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamling.bundle.loading import load_bundle
from streamling.bundle.workspace import Workspace
from streamling.config.sections import JobRunnerSettings
from streamling.errors import StreamlingError

POSTGRES = JobRunnerSettings.model_validate({"store": "postgres", "postgres": {"host": "pg.internal", "user": "u",
                                                                             "pass": "secret-pw", "db": "ops"}})


def test_the_first_deploy_fixes_the_store_and_keeps_the_password_out_of_the_root(tmp_path: Path) -> None:
    ws = Workspace(str(tmp_path))
    ws.record_store(POSTGRES, "streamling_runs_b_prod")
    recorded = json.loads(ws.store_config.read_text())
    assert recorded["store"] == "postgres" and recorded["postgres"]["schema_name"] == "streamling_runs_b_prod"
    assert "secret-pw" not in ws.store_config.read_text() and ws.store_config.stat().st_mode & 0o077 == 0
    settings = ws.store_settings()
    assert (settings.store, settings.postgres.host, settings.postgres.pass_) == ("postgres", "pg.internal", None)
    ws.record_store(POSTGRES.model_copy(update={"lease_secs": 30}), "streamling_runs_b_prod")  # lease may change
    assert ws.store_settings().lease_secs == 30


def test_a_deploy_naming_another_store_is_refused(tmp_path: Path) -> None:
    ws = Workspace(str(tmp_path))
    ws.record_store(JobRunnerSettings(), "unused")
    with pytest.raises(StreamlingError) as info:
        ws.record_store(POSTGRES, "streamling_runs_b_prod")
    assert info.value.code == "bundle_store_changed"
    assert "runs.db (SQLite)" in info.value.message and "postgres://u@pg.internal:5432/ops" in info.value.message
    assert "destroy" in (info.value.hint or "")


def test_a_root_deployed_before_the_store_was_recorded_keeps_its_runs_db(tmp_path: Path) -> None:
    ws = Workspace(str(tmp_path))
    ws.deployments.mkdir()  # an earlier release's deployments, and its runs in runs.db
    with pytest.raises(StreamlingError, match="keeps its runs in runs.db"):
        ws.record_store(POSTGRES, "streamling_runs_b_prod")


def test_the_password_comes_from_the_environment_of_each_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = Workspace(str(tmp_path))
    ws.record_store(POSTGRES, "s")
    monkeypatch.setenv("STREAMLING__JOB_RUNNER__POSTGRES__PASS", "from-env")
    assert ws.store_settings().postgres.pass_ == "from-env"


@pytest.mark.parametrize(("master", "store", "warned"), [
    ("spark://10.0.0.5:7077", None, True), ("spark://10.0.0.5:7077", "postgres", False),
    ("spark://127.0.0.1:7077", None, False), ("local[2]", None, False)])
def test_validate_warns_when_a_multi_host_target_keeps_runs_on_one_host(
        tmp_path: Path, master: str, store: str | None, warned: bool) -> None:
    runner = f", job_runner: {{store: {store}}}" if store else ""
    (tmp_path / "bundle.yml").write_text(f"bundle: {{name: b}}\ntargets:\n  t:\n    default: true\n"
                                         f"    config: {{spark: {{master: '{master}'}}{runner}}}\n")
    bundle = load_bundle(tmp_path, None, variables={}, environ={}, user="alice")
    hits = [w for w in bundle.warnings if "job_runner.store: postgres" in w]
    assert bool(hits) == warned, bundle.warnings


def test_a_checkpoint_on_shared_storage_counts_once_the_task_ran(tmp_path: Path) -> None:
    ws = Workspace(str(tmp_path))
    remote = "hdfs://nn:8020/streamling/state"
    assert not ws.has_checkpoint("app", remote, "job", "task")
    store = ws.open_store()
    run_id = store.create_run("job", 1, "manual", {}, ["task"])
    store.start_attempt(run_id, "task", 1, 1, str(tmp_path / "t.log"), "host-a")
    store.close()
    assert ws.has_checkpoint("app", remote, "job", "task")
    assert not ws.has_checkpoint("app", remote, "job", "other")
    local = tmp_path / "elsewhere"
    (local / "app" / "flow" / "checkpoint" / "offsets").mkdir(parents=True)
    assert ws.has_checkpoint("app", str(local)) and not ws.has_checkpoint("app")
