"""``dbutils.fs`` as Databricks' notebooks use it: through the session's Hadoop file system (here on
``file:`` URIs and plain paths), and on this host's disk when no Spark session exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamling.errors import StreamlingError
from streamling.notebook.dbutils import DBUtils

pytestmark = pytest.mark.spark


def _round_trip(fs: Any, base: str) -> None:
    assert fs.mkdirs(f"{base}/in/deep")
    assert fs.put(f"{base}/in/a.csv", "id,name\n1,ada\n")
    with pytest.raises(FileExistsError):
        fs.put(f"{base}/in/a.csv", "again")
    assert fs.put(f"{base}/in/a.csv", "id,name\n1,ada\n2,bob\n", overwrite=True)
    assert fs.head(f"{base}/in/a.csv") == "id,name\n1,ada\n2,bob\n"
    assert fs.head(f"{base}/in/a.csv", 7) == "id,name"
    listing = fs.ls(f"{base}/in")
    assert [(f.name, f.size, f.isDir()) for f in listing] == [("a.csv", 20, False), ("deep/", 0, True)]
    assert listing[0].path.startswith("file:") and listing[0].modificationTime > 0
    with pytest.raises(IsADirectoryError):
        fs.cp(f"{base}/in", f"{base}/copy")
    assert fs.cp(f"{base}/in", f"{base}/copy", recurse=True)
    assert [f.name for f in fs.ls(f"{base}/copy")] == ["a.csv", "deep/"]
    assert fs.mv(f"{base}/copy/a.csv", f"{base}/moved/b.csv")
    assert fs.head(f"{base}/moved/b.csv").endswith("2,bob\n") and [f.name for f in fs.ls(f"{base}/copy")] == ["deep/"]
    with pytest.raises(StreamlingError, match="is a folder that is not empty"):
        fs.rm(f"{base}/in")
    assert fs.rm(f"{base}/moved/b.csv") and fs.rm(f"{base}/in", recurse=True)
    assert not fs.rm(f"{base}/in")  # gone already
    with pytest.raises(FileNotFoundError):
        fs.ls(f"{base}/in")
    with pytest.raises(StreamlingError, match="DBFS, Databricks' own file system"):
        fs.ls("dbfs:/FileStore/tables")


def test_dbutils_fs_through_the_sessions_hadoop_file_system(spark: Any, tmp_path: Path) -> None:
    _round_trip(DBUtils({}).fs, f"file://{tmp_path}")


def test_dbutils_fs_on_local_paths_without_a_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    _round_trip(DBUtils({}).fs, str(tmp_path))
