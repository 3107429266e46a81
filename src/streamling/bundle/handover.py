"""The hot-redeploy handshake between the job runner and a running driver: two files next to its log.

``<log>.swap`` is the runner's request ("swap in deployment N"); ``<log>.deployment`` is the
driver's status: the deployment it runs, and its answer to the newest request (``running`` once
the new one runs, ``failed`` when it did not check out — the old one keeps running — or
``needs_restart`` when the change needs a new JVM). Files rather than signals or the run store:
both outlive a runner restart (the next runner reads where the handshake stands), and the runner
stays the only writer of run state. A driver that never wrote a status cannot swap (a plain CLI or
Python task, or a driver older than the handshake); the runner restarts those.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streamling.config import Settings

RUNNING = "running"
FAILED = "failed"
NEEDS_RESTART = "needs_restart"


def request_file(log_path: Path | str) -> Path:
    return Path(f"{log_path}.swap")


def status_file(log_path: Path | str) -> Path:
    return Path(f"{log_path}.deployment")


def write(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically: the other side never reads half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def restart_reasons(running: Settings, new: Settings) -> list[str]:
    """What in ``new`` a warm driver cannot apply: Spark settings are fixed when its JVM starts (a
    reused SparkSession ignores new ones), and plugin modules are imported once per process."""
    reasons: list[str] = []
    for key in ("master", "shuffle_partitions"):
        before, after = getattr(running.spark, key), getattr(new.spark, key)
        if before != after:
            reasons.append(f"spark.{key} changed ({before} → {after})")
    old_conf, new_conf = running.spark.conf, new.spark.conf
    changed = sorted(k for k in set(old_conf) | set(new_conf) if old_conf.get(k) != new_conf.get(k))
    if changed:  # keys only: a conf value may be a credential
        reasons.append(f"spark.conf changed ({', '.join(changed)})")
    if running.plugin.path != new.plugin.path:  # options of loaded plugins apply per run: those can swap
        reasons.append(f"plugin.path changed ({running.plugin.path} → {new.plugin.path})")
    return reasons
