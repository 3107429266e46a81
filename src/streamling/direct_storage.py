"""Shared storage reached without Spark: what the bundle CLI and the job runner, which start no JVM,
use for a bundle root on an object store (``s3a://``, ``ObjectStorage``) or on HDFS (``hdfs://``,
``WebHdfsStorage``, over the NameNode's WebHDFS REST API).

Drivers and executors reach the same paths (the checkpoints under the root) through Spark's own
clients (``streamling.storage``), so both sides are configured from the same ``spark.hadoop.*``
settings (``direct_conf``) and fail with the same classified ``storage_error``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from typing import Any, Protocol

from streamling.errors import StreamlingError
from streamling.storage import S3_SCHEMES, join, scheme, storage_error

#: HDFS, reached through its NameNode's WebHDFS REST API (``WebHdfsStorage``)
HDFS_SCHEMES = ("hdfs", "webhdfs", "swebhdfs")
#: schemes a process without a JVM (the bundle CLI, the job runner) reaches directly
DIRECT_SCHEMES = S3_SCHEMES + HDFS_SCHEMES


class DirectStorage(Protocol):
    """A shared file system reached without Spark: what the bundle CLI and the job runner use for a
    bundle root that is not a local folder. Missing files raise ``FileNotFoundError``; every other
    failure a classified ``storage_error``."""

    def check_root(self, path: str) -> None: ...
    def exists(self, path: str) -> bool: ...
    def read_bytes(self, path: str) -> bytes: ...
    def read_text(self, path: str) -> str: ...
    def write_bytes(self, path: str, data: bytes) -> None: ...
    def write_text(self, path: str, text: str) -> None: ...
    def list_names(self, path: str) -> list[str]: ...
    def files(self, path: str) -> list[str]: ...
    def mkdirs(self, path: str) -> None: ...
    def delete(self, path: str) -> None: ...


def direct_conf(spark_conf: Mapping[str, Any]) -> dict[str, str]:
    """The settings of ``spark_conf`` (``spark.hadoop.*``) that reaching a root directly needs: the
    s3a connector's, and HDFS client ones (NameNode addresses, HA name services, HTTP policy)."""
    wanted = ("fs.s3a.", "dfs.", "hadoop.security.authentication")
    return {k: str(v) for k, v in spark_conf.items() if k.removeprefix("spark.hadoop.").startswith(wanted)}


def direct_storage(uri: str, conf: Mapping[str, str]) -> DirectStorage:
    """The storage that reaches ``uri`` without Spark, configured by ``conf`` (see ``direct_conf``)."""
    if scheme(uri) in HDFS_SCHEMES:
        return WebHdfsStorage(conf)
    return ObjectStorage(conf)


class ObjectStorage:
    """An S3 bucket reached without a JVM, through ``pyarrow.fs``: what the bundle CLI and job runner
    use for a bundle root on an object store (they start no Spark). Configured from the same
    ``spark.hadoop.fs.s3a.*`` settings Spark's s3a connector reads (per-bucket
    ``fs.s3a.bucket.<bucket>.*`` first), else the standard AWS variables and credential chain, so a
    root and the checkpoints under it are reached with one set of credentials."""

    def __init__(self, hadoop_conf: Mapping[str, str]) -> None:
        self._conf = {k.removeprefix("spark.hadoop."): str(v) for k, v in hadoop_conf.items()
                      if k.startswith(("spark.hadoop.fs.s3a.", "fs.s3a."))}
        self._clients: dict[str, Any] = {}

    def _setting(self, bucket: str, key: str) -> str | None:
        return self._conf.get(f"fs.s3a.bucket.{bucket}.{key}") or self._conf.get(f"fs.s3a.{key}")

    def _client(self, path: str) -> tuple[Any, str]:
        """The pyarrow file system of ``path``'s bucket and the path in its terms (``bucket/key``)."""
        import pyarrow.fs as pafs

        if scheme(path) not in S3_SCHEMES:
            raise StreamlingError(f"cannot reach {path} as an S3 object", code="storage_unsupported", user=False)
        rest = path.split("://", 1)[1]
        bucket = rest.split("/", 1)[0]
        if bucket not in self._clients:
            endpoint = self._setting(bucket, "endpoint") or ""
            ssl = (self._setting(bucket, "connection.ssl.enabled") or "true").lower() != "false"
            kwargs: dict[str, Any] = {"allow_bucket_creation": False, "allow_bucket_deletion": False,
                                      "connect_timeout": 5, "request_timeout": 30,
                                      "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3)}
            if endpoint:
                parsed = re.match(r"^(https?)://(.*?)/?$", endpoint)
                kwargs["scheme"], kwargs["endpoint_override"] = (parsed.group(1), parsed.group(2)) if parsed \
                    else ("https" if ssl else "http", endpoint)
                if (self._setting(bucket, "path.style.access") or "false").lower() != "true":
                    kwargs["force_virtual_addressing"] = True
            region = self._setting(bucket, "endpoint.region") or self._setting(bucket, "region")
            if region:
                kwargs["region"] = region
            access, secret = self._setting(bucket, "access.key"), self._setting(bucket, "secret.key")
            if access and secret:
                kwargs.update(access_key=access, secret_key=secret,
                              session_token=self._setting(bucket, "session.token") or None)
            self._clients[bucket] = pafs.S3FileSystem(**kwargs)
        return self._clients[bucket], rest.rstrip("/")

    def _call(self, action: str, path: str, fn: Any) -> Any:
        try:
            return fn()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise storage_error(exc, action, path) from exc

    def check_root(self, path: str) -> None:
        """Refuse a bucket that does not exist (some S3-compatible stores create one on the first
        write, which would hide a typo in the path)."""
        import pyarrow.fs as pafs

        fs, key = self._client(path)
        bucket = key.split("/", 1)[0]
        info = self._call("look up", path, lambda: fs.get_file_info(bucket))
        if info.type == pafs.FileType.NotFound:
            raise StreamlingError(f"cannot write {path}: the bucket '{bucket}' does not exist", code="storage_refused",
                                  hint=f"create the bucket '{bucket}' first, or fix the path")

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        fs, key = self._client(path)
        return bool(self._call("look up", path, lambda: fs.get_file_info(key)).type != pafs.FileType.NotFound)

    def read_bytes(self, path: str) -> bytes:
        fs, key = self._client(path)

        def read() -> bytes:
            with fs.open_input_stream(key) as stream:
                return bytes(stream.read())
        return bytes(self._call("read", path, read))

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data``: one PUT, which readers see whole or not at all."""
        fs, key = self._client(path)

        def write() -> None:
            with fs.open_output_stream(key) as stream:
                stream.write(data)
        self._call("write", path, write)

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def list_names(self, path: str) -> list[str]:
        import pyarrow.fs as pafs

        fs, key = self._client(path)
        infos = self._call("list", path, lambda: fs.get_file_info(pafs.FileSelector(key, allow_not_found=True)))
        return [info.base_name for info in infos]

    def files(self, path: str) -> list[str]:
        """Every file under folder ``path``, as paths relative to it (``[]`` when there is none)."""
        import pyarrow.fs as pafs

        fs, key = self._client(path)
        infos = self._call("list", path, lambda: fs.get_file_info(
            pafs.FileSelector(key, allow_not_found=True, recursive=True)))
        return sorted(info.path[len(key) + 1:] for info in infos if info.type == pafs.FileType.File)

    def mkdirs(self, path: str) -> None:
        """Nothing: an object store has no folders to create (a key's prefix is its folder)."""

    def delete(self, path: str) -> None:
        import pyarrow.fs as pafs

        fs, key = self._client(path)

        def delete() -> None:
            kind = fs.get_file_info(key).type
            if kind == pafs.FileType.Directory:
                fs.delete_dir(key)
            elif kind == pafs.FileType.File:
                fs.delete_file(key)
        self._call("delete", path, delete)


class WebHdfsStorage:
    """HDFS reached without a JVM, through the NameNode's WebHDFS REST API (on by default in
    Hadoop 3): what the bundle CLI and the job runner use for an ``hdfs://`` root, while drivers and
    executors reach the same paths (the checkpoints) through Spark's own HDFS client.

    The NameNode's HTTP address comes from the same ``spark.hadoop.dfs.*`` settings a Hadoop client
    reads: ``dfs.namenode.http-address`` (``https-address`` with ``dfs.http.policy: HTTPS_ONLY``),
    per name service and NameNode for HA (``dfs.ha.namenodes.<ns>``, trying each until the active one
    answers), else the URI's host on Hadoop's default port. ``webhdfs://host:port`` names the HTTP
    address itself. Requests carry the Hadoop user (``HADOOP_USER_NAME``, else this process's user)
    with simple authentication; a Kerberos-secured cluster is refused with what to use instead."""

    def __init__(self, hadoop_conf: Mapping[str, str]) -> None:
        import getpass
        import os

        self._conf = {k.removeprefix("spark.hadoop."): str(v) for k, v in hadoop_conf.items()}
        self._user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        self._client: Any = None

    def _bases(self, path: str) -> tuple[list[str], str]:
        """The WebHDFS endpoints to try for ``path``, and the path in HDFS."""
        from urllib.parse import urlparse

        if self._conf.get("hadoop.security.authentication", "simple").lower() == "kerberos":
            raise StreamlingError(f"cannot reach {path} without Spark: the cluster uses Kerberos, and the bundle CLI "
                                  "and job runner reach an hdfs:// root with simple authentication only",
                                  code="storage_unsupported",
                                  hint="put the bundle root on s3a:// or on a folder mounted at the same path on every "
                                       "runner host, and keep checkpoints on HDFS with config.state_dir: hdfs://…")
        parsed = urlparse(path)
        host, kind = parsed.hostname or "", parsed.scheme.lower()
        if kind in ("webhdfs", "swebhdfs"):
            protocol = "https" if kind == "swebhdfs" else "http"
            return [f"{protocol}://{host}:{parsed.port or (9871 if kind == 'swebhdfs' else 9870)}"], parsed.path or "/"
        https = self._conf.get("dfs.http.policy", "HTTP_ONLY").upper() == "HTTPS_ONLY"
        key, port = ("dfs.namenode.https-address", 9871) if https else ("dfs.namenode.http-address", 9870)
        namenodes = [n.strip() for n in self._conf.get(f"dfs.ha.namenodes.{host}", "").split(",") if n.strip()]
        if namenodes:
            addresses = [self._conf.get(f"{key}.{host}.{nn}", "") for nn in namenodes]
            if not all(addresses):
                missing = next(f"{key}.{host}.{nn}" for nn, a in zip(namenodes, addresses, strict=True) if not a)
                raise StreamlingError(f"cannot reach {path} without Spark: HA name service '{host}' has no HTTP "
                                      f"address for each of its NameNodes", code="storage_refused",
                                      hint=f"set spark.conf 'spark.hadoop.{missing}' in the target's config")
        else:
            address = self._conf.get(f"{key}.{host}") or self._conf.get(key) or f"{host}:{port}"
            if address.startswith("0.0.0.0:"):  # the NameNode's bind-all default: it listens on the URI's host
                address = f"{host}:{address.split(':', 1)[1]}"
            addresses = [address]
        return [f"{'https' if https else 'http'}://{a}" for a in addresses], parsed.path or "/"

    def _request(self, action: str, path: str, method: str, op: str, content: bytes | None = None,
                 url: str | None = None, shown: str | None = None, **params: str) -> Any:
        """One WebHDFS call on ``path`` (or on ``url``, a DataNode's address the NameNode redirected
        to), on the first NameNode that is active; a failure names ``shown`` (default: ``path``)."""
        import httpx

        if self._client is None:
            self._client = httpx.Client(timeout=httpx.Timeout(30.0, connect=5.0))
        bases, hdfs_path = self._bases(path)
        urls = [url] if url else [f"{base}/webhdfs/v1{_quote_path(hdfs_path)}" for base in bases]
        failure: BaseException | None = None
        unanswered = False
        for target in urls:
            try:
                response = self._client.request(method, target, content=content, params=None if url else
                                                {"op": op, "user.name": self._user, **params},
                                                headers={"Content-Type": "application/octet-stream"} if content
                                                is not None else None, follow_redirects=op == "OPEN")
            except httpx.HTTPError as exc:
                failure, unanswered = OSError(f"{type(exc).__name__}: {exc}"), True
                continue
            if response.status_code < 400:
                return response
            remote = _remote_exception(response)
            if remote.startswith("StandbyException") and target != urls[-1]:
                continue
            if remote.startswith("FileNotFoundException"):
                raise FileNotFoundError(shown or path)
            failure, unanswered = OSError(f"HTTP {response.status_code} {remote}"), False
            break
        assert failure is not None
        error = storage_error(failure, action, shown or path)
        if unanswered and not url:
            error.hint = (f"check that the NameNode's WebHDFS at {' or '.join(bases)} answers from this host; if it "
                          "listens elsewhere, set spark.conf 'spark.hadoop.dfs.namenode.http-address' in the target's "
                          "config")
        raise error from failure

    def check_root(self, path: str) -> None:
        """Refuse a NameNode that does not answer, or refuses this user, before anything is written."""
        self._status(path.split("://", 1)[0] + "://" + path.split("://", 1)[1].split("/", 1)[0] + "/")

    def _status(self, path: str) -> dict[str, Any] | None:
        try:
            return dict(self._request("look up", path, "GET", "GETFILESTATUS").json()["FileStatus"])
        except FileNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        return self._status(path) is not None

    def read_bytes(self, path: str) -> bytes:
        return bytes(self._request("read", path, "GET", "OPEN").content)

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` as readers see it: whole or not at all. The bytes go to a
        file beside it, which then replaces it in one NameNode operation (rename with overwrite)."""
        import uuid

        temporary = f"{path}._streamling-{uuid.uuid4().hex[:12]}.tmp"
        created = self._request("write", temporary, "PUT", "CREATE", shown=path, overwrite="true")
        location = created.headers.get("location")
        if created.status_code != 307 or not location:
            raise storage_error(OSError(f"HTTP {created.status_code}: the NameNode did not name a DataNode to write "
                                        "to"), "write", path)
        try:
            self._request("write", temporary, "PUT", "CREATE", content=data, url=location, shown=path)
            self._request("write", temporary, "PUT", "RENAME", shown=path, destination=_hdfs_path(path),
                          renameoptions="OVERWRITE")
        except StreamlingError:
            # stopped half-way: ``path`` is as it was; the partial file beside it goes (if it can)
            with contextlib.suppress(StreamlingError, FileNotFoundError):
                self.delete(temporary)
            raise

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def _list(self, path: str) -> list[dict[str, Any]]:
        try:
            statuses = self._request("list", path, "GET", "LISTSTATUS").json()["FileStatuses"]["FileStatus"]
        except FileNotFoundError:
            return []
        return [dict(s) for s in statuses]

    def list_names(self, path: str) -> list[str]:
        return [str(s["pathSuffix"]) for s in self._list(path)]

    def files(self, path: str) -> list[str]:
        """Every file under folder ``path``, as paths relative to it (``[]`` when there is none)."""
        found: list[str] = []
        folders = [""]
        while folders:
            rel = folders.pop()
            for status in self._list(join(path, rel) if rel else path):
                child = f"{rel}/{status['pathSuffix']}" if rel else str(status["pathSuffix"])
                (folders if status["type"] == "DIRECTORY" else found).append(child)
        return sorted(found)

    def mkdirs(self, path: str) -> None:
        self._request("create", path, "PUT", "MKDIRS")

    def delete(self, path: str) -> None:
        self._request("delete", path, "DELETE", "DELETE", recursive="true")


def _hdfs_path(uri: str) -> str:
    from urllib.parse import urlparse

    return urlparse(uri).path or "/"


def _quote_path(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="/")


def _remote_exception(response: Any) -> str:
    """``Name: message`` of the RemoteException a WebHDFS error carries (else the body's start)."""
    try:
        remote = response.json()["RemoteException"]
        return f"{remote.get('exception', '')}: {remote.get('message', '')}"
    except (ValueError, KeyError, TypeError):
        return response.text[:200]
