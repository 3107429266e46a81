"""What a job's ``email_notifications`` and ``webhook_notifications`` do when its runs start and end.

Each event (``on_start``, ``on_success``, ``on_failure``) is recorded in the run store once per
address or URL. Emails are recorded only (no mail is sent from here). Webhooks are posted from a
thread of their own, once each and best effort, so a slow or dead endpoint never holds up the
supervision loop; a URL may carry credentials, and only its redacted form reaches the log and the
store (``streamling.http.client.post_notification``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from streamling.bundle.store import Store

# a failed webhook is part of the runner's log
log = logging.getLogger("streamling.bundle.runner")


class Notifications:
    """The notifications of the runs in ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def notify(self, run_id: int, job: dict[str, Any], event: str, state: str, deployment: dict[str, Any] | None,
               version: int | None) -> None:
        """Record and send what ``job`` asks for on ``event`` of run ``run_id``, now in ``state``;
        the payload names the live deployment ``version`` and its bundle and target."""
        run = self.store.run(run_id)
        payload = {"event": event, "job": {"key": run.job_key if run else None, "name": job.get("name")},
                   "run": {"id": run_id, "state": state, "message": run.message if run else None,
                           "trigger": run.trigger if run else None, "deployment": version},
                   "bundle": (deployment or {}).get("name"), "target": (deployment or {}).get("target")}
        for address in (job.get("email_notifications") or {}).get(event, []):
            self.store.notification(run_id, event, "email", address, "recorded", json.dumps(payload))
        urls = (job.get("webhook_notifications") or {}).get(event, [])
        if urls:
            threading.Thread(target=self.send_webhooks, args=(run_id, event, list(urls), payload), daemon=True).start()

    def send_webhooks(self, run_id: int, event: str, urls: list[str], payload: dict[str, Any]) -> None:
        """Post ``payload`` to each URL in turn and record how each went (blocks: ``notify`` runs it
        in a thread)."""
        from streamling.http.client import post_notification

        for url in urls:
            # A webhook URL may carry credentials (user:password@, a token in the query): the log
            # and the run store get only what post_notification answers, which never holds them.
            delivery = post_notification(url, payload)
            if not delivery.sent:
                log.warning("run %d: %s webhook to %s failed: %s", run_id, event, delivery.url, delivery.detail)
            self.store.notification(run_id, event, "webhook", delivery.url, "sent" if delivery.sent else "failed",
                                    delivery.detail)
