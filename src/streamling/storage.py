"""Where a job's files live: a local folder on one host, or any Hadoop-compatible file system.

On a cluster the driver may be relaunched on another host and executors write from theirs, so
checkpoints, flow metadata and tables must live on storage every host reaches (``hdfs://``,
``s3a://``, …). streamling reads and writes its own files there through Spark's Hadoop
``FileSystem`` API — the same code, configuration (``spark.hadoop.*``) and credentials Spark uses
for the checkpoint itself — and keeps plain ``pathlib`` for local paths, where a JVM round trip per
epoch would only cost time. Nothing here calls ``open()`` on a path that may be remote.

This module also owns the rules for paths on a cluster (``cluster_path_problem``): a relative path
resolves differently on each host, and a local path is each host's own disk. Processes that start
no JVM (the bundle CLI, the job runner) reach shared storage through ``streamling.direct_storage``.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from streamling.errors import StreamlingError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
#: Windows drive letters look like schemes; they are local paths
_DRIVE = re.compile(r"^[a-zA-Z]:[\\/]")


def scheme(path: str) -> str:
    """The URI scheme of ``path`` (lower-cased), ``""`` for a plain local path."""
    match = _SCHEME.match(path)
    return match.group(1).lower() if match and not _DRIVE.match(path) else ""


def is_local(path: str) -> bool:
    """Whether ``path`` names this host's own disk (a plain path or a ``file:`` URI)."""
    return scheme(path) in ("", "file")


def local_path(path: str) -> Path:
    """A local ``path`` (plain or ``file:``) as a ``Path``, relative paths against the working directory."""
    if scheme(path) == "file":
        rest = path[len("file:"):]
        rest = "/" + rest.lstrip("/") if rest.startswith("//") else rest
        return Path(rest)
    return Path(path).expanduser()


def resolve(path: str) -> str:
    """``path`` made independent of the working directory: a local path absolute, a URI as given."""
    return str(local_path(path).resolve()) if is_local(path) else path.rstrip("/") or path


def join(base: str, *parts: str) -> str:
    """``base``/``parts`` for local paths and URIs alike (URIs use ``/`` whatever the host)."""
    if is_local(base):
        return str(local_path(base).joinpath(*parts))
    return posixpath.join(base.rstrip("/"), *parts)


def name(path: str) -> str:
    """The last component of ``path``."""
    return posixpath.basename(path.rstrip("/")) if not is_local(path) else local_path(path).name


class Storage(Protocol):
    """The few file operations streamling's own metadata needs, on one kind of storage."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (file or folder)."""

    def read_text(self, path: str) -> str:
        """The UTF-8 text of file ``path``; ``FileNotFoundError`` when it does not exist."""

    def write_text(self, path: str, text: str) -> None:
        """Replace file ``path`` with ``text`` atomically (readers see the old or the new file)."""

    def list_names(self, path: str) -> list[str]:
        """Names of the entries in folder ``path``; ``[]`` when it does not exist."""

    def mkdirs(self, path: str) -> None:
        """Create folder ``path`` and its parents."""

    def delete(self, path: str) -> None:
        """Remove ``path`` and everything under it; nothing when it does not exist."""


@dataclass(frozen=True)
class FileInfo:
    """One entry of a listing, as Databricks' ``dbutils.fs.ls`` returns it (folders end in ``/``)."""

    path: str
    name: str
    size: int
    modificationTime: int  # noqa: N815 - Databricks' field name; milliseconds since the epoch

    def isDir(self) -> bool:  # noqa: N802 - Databricks' name
        return self.name.endswith("/")

    def isFile(self) -> bool:  # noqa: N802 - Databricks' name
        return not self.isDir()


class LocalStorage:
    """This host's disk, through ``pathlib``."""

    def ls(self, path: str) -> list[FileInfo]:
        target = local_path(path)
        if not target.exists():
            raise FileNotFoundError(path)
        entries = sorted(target.iterdir()) if target.is_dir() else [target]
        return [FileInfo(f"file:{e.resolve()}" + ("/" if e.is_dir() else ""), e.name + ("/" if e.is_dir() else ""),
                         0 if e.is_dir() else e.stat().st_size, int(e.stat().st_mtime * 1000)) for e in entries]

    def copy(self, source: str, target: str, recurse: bool = False) -> None:
        import shutil

        src, dst = local_path(source), local_path(target)
        if src.is_dir():
            if not recurse:
                raise IsADirectoryError(f"{source} is a folder: copy it with recurse=True")
            shutil.copytree(src, dst, dirs_exist_ok=True)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)

    def move(self, source: str, target: str) -> None:
        import shutil

        local_path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(local_path(source)), str(local_path(target)))

    def head(self, path: str, max_bytes: int) -> bytes:
        with local_path(path).open("rb") as handle:
            return handle.read(max_bytes)

    def put(self, path: str, data: bytes, overwrite: bool) -> None:
        target = local_path(path)
        if target.exists() and not overwrite:
            raise FileExistsError(f"{path} exists: put it with overwrite=True")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def exists(self, path: str) -> bool:
        return local_path(path).exists()

    def read_text(self, path: str) -> str:
        return local_path(path).read_text(encoding="utf-8")

    def write_text(self, path: str, text: str) -> None:
        target = local_path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)

    def list_names(self, path: str) -> list[str]:
        try:
            return [p.name for p in local_path(path).iterdir()]
        except OSError:
            return []

    def mkdirs(self, path: str) -> None:
        local_path(path).mkdir(parents=True, exist_ok=True)

    def delete(self, path: str) -> None:
        import shutil

        target = local_path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)


class HadoopStorage:
    """Any file system Spark reaches (``hdfs://``, ``s3a://``, ``abfs://``, ``gs://`` …), through the
    driver JVM's Hadoop ``FileSystem`` with the session's Hadoop configuration (``spark.hadoop.*``)."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark.sparkContext._jvm
        self._conf: Any = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]

    def _fs(self, path: str) -> tuple[Any, Any]:
        jpath = self._jvm.org.apache.hadoop.fs.Path(path)
        try:
            return jpath.getFileSystem(self._conf), jpath
        except Exception as exc:
            raise storage_error(exc, "open the file system of", path) from exc

    def exists(self, path: str) -> bool:
        fs, jpath = self._fs(path)
        try:
            return bool(fs.exists(jpath))
        except Exception as exc:
            raise storage_error(exc, "look up", path) from exc

    def read_text(self, path: str) -> str:
        return self._read(path, None).decode("utf-8")

    def _read(self, path: str, limit: int | None) -> bytes:
        """The bytes of file ``path``, at most ``limit`` of them."""
        fs, jpath = self._fs(path)
        try:
            stream = fs.open(jpath)
        except Exception as exc:
            raise _failure(exc, "read", path) from exc
        io = self._jvm.org.apache.commons.io.IOUtils
        try:
            whole = limit is None or limit >= int(fs.getFileStatus(jpath).getLen())
            return bytes(io.toByteArray(stream) if whole else io.toByteArray(stream, max(0, int(limit or 0))))
        except Exception as exc:
            raise storage_error(exc, "read", path) from exc
        finally:
            stream.close()

    def write_text(self, path: str, text: str) -> None:
        fs, jpath = self._fs(path)
        tmp = self._jvm.org.apache.hadoop.fs.Path(f"{path}.tmp")
        try:
            out = fs.create(tmp, True)
            try:
                out.write(text.encode("utf-8"))
            finally:
                out.close()
            # Hadoop's rename does not replace an existing file; HDFS has no atomic replace through
            # FileSystem, so the old file goes first (a reader in between finds neither: callers
            # write metadata before anything depends on it, and rewrite it only with what it held).
            if fs.exists(jpath):
                fs.delete(jpath, False)
            if not fs.rename(tmp, jpath):
                raise OSError(f"rename {path}.tmp -> {path} refused")
        except Exception as exc:
            raise storage_error(exc, "write", path) from exc

    def list_names(self, path: str) -> list[str]:
        fs, jpath = self._fs(path)
        try:
            return [str(status.getPath().getName()) for status in fs.listStatus(jpath)]
        except Exception as exc:
            if _java_class(exc) == "java.io.FileNotFoundException":
                return []
            raise storage_error(exc, "list", path) from exc

    def mkdirs(self, path: str) -> None:
        fs, jpath = self._fs(path)
        try:
            fs.mkdirs(jpath)
        except Exception as exc:
            raise storage_error(exc, "create folder", path) from exc

    def delete(self, path: str) -> None:
        fs, jpath = self._fs(path)
        try:
            fs.delete(jpath, True)
        except Exception as exc:
            raise storage_error(exc, "delete", path) from exc

    def ls(self, path: str) -> list[FileInfo]:
        fs, jpath = self._fs(path)
        try:
            statuses = fs.listStatus(jpath)
        except Exception as exc:
            raise _failure(exc, "list", path) from exc
        out = []
        for status in statuses:
            folder = bool(status.isDirectory())
            out.append(FileInfo(str(status.getPath().toString()) + ("/" if folder else ""),
                                str(status.getPath().getName()) + ("/" if folder else ""),
                                0 if folder else int(status.getLen()), int(status.getModificationTime())))
        return sorted(out, key=lambda f: f.name)

    def copy(self, source: str, target: str, recurse: bool = False) -> None:
        src_fs, src = self._fs(source)
        dst_fs, dst = self._fs(target)
        try:
            if src_fs.getFileStatus(src).isDirectory() and not recurse:
                raise IsADirectoryError(f"{source} is a folder: copy it with recurse=True")
            self._jvm.org.apache.hadoop.fs.FileUtil.copy(src_fs, src, dst_fs, dst, False, True, self._conf)
        except IsADirectoryError:
            raise
        except Exception as exc:
            raise _failure(exc, "copy", f"{source} to {target}", source) from exc

    def move(self, source: str, target: str) -> None:
        src_fs, src = self._fs(source)
        dst_fs, dst = self._fs(target)
        try:
            if src_fs.getUri().equals(dst_fs.getUri()):
                dst_fs.mkdirs(dst.getParent())
                if src_fs.rename(src, dst):
                    return
            # another file system (or a refused rename): copy, then delete the source
            self._jvm.org.apache.hadoop.fs.FileUtil.copy(src_fs, src, dst_fs, dst, True, True, self._conf)
        except Exception as exc:
            raise _failure(exc, "move", f"{source} to {target}", source) from exc

    def head(self, path: str, max_bytes: int) -> bytes:
        return self._read(path, max_bytes)

    def put(self, path: str, data: bytes, overwrite: bool) -> None:
        fs, jpath = self._fs(path)
        try:
            if fs.exists(jpath) and not overwrite:
                raise FileExistsError(f"{path} exists: put it with overwrite=True")
            out = fs.create(jpath, bool(overwrite))
            try:
                out.write(data)
            finally:
                out.close()
        except FileExistsError:
            raise
        except Exception as exc:
            raise storage_error(exc, "write", path) from exc


#: S3 and S3-compatible stores (``streamling.direct_storage.ObjectStorage`` without Spark)
S3_SCHEMES = ("s3a", "s3", "s3n")


_LOCAL = LocalStorage()


def storage_for(path: str, spark: SparkSession | None = None) -> Storage:
    """The storage holding ``path``: the local disk, or the Hadoop file system of its scheme
    (which needs the session, or the process's active one)."""
    if is_local(path):
        return _LOCAL
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise StreamlingError(f"cannot reach {path}: a Spark session is needed for {scheme(path)}:// storage",
                                  code="storage_no_session", user=False)
    return HadoopStorage(spark)


def _failure(exc: BaseException, action: str, what: str, missing: str | None = None) -> Exception:
    """What a failed Hadoop call raises here: ``FileNotFoundError`` for a missing path, else a
    classified ``storage_error``."""
    if _java_class(exc) == "java.io.FileNotFoundException":
        return FileNotFoundError(missing or what)
    return storage_error(exc, action, what)


def _java_class(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    try:
        return str(java.getClass().getName()) if java is not None else ""
    except Exception:  # noqa: BLE001 - only used to classify
        return ""


#: Hadoop names the file system class of a known scheme (s3a) whose connector jar is missing
_NO_CONNECTOR = "ClassNotFoundException: Class org.apache.hadoop.fs."
#: Hadoop exceptions of a store that is there but refuses us: fixing a setting is the only cure
_TERMINAL = ("AccessDeniedException", "UnknownStoreException", "NoSuchBucket", "AccessControlException",
             "InvalidAccessKeyId", "SignatureDoesNotMatch", "UnsupportedFileSystemException",
             "No FileSystem for scheme", _NO_CONNECTOR,
             # the AWS SDK's error names, as pyarrow.fs reports them (ObjectStorage)
             "AWS Error ACCESS_DENIED", "AWS Error INVALID_ACCESS_KEY_ID", "AWS Error SIGNATURE_DOES_NOT_MATCH",
             "AWS Error NO_SUCH_BUCKET")
#: ... and of one that is briefly away: the flow's retry policy applies
_TRANSIENT = ("ConnectException", "Connection refused", "Connection reset", "SocketException", "Broken pipe",
              "SocketTimeoutException", "UnknownHostException",
              "NoRouteToHostException", "EOFException", "ConnectTimeoutException", "RetriableException",
              "SafeModeException", "AWSClientIOException", "SdkClientException",
              "AWS Error NETWORK_CONNECTION", "AWS Error SLOW_DOWN", "AWS Error SERVICE_UNAVAILABLE",
              "AWS Error REQUEST_TIMEOUT", "AWS Error INTERNAL_FAILURE",
              # HDFS whose DataNodes are away while its NameNode answers (a restart, a network cut):
              # a block being written loses its pipeline, a block being read has no live replica
              "are bad. Aborting", "BlockMissingException", "Could not obtain block",
              "could only be written to 0 of the",
              # a NameNode in standby, or one that cannot be reached over HTTP (WebHdfsStorage)
              "StandbyException", "ConnectError", "ConnectTimeout", "ReadTimeout", "RemoteProtocolError")


def storage_error(exc: BaseException, action: str, path: str) -> StreamlingError:
    """A storage failure for humans: what was attempted on which path, classified transient (the
    store is unreachable: retried by the flow) or terminal (credentials, a missing bucket, an
    unknown scheme: which setting to fix). The message never carries a credential."""
    from streamling.config.settings import MASK
    from streamling.errors import chain_text, java_message

    text = chain_text(exc)
    java = getattr(exc, "java_exception", None)  # py4j's own first line names only the JVM call
    what = java_message(java) if java is not None else java_message(exc)
    what = re.sub(r"(?i)((?:secret|access)[._-]?key|token|password)=\S+", rf"\1={MASK}", what)
    where = f"cannot {action} {path}: {what}"
    if any(marker in text for marker in _TERMINAL):
        hint = _terminal_hint(text, path)
        return StreamlingError(where, code="storage_refused", hint=hint, cause=exc)
    retriable = any(marker in text for marker in _TRANSIENT)
    return StreamlingError(where, code="storage_unreachable" if retriable else "storage_failed", retriable=retriable,
                           hint=f"check that the {scheme(path) or 'file'} storage at {path} is up and reachable "
                                "from this host", cause=exc)


def _terminal_hint(text: str, path: str) -> str:
    kind = scheme(path)
    if "No FileSystem for scheme" in text or "UnsupportedFileSystemException" in text or _NO_CONNECTOR in text:
        return (f"Spark has no file system for '{kind}://': add its Hadoop connector jar (hadoop-aws for s3a://) to "
                "spark.jars, or use hdfs:// or a local path")
    if "NoSuchBucket" in text or "UnknownStoreException" in text or "NO_SUCH_BUCKET" in text:
        return f"the bucket of {path} does not exist: create it, or fix the path"
    if kind in S3_SCHEMES:
        return ("the store refused the credentials: fix spark.conf 'spark.hadoop.fs.s3a.access.key' / "
                "'spark.hadoop.fs.s3a.secret.key' (or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
    return "the store refused access: check the user and the permissions on that path"


# --- paths on a cluster -------------------------------------------------------------------------

def is_multi_host(master: str) -> bool:
    """Whether executors may run on other hosts than the driver: any master but ``local[…]`` and a
    standalone master on a loopback address (one host, by construction). No master at all is the
    default, ``local[*]``."""
    if not master.strip() or master.startswith("local"):
        return False
    if master.startswith("spark://"):
        hosts = [part.rsplit(":", 1)[0].strip("[]") for part in master[len("spark://"):].split(",")]
        return not all(_is_loopback(host) for host in hosts)
    return True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cluster_path_problem(path: str, master: str, what: str, written_by_executors: bool) -> str | None:
    """Why ``path`` cannot serve as ``what`` on ``master``'s cluster, or None when it can.

    A relative path would resolve against each host's working directory; a plain absolute path is
    each host's own disk, which is wrong wherever executors read or write (a Delta table's data
    files would be scattered over the workers). ``file:`` says the folder is mounted at the same
    path on every host (NFS and the like), so it is taken as shared."""
    if not is_multi_host(master) or not is_local(path):
        return None
    example = "hdfs://namenode:8020/… or s3a://bucket/…"
    if scheme(path) == "" and not Path(path).expanduser().is_absolute():
        return (f"{what} '{path}' is a relative path: on the cluster at {master} it would resolve on each host "
                f"differently — use a shared URI ({example}), or file:///… for a folder mounted at the same "
                "path on every host")
    if written_by_executors and scheme(path) == "":
        return (f"{what} '{path}' is on this host's disk, but executors on other hosts of {master} read or write it "
                f"on theirs — use a shared URI ({example}), or file://{Path(path).expanduser()} when that folder is "
                "a shared mount at the same path on every host")
    return None
