"""Bundle model: what a user sees for each invalid bundle, and what a valid one resolves to.

Each ``fixtures/bundles/invalid/<case>/`` holds a ``bundle.yml`` (plus what it includes or points at), an
``expected.txt`` with one problem headline per line in the order they are reported, and optionally a
``target.txt`` naming the target passed as an argument. The expected files are written by hand: a changed
message must be read by a person before the golden file follows it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamling.bundle.loading import load_bundle
from streamling.bundle.model import Bundle, find_bundle_root
from streamling.errors import StreamlingError, ValidationError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "bundles"
VALID = FIXTURES / "valid"
INVALID = sorted(p for p in (FIXTURES / "invalid").iterdir() if p.is_dir())


def _load(root: Path = VALID, target: str | None = None, variables: dict[str, str] | None = None,
          environ: dict[str, str] | None = None) -> Bundle:
    """Loads with a fixed user and no BUNDLE_VAR_ environment, so results do not depend on the machine."""
    return load_bundle(root, target, variables=variables, environ=environ or {}, user="alice")


def _headlines(case: Path) -> list[str]:
    target_file = case / "target.txt"
    target = target_file.read_text().strip() if target_file.is_file() else None
    with pytest.raises(ValidationError) as info:
        _load(case, target)
    return [p.headline() for p in info.value.problems]


def test_every_invalid_case_has_expected_messages() -> None:
    assert len(INVALID) >= 13
    for case in INVALID:
        assert (case / "bundle.yml").is_file(), case
        assert (case / "expected.txt").is_file(), case


@pytest.mark.parametrize("case", INVALID, ids=lambda p: p.name)
def test_invalid_bundle_messages(case: Path) -> None:
    expected = (case / "expected.txt").read_text(encoding="utf-8").splitlines()
    assert _headlines(case) == expected


@pytest.mark.parametrize("case", INVALID, ids=lambda p: p.name)
def test_invalid_bundle_problems_are_located_user_errors(case: Path) -> None:
    target_file = case / "target.txt"
    with pytest.raises(ValidationError) as info:
        _load(case, target_file.read_text().strip() if target_file.is_file() else None)
    assert info.value.user and info.value.message.startswith("bundle is invalid")
    for problem in info.value.problems:
        assert problem.user and problem.location is not None and problem.location.line, problem.headline()


def test_valid_bundle_development_target() -> None:
    bundle = _load()
    assert (bundle.name, bundle.target.name, bundle.target.mode, bundle.user) == ("orders", "local", "development",
                                                                                  "alice")
    assert bundle.root == VALID and bundle.files == [VALID / "bundle.yml", VALID / "resources" / "report.yml"]
    assert not bundle.target.root_path_explicit
    assert bundle.target.root_path == str(Path.home() / ".streamling" / "bundle" / "orders" / "local")
    assert bundle.target.file_path == bundle.target.root_path + "/files"
    # Top-level config under the target's, references resolved.
    assert bundle.target.config == {"spark": {"shuffle_partitions": 4, "master": "local[2]"},
                                    "application_id": "orders_local"}
    assert bundle.variables == {"application_id": "orders_local", "retries": "2", "brokers": "127.0.0.1:9092"}

    ingest, report = bundle.jobs["ingest"], bundle.jobs["report"]
    # Development: prefixed names, a dev tag, everything paused, four concurrent runs.
    assert ingest.name == "[dev alice] orders-ingest" and report.name == "[dev alice] report"
    assert ingest.tags == {"dev": "alice"} and report.tags == {"team": "data", "dev": "alice"}
    assert ingest.continuous == "PAUSED"
    assert report.schedule is not None and report.schedule.pause_status == "PAUSED"
    assert report.schedule.quartz_cron_expression == "0 0 6 * * ?" and report.schedule.timezone_id == "Europe/Paris"
    assert ingest.max_concurrent_runs == report.max_concurrent_runs == 4
    assert ingest.parameters == {"brokers": "127.0.0.1:9092"}
    assert report.email_notifications == {"on_failure": ["oncall@example.com"]}
    assert report.webhook_notifications == {"on_success": ["http://127.0.0.1:8080/hooks/report"]}
    assert ingest.source == "bundle.yml:28" and report.source == "resources/report.yml:4"

    (task,) = ingest.tasks
    assert task.kind == "notebook" and task.notebook_path == VALID / "notebooks" / "ingest.ipynb"
    assert task.base_parameters == {"application_id": "orders_local", "owner": "alice"}
    assert task.max_retries == 2 and task.source == "bundle.yml:35"  # "${var.retries}" became an int

    aggregate, publish, cleanup = report.tasks
    assert [t.depends_on for t in report.tasks] == [[], ["aggregate"], ["publish"]]
    assert publish.kind == "spark_python" and publish.python_file == VALID / "scripts" / "publish.py"
    assert publish.parameters == ["--job", "report", "--out", f"{bundle.target.file_path}/out"]
    assert cleanup.kind == "python_wheel" and (cleanup.package_name, cleanup.entry_point) == ("streamling",
                                                                                             "streamling")
    assert cleanup.parameters == [f"--validate={bundle.target.root_path}/pipeline.yaml"]


def test_notebook_path_is_relative_to_the_file_that_declares_it() -> None:
    """resources/report.yml says ../notebooks/aggregate (no extension): a source .py notebook at the root."""
    aggregate = _load().jobs["report"].tasks[0]
    assert aggregate.notebook_path == VALID / "notebooks" / "aggregate.py"
    assert aggregate.source == "resources/report.yml:16"


def test_production_target_unpauses_and_overlays_resources() -> None:
    bundle = _load(target="prod")
    assert bundle.target.mode == "production" and bundle.target.root_path_explicit
    assert bundle.target.root_path == "/srv/streamling/orders"
    assert bundle.target.file_path == "/srv/streamling/orders/files"
    assert bundle.target.config["spark"] == {"shuffle_partitions": 4, "master": "spark://127.0.0.1:7077"}
    ingest, report = bundle.jobs["ingest"], bundle.jobs["report"]
    assert ingest.name == "orders-ingest" and ingest.tags == {} and report.tags == {"team": "data"}
    assert ingest.continuous == "UNPAUSED" and report.schedule is not None
    assert report.schedule.pause_status == "UNPAUSED"
    assert ingest.max_concurrent_runs == 1
    # targets.prod.resources merged the task by task_key: the timeout is added, the notebook kept.
    (task,) = ingest.tasks
    assert task.timeout_seconds == 3600 and task.notebook_path == VALID / "notebooks" / "ingest.ipynb"
    assert task.max_retries == -1 and bundle.variables["retries"] == "-1"


def test_variable_precedence() -> None:
    """--var > BUNDLE_VAR_<name> > targets.<t>.variables > default."""
    assert _load().variables["brokers"] == "127.0.0.1:9092"  # target
    assert _load(target="prod").variables["retries"] == "-1"  # target over default
    env = {"BUNDLE_VAR_brokers": "env:9092", "BUNDLE_VAR_retries": "5"}
    assert _load(environ=env).variables == {"application_id": "orders_local", "retries": "5", "brokers": "env:9092"}
    both = _load(environ=env, variables={"brokers": "cli:9092"})
    assert both.variables["brokers"] == "cli:9092" and both.variables["retries"] == "5"
    assert both.jobs["ingest"].parameters == {"brokers": "cli:9092"}
    assert both.jobs["ingest"].tasks[0].max_retries == 5


def test_undeclared_cli_variable_is_an_error() -> None:
    with pytest.raises(ValidationError) as info:
        _load(variables={"brokerz": "x"})
    (problem,) = info.value.problems
    assert problem.headline() == ("--var sets variable 'brokerz', which is not declared (did you mean 'brokers'?) "
                                  "[--var brokerz] — declare it under variables: in the bundle, or drop --var")


def test_include_merges_files_into_one_tree() -> None:
    bundle = _load()
    assert list(bundle.jobs) == ["ingest", "report"]
    assert [t.key for t in bundle.jobs["report"].tasks] == ["aggregate", "publish", "cleanup"]


def test_keys_with_no_effect_are_warnings() -> None:
    bundle = _load()
    assert bundle.warnings == [
        "bundle.yml:17: 'permissions' has no effect here: it configures a Databricks workspace, and there is none",
        "resources/report.yml:37: 'num_workers' has no effect here: a cluster's size and runtime come from the "
        "target's Spark master",
    ]
    # a job cluster's Spark settings apply to the task that names it
    assert bundle.jobs["report"].tasks[0].spark_conf == {"spark.sql.shuffle.partitions": "8"}
    # libraries install into the task's own environment at deploy: paths relative to their YAML file
    assert bundle.jobs["ingest"].tasks[0].libraries == [str(VALID / "dist" / "*.whl")]


def test_to_json_round_trips_through_json() -> None:
    data = _load(target="prod").to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["target"]["root_path"] == "/srv/streamling/orders"
    assert data["jobs"]["ingest"]["tasks"][0]["notebook_path"] == str(VALID / "notebooks" / "ingest.ipynb")
    assert data["files"] == [str(VALID / "bundle.yml"), str(VALID / "resources" / "report.yml")]


def test_find_bundle_root_walks_up() -> None:
    assert find_bundle_root(VALID / "resources") == VALID
    assert find_bundle_root(VALID / "notebooks" / "ingest.ipynb") == VALID
    with pytest.raises(StreamlingError) as info:
        find_bundle_root(Path("/"))
    assert info.value.code == "bundle_missing"


def test_target_choice(tmp_path: Path) -> None:
    (tmp_path / "bundle.yml").write_text("bundle: {name: b}\ntargets:\n  a: {}\n  b: {}\n")
    with pytest.raises(ValidationError) as info:
        _load(tmp_path)
    assert [p.code for p in info.value.problems] == ["bundle_no_target"]
    assert _load(tmp_path, "b").target.name == "b"
    (tmp_path / "bundle.yml").write_text("bundle: {name: b}\n")
    bare = _load(tmp_path)
    assert (bare.target.name, bare.target.mode, bare.jobs) == ("default", None, {})


def test_a_relative_root_path_is_anchored_at_the_bundle_root(tmp_path: Path) -> None:
    (tmp_path / "bundle.yml").write_text("bundle: {name: b}\nworkspace: {root_path: ./deploy}\n"
                                         "targets:\n  uri:\n    workspace: {root_path: 's3a://bucket/${bundle.name}'}\n"
                                         "  shared:\n    workspace: {root_path: 's3a://bucket/${bundle.name}'}\n"
                                         "    config: {job_runner: {store: postgres}}\n"
                                         "  hdfs:\n    workspace: {root_path: 'hdfs://nn:8020/b'}\n"
                                         "    config: {job_runner: {store: postgres}}\n"
                                         "  gcs:\n    workspace: {root_path: 'gs://bucket/b'}\n"
                                         "    config: {job_runner: {store: postgres}}\n"
                                         "  local: {default: true}\n")
    assert _load(tmp_path).target.root_path == str(tmp_path / "deploy")
    # An S3 root keeps runs, the lease and the deploy lock in the Postgres store: SQLite needs a disk.
    with pytest.raises(ValidationError) as info:
        _load(tmp_path, "uri")
    [problem] = info.value.problems
    assert problem.code == "bundle_root_needs_shared_store" and "job_runner.store: postgres" in (problem.hint or "")
    assert _load(tmp_path, "shared").target.root_path == "s3a://bucket/b"
    # The CLI and runner reach a root without Spark: S3, and HDFS through WebHDFS. Other stores hold
    # checkpoints through Spark only.
    assert _load(tmp_path, "hdfs").target.root_path == "hdfs://nn:8020/b"
    with pytest.raises(ValidationError) as info:
        _load(tmp_path, "gcs")
    [problem] = info.value.problems
    assert problem.code == "bundle_root_unsupported" and "'gs' scheme" in problem.message
    assert "state_dir: gs://bucket/b/state" in (problem.hint or "")


def test_development_pauses_only_what_is_unset(tmp_path: Path) -> None:
    (tmp_path / "bundle.yml").write_text("""\
bundle: {name: b}
resources:
  jobs:
    hourly:
      trigger: {periodic: {interval: 1, unit: HOURS}}
      tasks: [{task_key: t, python_wheel_task: {package_name: streamling, entry_point: streamling}}]
    live:
      continuous: {pause_status: UNPAUSED}
      max_concurrent_runs: 2
      tasks: [{task_key: t, python_wheel_task: {package_name: streamling, entry_point: streamling}}]
targets:
  dev: {mode: development, default: true}
  plain: {}
""")
    dev = _load(tmp_path)
    assert dev.jobs["hourly"].periodic is not None and dev.jobs["hourly"].periodic.pause_status == "PAUSED"
    assert dev.jobs["live"].continuous == "UNPAUSED" and dev.jobs["live"].max_concurrent_runs == 2
    assert dev.jobs["live"].name == "[dev alice] live"
    plain = _load(tmp_path, "plain")
    assert plain.jobs["hourly"].periodic is not None and plain.jobs["hourly"].periodic.pause_status == "UNPAUSED"
    assert plain.jobs["hourly"].name == "hourly" and plain.jobs["hourly"].max_concurrent_runs == 1


def test_references_in_keys_with_no_effect_are_left_alone(tmp_path: Path) -> None:
    """Databricks resolves ${...} in settings of its own workspace; an unknown one there must not fail a local
    bundle. Artifacts and libraries take effect here, so theirs must resolve."""
    (tmp_path / "bundle.yml").write_text("""\
bundle: {name: b}
permissions: [{user_name: "${workspace.current_user.userName}", level: "${var.nowhere}"}]
artifacts: {wheel: {path: "${var.nowhere}"}}
resources:
  jobs:
    j:
      job_clusters: [{job_cluster_key: c, new_cluster: {spark_version: "${var.nowhere}"}}]
      tasks:
        - task_key: t
          python_wheel_task: {package_name: streamling, entry_point: streamling}
""")
    with pytest.raises(ValidationError) as info:
        _load(tmp_path)
    assert [p.headline().split(" [")[0] for p in info.value.problems] == [
        "unknown reference '${var.nowhere}'", "artifact 'wheel': folder ${var.nowhere} does not exist"]
    (tmp_path / "bundle.yml").write_text((tmp_path / "bundle.yml").read_text().replace(
        'artifacts: {wheel: {path: "${var.nowhere}"}}\n', ""))
    assert [w.split(": ", 1)[1] for w in _load(tmp_path).warnings] == [
        "'permissions' has no effect here: it configures a Databricks workspace, and there is none",
        "'spark_version' has no effect here: a cluster's size and runtime come from the target's Spark master"]


def test_loading_a_bundle_does_not_import_pyspark() -> None:
    """``bundle validate`` stays fast and JVM-free: checked in a fresh interpreter."""
    code = ("import sys; from pathlib import Path; from streamling.bundle.loading import load_bundle; "
            f"load_bundle(Path({str(VALID)!r}), environ={{}}, user='alice'); "
            "assert 'pyspark' not in sys.modules, 'pyspark was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_yaml_merge_keys_and_an_include_matching_nothing_load_as_the_databricks_cli_loads_them(
        tmp_path: Path) -> None:
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "ingest.ipynb").write_bytes((VALID / "notebooks" / "ingest.ipynb").read_bytes())
    (tmp_path / "bundle.yml").write_text("""\
bundle:
  name: merged
include:
  - resources/*.yml
resources:
  jobs:
    ingest:
      tasks:
        - task_key: small
          max_retries: 3
          notebook_task: &ingest
            notebook_path: notebooks/ingest.ipynb
            base_parameters: {rows: "10", owner: ops}
        - task_key: large
          depends_on: [{task_key: small}]
          notebook_task:
            <<: *ingest
            base_parameters: {rows: "20"}
""")
    bundle = _load(tmp_path)
    small, large = bundle.jobs["ingest"].tasks
    assert large.notebook_path == small.notebook_path == tmp_path / "notebooks" / "ingest.ipynb"
    assert (small.base_parameters, large.base_parameters) == ({"rows": "10", "owner": "ops"}, {"rows": "20"})
    assert bundle.warnings == ["bundle.yml:4: include pattern 'resources/*.yml' matches no file, so it adds "
                               "nothing (patterns are relative to the bundle folder)"]


def test_a_command_run_from_a_deleted_folder_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from streamling.bundle.cli import main

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    monkeypatch.delenv("STREAMLING_BUNDLE_ROOT", raising=False)
    gone.rmdir()
    assert main(["validate"]) == 1
    err = capsys.readouterr().err
    assert "the current folder no longer exists" in err and "cd into the bundle's folder again" in err
    assert "Traceback" not in err


def test_standby_executors_are_warned_where_a_standby_cannot_keep_them(tmp_path: Path) -> None:
    (tmp_path / "bundle.yml").write_text("""bundle: {name: b}
targets:
  local:
    default: true
    config: {job_runner: {standby_executors: 1}, spark: {master: 'local[2]'}}
  chosen:
    config:
      job_runner: {standby_executors: 1}
      spark: {master: 'spark://h:7077', conf: {spark.executor.instances: '2'}}
  uncapped:
    config: {job_runner: {standby_executors: 1}, spark: {master: 'spark://h:7077'}}
  capped:
    config: {job_runner: {standby_executors: 1}, spark: {master: 'spark://h:7077', conf: {spark.cores.max: '3'}}}
""")
    def said(target: str) -> list[str]:
        return [w for w in _load(tmp_path, target).warnings if "standby_executors" in w]

    [local] = said("local")
    assert "'standby_executors' has no effect here: the target's master is local[2]" in local
    [chosen] = said("chosen")
    assert "has no effect here" in chosen and "spark.executor.instances or spark.dynamicAllocation.*" in chosen
    [uncapped] = said("uncapped")
    assert "gets its 1 executor(s) only when that driver dies, cold. Set spark.cores.max" in uncapped
    assert said("capped") == []
