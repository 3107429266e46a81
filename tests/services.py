"""Helpers shared by the integration conftests that start services with ``fixtures/services/up``.

``up`` prints only ``export NAME=value`` lines (shell-quoted) on stdout and logs to stderr. The
parsed exports are handed to tests through fixtures rather than written into ``os.environ``, so tests
that read default settings from the environment are unaffected.

Importable as ``services`` from any test or conftest: pytest puts ``tests/`` on ``sys.path`` for
``tests/conftest.py`` (the test folders are not packages).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
UP = ROOT / "fixtures" / "services" / "up"


def parse_exports(text: str) -> dict[str, str]:
    """``export NAME=value`` lines (shell-quoted) → a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            out[name] = value
    return out


def start_services(*names: str, timeout: float = 600) -> dict[str, str]:
    """Run ``fixtures/services/up NAMES…`` (reusing running services) and return its exports.

    Fails the calling test, with the script's last log lines, when a service cannot be started.
    """
    env = {**os.environ, "STREAMLING_CACHE_DIR": os.environ.get("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))}
    command = [str(UP), *names]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"fixtures/services/up {' '.join(names)} failed:\n{proc.stderr[-3000:]}")
    return parse_exports(proc.stdout)


def s3a_conf(s3: dict[str, str]) -> dict[str, str]:
    """The Spark settings that reach the test store (``up s3``'s exports) through ``s3a://``, as a
    user sets them: its endpoint and credentials, path-style access over plain HTTP, and no retry
    storm against a store that refuses. The jars (``STREAMLING_TEST_S3A_JARS``) are the caller's."""
    return {"spark.hadoop.fs.s3a.endpoint": s3["STREAMLING_TEST_S3_ENDPOINT"],
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.access.key": s3["STREAMLING_TEST_S3_ACCESS_KEY"],
            "spark.hadoop.fs.s3a.secret.key": s3["STREAMLING_TEST_S3_SECRET_KEY"],
            "spark.hadoop.fs.s3a.attempts.maximum": "1", "spark.hadoop.fs.s3a.retry.limit": "1"}


def delta_table_on_s3(s3: dict[str, str], uri: str) -> Any:
    """The rows of the Delta table at ``uri`` (``s3a://…`` on the test store) as a pyarrow Table, read
    as any Delta reader does, without a JVM: the data files its log's commits add and do not remove."""
    import json
    from urllib.parse import unquote, urlparse

    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    endpoint = urlparse(s3["STREAMLING_TEST_S3_ENDPOINT"])
    fs = pafs.S3FileSystem(access_key=s3["STREAMLING_TEST_S3_ACCESS_KEY"],
                           secret_key=s3["STREAMLING_TEST_S3_SECRET_KEY"], endpoint_override=endpoint.netloc,
                           scheme=endpoint.scheme, region="us-east-1")
    table = uri.split("://", 1)[1].rstrip("/")
    log = fs.get_file_info(pafs.FileSelector(f"{table}/_delta_log"))
    live: dict[str, None] = {}
    for commit in sorted(f.path for f in log if f.path.endswith(".json")):
        with fs.open_input_stream(commit) as stream:
            for line in stream.read().decode().splitlines():
                action = json.loads(line)
                if "add" in action:
                    live[action["add"]["path"]] = None
                elif "remove" in action:
                    live.pop(action["remove"]["path"], None)
    return pa.concat_tables([pq.read_table(f"{table}/{unquote(p)}", filesystem=fs) for p in live])
