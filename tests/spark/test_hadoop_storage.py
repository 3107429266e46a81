"""streamling's own files through Spark's Hadoop FileSystem (what an ``hdfs://`` or ``s3a://``
state_dir uses), here on ``file:`` URIs: missing files, replacing, listing, deleting, and a scheme
Spark has no file system for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamling import storage
from streamling.errors import StreamlingError

pytestmark = pytest.mark.spark


def test_hadoop_storage_reads_replaces_lists_and_deletes(spark: Any, tmp_path: Path) -> None:
    store = storage.HadoopStorage(spark)
    root = f"file://{tmp_path}/flow"
    meta = storage.join(root, "flow.json")
    assert not store.exists(meta) and store.list_names(root) == []
    with pytest.raises(FileNotFoundError):
        store.read_text(meta)
    store.mkdirs(root)
    store.write_text(meta, '{"epoch": 1}')
    store.write_text(meta, '{"epoch": 2}')  # replaces; the temporary file is gone
    assert store.read_text(meta) == '{"epoch": 2}'
    assert [n for n in store.list_names(root) if not n.startswith(".")] == ["flow.json"]
    assert (tmp_path / "flow" / "flow.json").read_text() == '{"epoch": 2}'
    store.delete(root)
    assert not store.exists(root) and not (tmp_path / "flow").exists()


def test_a_scheme_without_a_file_system_is_terminal_and_names_the_jar(spark: Any) -> None:
    with pytest.raises(StreamlingError) as info:
        storage.HadoopStorage(spark).exists("s3a://bucket/streamling/flow.json")
    err = info.value
    assert not err.retriable and err.code == "storage_refused"
    assert err.headline().startswith("cannot open the file system of s3a://bucket/streamling/flow.json: ")
    assert "add its Hadoop connector jar (hadoop-aws for s3a://) to spark.jars" in err.headline()
