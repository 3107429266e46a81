"""A bundle root on HDFS (``workspace.root_path: hdfs://…``), driven as users drive it.

The bundle CLI and the job runner reach it without Spark, through the NameNode's WebHDFS; host A
deploys, host B is a second mirror folder with no view of A's, so what B's runner runs comes from
HDFS, and A reads back the log B uploaded. The test looks at HDFS through WebHDFS itself, as an
operator's ``curl`` would. Tasks are Python files (no JVM): what is under test is the root.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from jobs import bundle, run_store, runs, stop_lease_holder, wait_for

pytestmark = [pytest.mark.hdfs, pytest.mark.postgres, pytest.mark.slow]


class _WebHdfs:
    """The test's own view of HDFS."""

    def __init__(self, address: str) -> None:
        self.base = f"http://{address}/webhdfs/v1"

    def read(self, path: str) -> str:
        response = httpx.get(f"{self.base}{path}", params={"op": "OPEN", "user.name": "root"}, follow_redirects=True)
        response.raise_for_status()
        return response.text

    def files(self, path: str) -> list[str]:
        response = httpx.get(f"{self.base}{path}", params={"op": "LISTSTATUS", "user.name": "root"})
        if response.status_code == 404:
            return []
        out = []
        for status in response.json()["FileStatuses"]["FileStatus"]:
            child = f"{path}/{status['pathSuffix']}"
            out += self.files(child) if status["type"] == "DIRECTORY" else [child]
        return out


@pytest.fixture
def project(tmp_path: Path, hdfs: dict[str, str], postgres_service: dict[str, str],
            unique_name: str) -> tuple[Path, str, dict[str, str]]:
    root = tmp_path / "project"
    (root / "jobs").mkdir(parents=True)
    (root / "jobs" / "hello.py").write_text(textwrap.dedent("""
        from pathlib import Path
        print("greeting:", (Path(__file__).parent / "greeting.txt").read_text().strip(), flush=True)
    """))
    (root / "jobs" / "greeting.txt").write_text("hello from version 1\n")
    folder = f"/tests/{unique_name}/root"
    pg = run_store(postgres_service, unique_name)
    (root / "bundle.yml").write_text(textwrap.dedent(f"""
        bundle: {{name: hdfsroot}}
        workspace: {{root_path: "{hdfs['STREAMLING_TEST_HDFS_URL']}{folder}"}}
        resources:
          jobs:
            hello:
              tasks:
                - task_key: main
                  spark_python_task: {{python_file: ./jobs/hello.py}}
        targets:
          dev:
            default: true
            config:
              spark:
                conf:
                  spark.hadoop.dfs.namenode.http-address: "{hdfs['STREAMLING_TEST_HDFS_HTTP']}"
              job_runner:
                store: postgres
                postgres: {pg}
                lease_secs: 3
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMLING__", "BUNDLE_VAR_"))}
    env.update({"STREAMLING__JOB_RUNNER__POSTGRES__PASS": postgres_service["STREAMLING__POSTGRES_SINK__PASS"],
                "STREAMLING_MIRROR_DIR": str(tmp_path / "host-a"), "HADOOP_USER_NAME": "root"})
    return root, folder, env




def test_a_bundle_root_on_hdfs_serves_every_host(project: tuple[Path, str, dict[str, str]], hdfs: dict[str, str],
                                                 pg: Any, unique_name: str, tmp_path: Path) -> None:
    root, folder, host_a = project
    host_b = {**host_a, "STREAMLING_MIRROR_DIR": str(tmp_path / "host-b")}
    fs = _WebHdfs(hdfs["STREAMLING_TEST_HDFS_HTTP"])
    uri = f"{hdfs['STREAMLING_TEST_HDFS_URL']}{folder}"

    # A NameNode that does not answer fails the deploy before anything is written.
    unreachable = {**host_a, "STREAMLING__SPARK__CONF__spark.hadoop.dfs.namenode.http-address": "127.0.0.1:1"}
    refused = bundle(root, unreachable, "deploy")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "cannot look up hdfs://" in refused.stderr and "WebHDFS at http://127.0.0.1:1" in refused.stderr
    assert fs.files(folder) == []

    deployed = bundle(root, host_a, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    assert f"to target 'dev' ({uri})" in deployed.stdout
    assert fs.read(f"{folder}/current").strip() == "1"
    assert "greeting:" in fs.read(f"{folder}/deployments/1/files/jobs/hello.py")
    stop_lease_holder(pg, unique_name)

    # Host B: a runner started there finds the deployment and the files on HDFS.
    ran = bundle(root, host_b, "run", "hello")
    assert ran.returncode == 0, ran.stderr
    [run] = runs(root, host_b, "hello")
    assert run["state"] == "succeeded" and str(tmp_path / "host-b") in run["attempts"][0]["log_path"]
    # ... and host A reads its log from HDFS, once B's runner has uploaded it.
    wait_for(lambda: "hello from version 1" in bundle(root, host_a, "logs", str(run["run_id"])).stdout, 30,
             "the uploaded log")
    assert any(f.endswith("/logs/run-1/main-1.log") for f in fs.files(folder))

    # A deploy from host A replaces `current` whole; the runner on host B runs version 2's files.
    (root / "jobs" / "greeting.txt").write_text("hello from version 2\n")
    again = bundle(root, host_a, "deploy")
    assert again.returncode == 0, again.stderr
    assert fs.read(f"{folder}/current").strip() == "2"
    assert not [f for f in fs.files(folder) if f.endswith(".tmp")]
    ran = bundle(root, host_a, "run", "hello")
    assert ran.returncode == 0, ran.stderr
    last = runs(root, host_a, "hello")[-1]
    assert last["deployment"] == 2 and str(tmp_path / "host-b") in last["attempts"][0]["log_path"]
    wait_for(lambda: "version 2" in bundle(root, host_a, "logs", str(last["run_id"])).stdout, 30, "the second log")

    destroyed = bundle(root, host_a, "destroy", "--auto-approve")
    assert destroyed.returncode == 0, destroyed.stderr
    assert fs.files(folder) == []
