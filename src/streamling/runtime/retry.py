"""Retry with exponential backoff for transient failures (refused connections, timeouts).

The flow is the only place that retries (``call_with_retry``, on tenacity): nodes raise
``StreamlingError(retriable=…)`` and never loop themselves, so one policy (``retry.*``) decides how
many attempts an outage costs.

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

from streamling.config.sections import RetrySettings
from streamling.errors import StreamlingError, first_line, is_retriable

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


def backoff_delay(policy: RetrySettings, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based): exponential from
    ``initial_backoff_ms`` up to ``max_backoff_ms``, with ±20 % jitter."""
    initial = max(0.001, policy.initial_backoff_ms / 1000)
    cap = max(initial, policy.max_backoff_ms / 1000)
    return float(min(cap, initial * 2 ** (attempt - 1)) * (0.8 + 0.4 * random.random()))


def call_with_retry(fn: Callable[[], T], policy: RetrySettings, what: str,
                    on_retry: Callable[[BaseException, int], None] | None = None) -> T:
    """Run ``fn``; on a retriable error wait and try again, up to ``policy.max_attempts`` in all.

    The one retry loop for external systems: sinks, state backends and dynamic tables only classify
    their failures (``StreamlingError.retriable``), so an outage costs exactly these attempts.
    Waits grow exponentially from ``initial_backoff_ms`` to ``max_backoff_ms`` with jitter. When the
    attempts run out, the last error is raised with "gave up after N attempts" in its context; a
    stop request ends the loop instead of the next attempt (``StreamlingError`` code ``stopped``,
    naming the failing node and chained to the last failure).
    """
    import tenacity

    def wait(state: tenacity.RetryCallState) -> float:
        return backoff_delay(policy, state.attempt_number)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        assert exc is not None
        delay = state.upcoming_sleep
        if _stop.is_set():
            raise _stop_from(exc, what)
        log.warning("%s failed (attempt %d/%d), retrying in %.1fs: %s", what, state.attempt_number,
                    policy.max_attempts, delay, first_line(exc))
        if on_retry is not None:
            on_retry(exc, state.attempt_number)

    def sleep(delay: float) -> None:
        if _stop.wait(max(0.0, delay)):
            raise _Interrupted

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts), wait=wait, sleep=sleep,
        retry=tenacity.retry_if_exception(is_retriable), before_sleep=before_sleep, reraise=True)
    last: list[BaseException] = []
    try:
        for attempt in retrying:
            with attempt:
                try:
                    return fn()
                except BaseException as exc:
                    last[:] = [exc]
                    raise
    except _Interrupted:
        raise _stop_from(last[0], what) from last[0]
    except StreamlingError as exc:
        if exc.retriable and exc.code != STOPPED and policy.max_attempts > 1:
            exc.add_context(f"{what} (gave up after {policy.max_attempts} attempts)")
        raise
    raise AssertionError("unreachable")


class _Interrupted(Exception):
    """A backoff wait cut short by a stop request (turned into ``stopped`` above)."""


def _stop_from(exc: BaseException, what: str) -> StreamlingError:
    """``stopped``, on the node whose failure was being retried."""
    node = exc.node if isinstance(exc, StreamlingError) else None
    kind = exc.node_kind if isinstance(exc, StreamlingError) else None
    stop = stopped_error(what, node, kind)
    stop.__cause__ = exc
    return stop
