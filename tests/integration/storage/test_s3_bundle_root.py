"""A bundle root on an object store (``workspace.root_path: s3a://…``), driven as users drive it.

Host A deploys; host B is a second mirror folder (``STREAMLING_MIRROR_DIR``) with no view of A's:
everything B's runner runs — the deployment, the bundle's files, the secrets — comes from the
store, and the log of what it ran is read back on A. Runs and the runners' lease are in Postgres.
Tasks are Python files (no JVM): what is under test is the root, not Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from jobs import bundle, run_store, runs, stop_lease_holder, wait_for

pytestmark = [pytest.mark.s3, pytest.mark.postgres, pytest.mark.slow]

SECRET = "s3-root-s3cr3t"


def _store(s3: dict[str, str]) -> Any:
    """The test's own view of the bucket (pyarrow, as a user's script would look)."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(access_key=s3["STREAMLING_TEST_S3_ACCESS_KEY"],
                             secret_key=s3["STREAMLING_TEST_S3_SECRET_KEY"],
                             endpoint_override=s3["STREAMLING_TEST_S3_ENDPOINT"].split("//", 1)[1], scheme="http",
                             region="us-east-1")


def _bytes(fs: Any, key: str) -> bytes:
    with fs.open_input_stream(key) as stream:
        return bytes(stream.read())


def _read(fs: Any, key: str) -> str:
    return _bytes(fs, key).decode()


@pytest.fixture
def project(tmp_path: Path, s3: dict[str, str], postgres_service: dict[str, str],
            unique_name: str) -> tuple[Path, str, dict[str, str]]:
    root = tmp_path / "project"
    (root / "jobs").mkdir(parents=True)
    (root / "jobs" / "hello.py").write_text(textwrap.dedent("""
        from pathlib import Path
        import greet
        from streamling.notebook.dbutils import dbutils
        print("library:", greet.WHO, flush=True)
        print("greeting:", (Path(__file__).parent / "greeting.txt").read_text().strip(), flush=True)
        print("token is", dbutils.secrets.get("app", "token"), flush=True)
    """))
    (root / "jobs" / "greeting.txt").write_text("hello from version 1\n")
    _wheel(root / "dist" / "greet-1.0-py3-none-any.whl")
    prefix = f"{s3['STREAMLING_TEST_S3_BUCKET']}/tests/{unique_name}/root"
    pg = run_store(postgres_service, unique_name)
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: s3root}}
        workspace: {{root_path: "s3a://{prefix}"}}
        resources:
          secret_scopes: {{app: {{}}}}
          jobs:
            hello:
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/hello.py}}
                  libraries: [{{whl: ./dist/greet-1.0-py3-none-any.whl}}]
        targets:
          dev:
            default: true
            config:
              spark:
                conf:
                  spark.hadoop.fs.s3a.endpoint: "{s3['STREAMLING_TEST_S3_ENDPOINT']}"
                  spark.hadoop.fs.s3a.path.style.access: "true"
                  spark.hadoop.fs.s3a.endpoint.region: us-east-1
                  spark.hadoop.fs.s3a.access.key: "{s3['STREAMLING_TEST_S3_ACCESS_KEY']}"
              job_runner:
                store: postgres
                postgres: {pg}
                lease_secs: 3
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLING__", "BUNDLE_VAR_"))}
    # the store's secret stays out of the bundle, as users keep it
    env.update({"STREAMLING__SPARK__CONF__spark.hadoop.fs.s3a.secret.key": s3["STREAMLING_TEST_S3_SECRET_KEY"],
                "STREAMLING__JOB_RUNNER__POSTGRES__PASS": postgres_service["STREAMLING__POSTGRES_SINK__PASS"],
                "STREAMLING_MIRROR_DIR": str(tmp_path / "host-a"),
                "STREAMLING_CACHE_DIR": str(tmp_path / "host-a-cache")})
    return root, prefix, env






def test_a_bundle_root_on_s3_serves_every_host(project: tuple[Path, str, dict[str, str]], s3: dict[str, str],
                                               pg: Any, unique_name: str, tmp_path: Path) -> None:
    root, prefix, host_a = project
    # host B has its own mirror and its own cache: the task's environment is not there yet
    host_b = {**host_a, "STREAMLING_MIRROR_DIR": str(tmp_path / "host-b"),
              "STREAMLING_CACHE_DIR": str(tmp_path / "host-b-cache")}
    fs = _store(s3)
    deployed = bundle(root, host_a, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    assert f"to target 'dev' (s3a://{prefix})" in deployed.stdout
    assert _read(fs, f"{prefix}/current").strip() == "1"
    assert "print(\"greeting:\"" in _read(fs, f"{prefix}/deployments/1/files/jobs/hello.py")
    assert _read(fs, f"{prefix}/secrets/app.json") == "{}"  # the declared scope, created empty
    put = bundle(root, host_a, "secrets", "put-secret", "app", "token", stdin=f"{SECRET}\n")
    assert put.returncode == 0, put.stderr
    assert SECRET in _read(fs, f"{prefix}/secrets/app.json")
    stop_lease_holder(pg, unique_name)
    # The task's environment was built on host A at deploy; host B has none (same machine here: remove it).
    record = json.loads(_read(fs, f"{prefix}/deployments/1/deployment.json"))
    built_on_a = Path(record["jobs"]["hello"]["tasks"][0]["python"]).parents[1]
    assert str(built_on_a).startswith(host_a["STREAMLING_CACHE_DIR"])
    shutil.rmtree(built_on_a)

    # Host B: a runner started there finds the deployment, the files and the secret in the store.
    ran = bundle(root, host_b, "run", "hello")
    assert ran.returncode == 0, ran.stderr
    [run] = runs(root, host_b, "hello")
    assert run["state"] == "succeeded" and str(tmp_path / "host-b") in run["attempts"][0]["log_path"]
    # ... and host A reads its log from the store (redacted as ever), once B's runner has uploaded it.
    wait_for(lambda: "token is" in bundle(root, host_a, "logs", str(run["run_id"])).stdout, 30, "the uploaded log")
    log = bundle(root, host_a, "logs", str(run["run_id"])).stdout
    assert "library: greet 1.0" in log  # the wheel came from the store, its environment was built on B
    assert (tmp_path / "host-b-cache" / "task-envs").is_dir()
    assert "greeting: hello from version 1" in log and "token is [REDACTED]" in log and SECRET not in log

    # A deploy from host A reaches the runner on host B: its next run uses version 2's files.
    (root / "jobs" / "greeting.txt").write_text("hello from version 2\n")
    again = bundle(root, host_a, "deploy")
    assert again.returncode == 0, again.stderr
    assert _read(fs, f"{prefix}/current").strip() == "2"
    ran = bundle(root, host_a, "run", "hello")
    assert ran.returncode == 0, ran.stderr
    last = runs(root, host_a, "hello")[-1]
    assert last["deployment"] == 2 and str(tmp_path / "host-b") in last["attempts"][0]["log_path"]
    wait_for(lambda: "version 2" in bundle(root, host_a, "logs", str(last["run_id"])).stdout, 30, "the second log")
    summary = bundle(root, host_b, "summary")
    assert f"Root: s3a://{prefix}" in summary.stdout

    # No object holds the store's secret key or the task's secret outside the secret scope.
    keys = _files(fs, prefix)
    leaks = [k for k in keys if not k.endswith("secrets/app.json")
             and any(value.encode() in _bytes(fs, k) for value in (s3["STREAMLING_TEST_S3_SECRET_KEY"], SECRET))]
    assert leaks == [] and any(k.endswith("/logs/run-1/main-1.log") for k in keys)

    # The store goes away: a host that has the deployment keeps running its jobs from its mirror (the
    # secret from its copy), the log stays on the host, and the runner says so instead of failing.
    stop_lease_holder(pg, unique_name)
    cut_off = {**host_b, "STREAMLING__SPARK__CONF__spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:1"}
    ran = bundle(root, cut_off, "run", "hello")
    assert ran.returncode == 0, ran.stderr
    cut_run = runs(root, cut_off, "hello")[-1]
    assert cut_run["state"] == "succeeded" and cut_run["deployment"] == 2
    log = bundle(root, cut_off, "logs", str(cut_run["run_id"])).stdout
    assert "greeting: hello from version 2" in log and "token is [REDACTED]" in log
    assert "cannot read the secret scopes of s3a://" in log  # the task's own warning, then the mirror's copy
    mirror = next((tmp_path / "host-b").iterdir())
    wait_for(lambda: "stays on this host" in (mirror / "runner.log").read_text(), 30, "the runner's warning")
    assert "Traceback" not in (mirror / "runner.log").read_text()
    stop_lease_holder(pg, unique_name)

    # Wrong credentials: terminal, masked, names the setting; nothing changes.
    bad = bundle(root, {**host_a, "STREAMLING__SPARK__CONF__spark.hadoop.fs.s3a.secret.key": "wrong-key"}, "deploy")
    assert bad.returncode == 1 and "spark.hadoop.fs.s3a.secret.key" in bad.stderr and "wrong-key" not in bad.stderr
    assert "Traceback" not in bad.stderr
    assert _read(fs, f"{prefix}/current").strip() == "2"

    destroyed = bundle(root, host_a, "destroy", "--auto-approve")
    assert destroyed.returncode == 0, destroyed.stderr
    assert _files(fs, prefix) == []


def test_a_missing_bucket_or_an_unreachable_store_fails_the_deploy_before_anything(
        project: tuple[Path, str, dict[str, str]], s3: dict[str, str]) -> None:
    root, prefix, env = project
    fs = _store(s3)
    text = (root / "bundle.yml").read_text()
    (root / "bundle.yml").write_text(text.replace(f"s3a://{s3['STREAMLING_TEST_S3_BUCKET']}/", "s3a://no-such-bucket/"))
    missing = bundle(root, env, "deploy")
    assert missing.returncode == 1 and "the bucket 'no-such-bucket' does not exist" in missing.stderr
    assert fs.get_file_info("no-such-bucket").type.name == "NotFound"  # not created by the attempt
    (root / "bundle.yml").write_text(text.replace(s3["STREAMLING_TEST_S3_ENDPOINT"], "http://127.0.0.1:1"))
    unreachable = bundle(root, env, "deploy", timeout=120)
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr
    assert f"cannot look up s3a://{prefix}" in unreachable.stderr and "reachable" in unreachable.stderr
    assert _files(fs, prefix) == []


def _files(fs: Any, prefix: str) -> list[str]:
    """The objects under ``prefix`` (folders aside: some stores keep empty ones)."""
    import pyarrow.fs as pafs

    return [i.path for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
            if i.type == pafs.FileType.File]


def _wheel(path: Path) -> None:
    """A one-module wheel (``greet``), as a bundle's artifact build leaves in ``dist/``."""
    import zipfile

    path.parent.mkdir(parents=True, exist_ok=True)
    info = "greet-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("greet.py", 'WHO = "greet 1.0"\n')
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: greet\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", f"greet.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
