"""Paths on a cluster of several hosts: what every host can share is accepted, what would resolve
on each host's own disk is refused by ``--validate`` before anything runs, all problems at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamling import cli, storage
from streamling.direct_storage import WebHdfsStorage, direct_conf
from streamling.errors import StreamlingError

CLUSTER = "spark://10.1.2.3:7077"
PIPELINE = """
sources:
  raw: {type: file, path: ./data/, format: csv, mode: {type: bounded}}
  orders: {type: generate, rows: 10, primary_key: id}
sinks:
  lake: {type: delta, from: orders, path: ./lake}
  shared: {type: delta, from: orders, path: hdfs://nn:8020/lake}
  mounted: {type: delta, from: orders, path: "file:///mnt/nfs/lake"}
  raw_out: {type: blackhole, from: raw}
"""


pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.mark.parametrize(("path", "expected"), [
    ("./x", "x"), ("file:///tmp/x", "/tmp/x"), ("hdfs://nn:8020/a/", "hdfs://nn:8020/a"),
    ("s3a://bucket/k", "s3a://bucket/k"),
])
def test_local_paths_become_absolute_and_uris_stay(path: str, expected: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    resolved = storage.resolve(path)
    assert resolved == (str(tmp_path / expected) if path.startswith("./") else expected)
    assert storage.join("hdfs://nn/a", "b", "c") == "hdfs://nn/a/b/c"
    assert storage.name("s3a://bucket/a/flow.json") == "flow.json"


@pytest.mark.parametrize(("master", "multi"), [
    ("local[*]", False), ("spark://127.0.0.1:7077", False), ("spark://localhost:1,127.0.0.2:2", False),
    ("spark://10.0.0.5:7077", True), ("spark://master:7077", True), ("k8s://https://api:6443", True),
])
def test_which_masters_span_hosts(master: str, multi: bool) -> None:
    assert storage.is_multi_host(master) is multi


def test_local_storage_replaces_files_atomically(tmp_path: Path) -> None:
    store = storage.storage_for(str(tmp_path))
    target = storage.join(str(tmp_path), "a", "flow.json")
    store.mkdirs(storage.join(str(tmp_path), "a"))
    store.write_text(target, "one")
    store.write_text(target, "two")
    assert store.read_text(target) == "two" and store.list_names(storage.join(str(tmp_path), "a")) == ["flow.json"]
    assert store.list_names(str(tmp_path / "missing")) == []
    store.delete(storage.join(str(tmp_path), "a"))
    assert not store.exists(target)


def _validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              config: str, pipeline: str = PIPELINE, *flags: str) -> dict[str, object]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pipeline.yaml").write_text(pipeline)
    (tmp_path / "config.yaml").write_text(config)
    code = cli.main(["pipeline.yaml", "--validate", *flags])
    result = json.loads(capsys.readouterr().out)
    assert code == (0 if result["is_valid"] else 1)
    return result


def test_validate_refuses_paths_each_host_would_resolve_on_its_own_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    result = _validate(tmp_path, monkeypatch, capsys,
                       f"spark: {{master: '{CLUSTER}'}}\nstate_backend: {{backend_type: Sqlite}}\n")
    errors = result["errors"]
    assert isinstance(errors, list)
    text = "\n".join(errors)
    assert result["is_valid"] is False and result["success"] is True
    # the default ./.streamling, the relative table and folder, the SQLite backend: four problems at once
    assert f"state_dir './.streamling' is a relative path: on the cluster at {CLUSTER} it would resolve on each " \
           "host differently" in text
    assert "delta sink 'lake': path './lake' is a relative path" in text
    assert "file source 'raw': path './data/' is a relative path" in text
    assert "the Sqlite state backend keeps its file on the driver host's disk" in text
    assert "use state_backend.backend_type: Postgres on a cluster" in text
    # shared storage and an explicit shared mount are fine
    assert "'shared'" not in text and "'mounted'" not in text


def test_the_master_flag_is_the_master_every_check_sees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STREAMLING__SPARK__MASTER", "local[2]")
    result = _validate(tmp_path, monkeypatch, capsys, "spark: {master: 'local[1]'}\n", PIPELINE, "--master", CLUSTER)
    text = "\n".join(map(str, result["errors"]))  # type: ignore[call-overload]
    assert result["is_valid"] is False, result
    assert f"on the cluster at {CLUSTER}" in text and "delta sink 'lake': path './lake' is a relative path" in text


def test_validate_refuses_a_table_on_the_driver_disk_but_only_warns_for_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = ("sources: {orders: {type: generate, rows: 10, primary_key: id}}\n"
                f"sinks: {{lake: {{type: delta, from: orders, path: {tmp_path / 'lake'}}}}}\n")
    result = _validate(tmp_path, monkeypatch, capsys,
                       f"spark: {{master: '{CLUSTER}'}}\nstate_dir: {tmp_path / 'state'}\n", pipeline)
    errors = result["errors"]
    assert isinstance(errors, list) and len(errors) == 1, errors
    assert errors[0].startswith(f"delta sink 'lake': path '{tmp_path / 'lake'}' is on this host's disk, but "
                                f"executors on other hosts of {CLUSTER} read or write it on theirs")
    assert f"file://{tmp_path / 'lake'} when that folder is a shared mount" in errors[0]
    warnings = result["warnings"]
    assert isinstance(warnings, list)
    assert any("state_dir" in w and "is on the driver host's disk" in w for w in warnings)
    # Messages, as Streamling's output and our errors are: no timestamps, levels or logger names; once each.
    assert all(" WARNING " not in w and not w[:4].isdigit() for w in warnings), warnings
    assert len(warnings) == len(set(warnings))


def test_a_loopback_cluster_is_one_host(tmp_path: Path) -> None:
    assert storage.cluster_path_problem("./lake", "spark://127.0.0.1:7077", "path", True) is None
    assert storage.cluster_path_problem("./lake", "local[2]", "path", True) is None
    assert storage.cluster_path_problem("s3a://b/lake", CLUSTER, "path", True) is None


def test_storage_errors_are_classified_and_never_show_a_credential() -> None:
    refused = storage.storage_error(
        RuntimeError("java.nio.file.AccessDeniedException: s3a://b/x: secret.key=abc123 forbidden"), "write",
        "s3a://b/x/flow.json")
    assert not refused.retriable and "abc123" not in refused.headline()
    assert "spark.hadoop.fs.s3a.secret.key" in refused.headline()
    away = storage.storage_error(RuntimeError("java.net.ConnectException: Connection refused"), "read",
                                 "hdfs://nn:8020/x")
    assert away.retriable and away.code == "storage_unreachable"
    # HDFS's DataNodes away while its NameNode answers: a write loses its pipeline, a read its replicas
    for text in ("java.io.IOException: All datanodes [DatanodeInfoWithStorage[10.0.0.1:9866,DS-1,DISK]] are bad. "
                 "Aborting...",
                 "org.apache.hadoop.hdfs.BlockMissingException: Could not obtain block: BP-1:blk_1 file=/x/1",
                 "org.apache.hadoop.ipc.RemoteException(java.io.IOException): File /x/.1.tmp could only be written "
                 "to 0 of the 1 minReplication nodes. There are 0 datanode(s) running"):
        assert storage.storage_error(RuntimeError(text), "write", "hdfs://nn:8020/x").retriable, text
    missing = storage.storage_error(RuntimeError("UnsupportedFileSystemException: No FileSystem for scheme \"s3a\""),
                                    "read", "s3a://b/x")
    assert not missing.retriable and "hadoop-aws" in missing.headline()


def test_webhdfs_finds_the_namenodes_http_address_as_a_hadoop_client_would() -> None:
    conf = direct_conf({"spark.hadoop.dfs.namenode.http-address": "0.0.0.0:50070",
                        "spark.executor.memory": "1g"})
    assert conf == {"spark.hadoop.dfs.namenode.http-address": "0.0.0.0:50070"}
    # the NameNode's bind-all default means the URI's host
    assert WebHdfsStorage(conf)._bases("hdfs://nn1:8020/r/x") == (["http://nn1:50070"], "/r/x")
    assert WebHdfsStorage({})._bases("hdfs://nn1:8020/r") == (["http://nn1:9870"], "/r")
    assert WebHdfsStorage({})._bases("webhdfs://nn1:14000/r") == (["http://nn1:14000"], "/r")
    https = {"dfs.http.policy": "HTTPS_ONLY"}
    assert WebHdfsStorage(https)._bases("hdfs://nn1/r") == (["https://nn1:9871"], "/r")
    ha = {"spark.hadoop.dfs.ha.namenodes.prod": "a, b", "spark.hadoop.dfs.namenode.http-address.prod.a": "h1:9870",
          "spark.hadoop.dfs.namenode.http-address.prod.b": "h2:9870"}
    assert WebHdfsStorage(ha)._bases("hdfs://prod/r") == (["http://h1:9870", "http://h2:9870"], "/r")


def test_webhdfs_refuses_what_it_cannot_reach_with_the_setting_to_fix() -> None:
    ha = {"dfs.ha.namenodes.prod": "a,b", "dfs.namenode.http-address.prod.a": "h1:9870"}
    with pytest.raises(StreamlingError) as info:
        WebHdfsStorage(ha).exists("hdfs://prod/r")
    assert "spark.hadoop.dfs.namenode.http-address.prod.b" in (info.value.hint or "")
    with pytest.raises(StreamlingError) as info:
        WebHdfsStorage({"hadoop.security.authentication": "kerberos"}).exists("hdfs://nn/r")
    assert "Kerberos" in str(info.value) and "s3a://" in (info.value.hint or "")


def test_a_webhdfs_write_refused_half_way_leaves_the_file_as_it_was_and_says_what_to_fix() -> None:
    import httpx

    calls: list[tuple[str, str]] = []

    def namenode(request: httpx.Request) -> httpx.Response:
        op = request.url.params.get("op", "DATA")
        calls.append((op, request.url.path))
        if op == "CREATE":
            return httpx.Response(307, headers={"location": "http://dn:9864/webhdfs/v1/r/current.tmp"})
        if op == "DATA":
            return httpx.Response(201)
        if op == "RENAME":  # the user may write the folder's files but not replace `current`
            return httpx.Response(403, json={"RemoteException": {
                "exception": "AccessControlException", "message": "Permission denied: user=etl, access=WRITE"}})
        return httpx.Response(200, json={"boolean": True})

    fs = WebHdfsStorage({})
    fs._client = httpx.Client(transport=httpx.MockTransport(namenode))
    with pytest.raises(StreamlingError) as info:
        fs.write_text("hdfs://nn/r/current", "2\n")
    assert info.value.code == "storage_refused" and not info.value.retriable
    assert "cannot write hdfs://nn/r/current: " in str(info.value) and "Permission denied" in str(info.value)
    assert "permissions" in (info.value.hint or "")
    [(op, temporary)] = [c for c in calls if c[0] == "DELETE"]  # the partial file beside it is removed
    assert temporary.startswith("/webhdfs/v1/r/current._streamling-") and temporary.endswith(".tmp")
    assert ("RENAME", temporary) in calls
