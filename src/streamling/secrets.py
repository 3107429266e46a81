"""Secret scopes of a bundle target: what ``dbutils.secrets`` reads in its jobs.

Databricks keeps secrets in scopes of its workspace; here a target root keeps them in
``<root_path>/secrets/<scope>.json`` — a folder and files only the owning user can read or list
(0700 / 0600, written atomically), never copied into deployments, run records, logs or
``bundle summary``. ``resources.secret_scopes`` declares the scopes a bundle needs (``deploy``
creates the missing ones, empty); ``streamling bundle secrets put-secret SCOPE KEY`` (value from
``--string-value`` or stdin, as the Databricks CLI reads it), ``list-secrets``, ``delete-secret``,
``list-scopes``, ``create-scope`` and ``delete-scope`` manage them.

A job's driver finds the store through ``STREAMLING_SECRETS_DIR`` (set by the runner's driver), and
every value a task reads is redacted from what the task prints or logs: ``[REDACTED]``, as Databricks
shows secrets in notebook output.
"""

from __future__ import annotations

import base64
import builtins
import io
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from streamling.errors import StreamlingError
from streamling.util import write_private

SECRETS_DIR_ENV = "STREAMLING_SECRETS_DIR"
REDACTED = "[REDACTED]"
_NAME = re.compile(r"^[A-Za-z0-9_.\-@]{1,128}$")


class SecretStore:
    """The scopes under one folder (a target root's ``secrets/``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _scope_file(self, scope: str) -> Path:
        _check_name(scope, "scope")
        return self.folder / f"{scope}.json"

    def _read(self, scope: str) -> dict[str, str]:
        path = self._scope_file(scope)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise StreamlingError(f"secret scope '{scope}' does not exist{self._known()}", code="secret_scope_missing",
                                  hint=f"create it with `streamling bundle secrets create-scope {scope}` or declare "
                                       "it under resources.secret_scopes and deploy") from None
        return {str(k): str(v) for k, v in dict(data).items()}

    def _write(self, scope: str, values: dict[str, str]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        write_private(self._scope_file(scope), json.dumps(values))

    def _known(self) -> str:
        scopes = self.scopes()
        return f" (scopes: {', '.join(scopes)})" if scopes else " (there are no scopes)"

    def scopes(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if not p.name.startswith("."))

    def create_scope(self, scope: str) -> bool:
        """Create ``scope`` empty; False when it exists already."""
        if self._scope_file(scope).exists():
            return False
        self._write(scope, {})
        return True

    def delete_scope(self, scope: str) -> None:
        self._read(scope)
        self._scope_file(scope).unlink()

    def put(self, scope: str, key: str, value: str) -> None:
        _check_name(key, "key")
        values = self._read(scope)
        values[key] = value
        self._write(scope, values)

    def delete(self, scope: str, key: str) -> None:
        values = self._read(scope)
        if values.pop(key, None) is None:
            raise StreamlingError(f"secret scope '{scope}' has no key '{key}'", code="secret_missing")
        self._write(scope, values)

    def keys(self, scope: str) -> list[str]:
        return sorted(self._read(scope))

    def get(self, scope: str, key: str) -> str:
        values = self._read(scope)
        if key not in values:
            raise StreamlingError(f"secret scope '{scope}' has no key '{key}'", code="secret_missing",
                                  hint=f"put it with `streamling bundle secrets put-secret {scope} {key}`")
        return values[key]


def _check_name(name: str, what: str) -> None:
    if not _NAME.match(name or ""):
        raise StreamlingError(f"secret {what} name {name!r} is not valid", code="secret_name",
                              hint="use up to 128 letters, digits, '-', '_', '.' and '@'")


# --- dbutils.secrets and redaction -------------------------------------------------------------------

_read_values: set[str] = set()
_lock = threading.Lock()


def remember(value: str) -> None:
    """A secret value a task read: redacted from its output from now on."""
    if len(value) >= 3:  # one or two characters would redact half the log
        with _lock:
            _read_values.add(value)


def redact(text: str) -> str:
    with _lock:
        values = sorted(_read_values, key=len, reverse=True)
    for value in values:
        text = text.replace(value, REDACTED)
    return text


class RedactingStream(io.TextIOBase):
    """A text stream that writes through with every secret read so far replaced by ``[REDACTED]``."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def store_from_env(environ: dict[str, str] | None = None) -> SecretStore:
    env = os.environ if environ is None else environ
    folder = env.get(SECRETS_DIR_ENV)
    if not folder:
        raise StreamlingError("dbutils.secrets has no secret store here: secrets are read in a bundle job's tasks",
                              code="secret_store_missing",
                              hint=f"run this as a bundle job, or set {SECRETS_DIR_ENV} to a target root's "
                                   "secrets folder")
    return SecretStore(Path(folder))


class Secrets:
    """``dbutils.secrets``: ``get``, ``getBytes``, ``list`` (keys), ``listScopes`` as on Databricks."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self._environ = environ

    def get(self, scope: str, key: str) -> str:
        value = store_from_env(self._environ).get(scope, key)
        remember(value)
        return value

    def getBytes(self, scope: str, key: str) -> bytes:  # noqa: N802 - Databricks' name
        """The value's bytes: a value put as ``--bytes-value`` (base64) decodes, text encodes as UTF-8."""
        value = self.get(scope, key)
        if value.startswith("base64:"):
            return base64.b64decode(value[len("base64:"):])
        return value.encode("utf-8")

    def list(self, scope: str) -> list[SecretMetadata]:
        return [SecretMetadata(k) for k in store_from_env(self._environ).keys(scope)]

    def listScopes(self) -> builtins.list[SecretScope]:  # noqa: N802 - Databricks' name
        return [SecretScope(s) for s in store_from_env(self._environ).scopes()]

    def __repr__(self) -> str:
        return "<streamling dbutils.secrets: get, getBytes, list, listScopes>"


@dataclass(frozen=True)
class SecretMetadata:
    """What ``dbutils.secrets.list`` returns per key (Databricks' ``SecretMetadata(key=…)``)."""

    key: str


@dataclass(frozen=True)
class SecretScope:
    """What ``dbutils.secrets.listScopes`` returns per scope (Databricks' ``SecretScope(name=…)``)."""

    name: str
