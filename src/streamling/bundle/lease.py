"""The run store's lease, held by the job runner that supervises a shared store.

With ``job_runner.store: postgres`` runners on several hosts may run at once: the one holding the
lease supervises and renews it every tick; the others stand by until it expires
(``job_runner.lease_secs``). ``LeaseHolder`` is one runner's side of that: it waits for the lease,
renews it, and raises ``LeaseLost`` once it can no longer be sure of holding it, well before another
runner could take it over, so two runners never act at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from streamling.bundle.store import Store, StoreUnavailable

# the lease is part of the runner's log
log = logging.getLogger("streamling.bundle.runner")


class LeaseLost(Exception):
    """This runner no longer holds the store's lease: another may supervise now, so it must not."""


class LeaseHolder:
    """This runner's claim on ``store``'s lease (``secs`` long, renewed every ``tick_secs``) as
    ``holder``, a name unique to this process; ``stopped`` set ends the wait for it."""

    def __init__(self, store: Store, host: str, secs: float, tick_secs: float, stopped: threading.Event) -> None:
        self.store = store
        self.host = host
        self.secs = secs
        self.tick_secs = tick_secs
        self.stopped = stopped
        self.holder = f"{host}:{os.getpid()}:{int(time.time())}"
        self._renewed = time.monotonic()

    def take(self) -> bool:
        """Stand by until the lease is free or expired, then take it; False when stopped meanwhile."""
        announced = False
        while not self.stopped.is_set():
            try:
                generation = self.store.acquire_lease(self.holder, self.host, os.getpid(), self.secs)
            except StoreUnavailable as exc:
                log.warning("%s; trying again", exc.headline())
                generation = None
            if generation is not None:
                self._renewed = time.monotonic()
                log.info("runner %s holds the lease of %s (generation %d, %gs, renewed every %gs)", self.holder,
                         self.store.describe, generation, self.secs, self.tick_secs)
                return True
            if not announced:
                try:
                    lease = self.store.lease()
                    log.info("runner %s stands by: runner %s supervises (its lease ends in %.1fs unless renewed)",
                             self.holder, lease.holder, lease.expires_at - lease.now)
                except StoreUnavailable:
                    pass
                announced = True
            self.stopped.wait(self.tick_secs)
        return False

    def renew(self) -> None:
        """Renew the lease (nothing to do with a store of one host); ``LeaseLost`` when another holds
        it, or when it could not be renewed for half a lease."""
        if not self.store.shared:
            return
        try:
            generation = self.store.acquire_lease(self.holder, self.host, os.getpid(), self.secs)
        except StoreUnavailable:
            # Another runner may take the lease once it expires: stop acting well before that.
            if time.monotonic() - self._renewed > self.secs / 2:
                raise LeaseLost(f"the lease could not be renewed for {time.monotonic() - self._renewed:.1f}s "
                                f"(job_runner.lease_secs={self.secs:g})") from None
            raise
        if generation is None:
            raise LeaseLost("another runner holds the lease now")
        self._renewed = time.monotonic()
