"""The target's secret store and dbutils.secrets: scopes, keys, redaction, and errors that say what to do."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from streamling.errors import StreamlingError
from streamling.notebook.dbutils import DBUtils
from streamling.secrets import SECRETS_DIR_ENV, RedactingStream, SecretMetadata, SecretScope, SecretStore


def test_scopes_keys_values_and_what_a_missing_one_says(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets")
    assert store.scopes() == [] and store.create_scope("app") and not store.create_scope("app")
    store.put("app", "token", "abc123")
    assert store.keys("app") == ["token"] and store.get("app", "token") == "abc123"
    with pytest.raises(StreamlingError, match=r"secret scope 'nope' does not exist \(scopes: app\)"):
        store.get("nope", "token")
    with pytest.raises(StreamlingError, match="secret scope 'app' has no key 'other'"):
        store.get("app", "other")
    with pytest.raises(StreamlingError, match="secret key name 'a b' is not valid"):
        store.put("app", "a b", "x")
    store.delete("app", "token")
    assert store.keys("app") == []
    store.delete_scope("app")
    assert store.scopes() == []


def test_dbutils_secrets_read_the_store_and_redact_what_was_read(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.create_scope("db")
    store.put("db", "password", "hunter2-long")
    store.put("db", "cert", "base64:AAEC")
    dbutils = DBUtils({SECRETS_DIR_ENV: str(tmp_path)})
    out = io.StringIO()
    stream = RedactingStream(out)
    stream.write("before: hunter2-long\n")  # not read yet: nothing to redact
    assert dbutils.secrets.get("db", "password") == "hunter2-long"
    stream.write("after: hunter2-long\n")
    assert out.getvalue() == "before: hunter2-long\nafter: [REDACTED]\n"
    assert dbutils.secrets.getBytes("db", "cert") == bytes([0, 1, 2])
    assert dbutils.secrets.list("db") == [SecretMetadata("cert"), SecretMetadata("password")]
    assert dbutils.secrets.listScopes() == [SecretScope("db")]


def test_outside_a_job_dbutils_secrets_says_where_secrets_come_from() -> None:
    with pytest.raises(StreamlingError, match="dbutils.secrets has no secret store here"):
        DBUtils({}).secrets.get("db", "password")
