"""Retry with exponential backoff for transient failures (refused connections, timeouts)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from streamling.config.settings import RetrySettings
from streamling.errors import is_retriable

log = logging.getLogger(__name__)
T = TypeVar("T")


def call_with_retry(fn: Callable[[], T], policy: RetrySettings, what: str,
                    on_retry: Callable[[BaseException, int], None] | None = None) -> T:
    """Run ``fn``; on a retriable error wait and try again, up to ``policy.max_attempts``."""
    delay = policy.initial_backoff_ms / 1000
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if attempt >= policy.max_attempts or not is_retriable(exc):
                raise
            log.warning("%s failed (attempt %d/%d), retrying in %.1fs: %s", what, attempt,
                        policy.max_attempts, delay, str(exc).splitlines()[0] if str(exc) else exc)
            if on_retry is not None:
                on_retry(exc, attempt)
            time.sleep(delay * (0.8 + 0.4 * random.random()))
            delay = min(delay * 2, policy.max_backoff_ms / 1000)
    raise AssertionError("unreachable")
