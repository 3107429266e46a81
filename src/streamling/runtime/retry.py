"""Retry with exponential backoff for transient failures (refused connections, timeouts).

Backoff waits listen to one process-wide stop signal: a SIGTERM (or any ``PipelineRun.request_stop``)
must not sit behind a sink that keeps retrying an unreachable service. A wait cut short raises a
``StreamlingError`` with code ``stopped``: the epoch in flight is not committed and Spark replays it
on the next start, so stopping mid-retry loses nothing.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from streamling.config.settings import RetrySettings
from streamling.errors import StreamlingError, is_retriable

log = logging.getLogger(__name__)
T = TypeVar("T")

STOPPED = "stopped"
STOP_MESSAGE = "stop requested while retrying: the epoch was not committed; it is replayed on the next start"

#: Set by ``PipelineRun.request_stop`` (SIGTERM/SIGINT in the CLI), cleared when a run starts.
_stop = threading.Event()


def request_stop() -> None:
    """Cut every backoff wait in this process short (they raise ``stopped``)."""
    _stop.set()


def clear_stop() -> None:
    """A new run starts: earlier stop requests no longer apply."""
    _stop.clear()


def stop_requested() -> bool:
    return _stop.is_set()


def stopped_error(what: str, node: str | None = None, node_kind: str | None = None) -> StreamlingError:
    """The error a retry loop raises when a stop request interrupts it (never retried)."""
    return StreamlingError(STOP_MESSAGE, node=node, node_kind=node_kind, code=STOPPED).add_context(what)


def backoff_wait(delay_secs: float, what: str, node: str | None = None, node_kind: str | None = None) -> None:
    """Wait ``delay_secs`` before the next attempt, or raise ``stopped`` as soon as a stop is requested."""
    if _stop.wait(max(0.0, delay_secs)):
        raise stopped_error(what, node, node_kind)


def call_with_retry(fn: Callable[[], T], policy: RetrySettings, what: str,
                    on_retry: Callable[[BaseException, int], None] | None = None) -> T:
    """Run ``fn``; on a retriable error wait and try again, up to ``policy.max_attempts``.

    A stop request ends the loop instead of the next attempt (``StreamlingError`` code ``stopped``,
    chained to the last failure).
    """
    delay = policy.initial_backoff_ms / 1000
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if attempt >= policy.max_attempts or not is_retriable(exc):
                raise
            if _stop.is_set():
                raise stopped_error(what) from exc
            log.warning("%s failed (attempt %d/%d), retrying in %.1fs: %s", what, attempt,
                        policy.max_attempts, delay, str(exc).splitlines()[0] if str(exc) else exc)
            if on_retry is not None:
                on_retry(exc, attempt)
            try:
                backoff_wait(delay * (0.8 + 0.4 * random.random()), what)
            except StreamlingError as stop:
                raise stop from exc
            delay = min(delay * 2, policy.max_backoff_ms / 1000)
    raise AssertionError("unreachable")
