"""When a deployed job starts a run by itself: on its Quartz ``schedule``, every ``periodic``
interval, or, for a ``continuous`` job, as soon as its last run ended (after a back-off once runs
keep failing).

What a trigger last did is kept in the run store (job state: ``last_fire``, ``failures``,
``not_before``), so a new runner picks up where the last one left off; ``Triggers`` holds only the
parsed cron expressions between ticks. The runner hands it the live deployment each tick and
creates (and logs) the runs it asks for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from streamling.bundle.cron import QuartzSchedule
from streamling.bundle.model import unpaused
from streamling.bundle.store import Store

PERIOD_UNIT_SECS = {"MINUTES": 60, "HOURS": 3600, "DAYS": 86400, "WEEKS": 604800}
CONTINUOUS_BACKOFF_MAX_SECS = 300.0
CONTINUOUS_BACKOFF_MIN_SECS = 1.0


def continuous_backoff(failures: int, asked_secs: float) -> float:
    """Seconds before a continuous job's next run after ``failures`` consecutive failed runs.

    As Databricks does, a single failure restarts at once (a killed driver is replaced by its warm
    standby without waiting) and the back-off only starts on the second one in a row: from the
    tasks' ``min_retry_interval_millis`` (at least 1 s), doubling, at most 5 min. A job asking for
    an interval gets it after its first failure too."""
    if failures == 0 or (failures == 1 and asked_secs <= 0):
        return 0.0
    base = max(CONTINUOUS_BACKOFF_MIN_SECS, asked_secs)
    return min(CONTINUOUS_BACKOFF_MAX_SECS, base * 2 ** max(0, failures - 2 if asked_secs <= 0 else failures - 1))


class Triggers:
    """The schedules, periodic triggers and continuous jobs of the runs in ``store``.

    ``create_run(job_key, trigger, params)`` is the runner's: it creates a run of the live
    deployment and logs it."""

    def __init__(self, store: Store, create_run: Callable[[str, str, dict[str, str]], int]) -> None:
        self.store = store
        self.create_run = create_run
        self._schedules: dict[tuple[str, str], QuartzSchedule] = {}

    def fire(self, now: float, deployment: dict[str, Any] | None, draining: bool) -> None:
        """Start a run of each job whose trigger is due at ``now`` (none while the target is being
        destroyed): a continuous job without an active run once its back-off has passed, a schedule
        or periodic trigger whose next time since it last fired (or since the deployment) has come."""
        if deployment is None or draining:
            return
        deployed_at = float(deployment["created_at"])
        for key, job in deployment["jobs"].items():
            state = self.store.job_state(key)
            last = state["last_fire"] if state and state["last_fire"] else None
            if unpaused(job.get("continuous")):
                not_before = float(state["not_before"] or 0) if state else 0.0
                if not self.store.runs(key, active_only=True, limit=1) and now >= not_before:
                    self.store.set_job_state(key, last_fire=now)
                    self.create_run(key, "continuous", {})
                continue
            schedule = job.get("schedule")
            if unpaused(schedule):
                spec = (schedule["quartz_cron_expression"], schedule.get("timezone_id") or "UTC")
                cron = self._schedules.get(spec) or self._schedules.setdefault(spec, QuartzSchedule(*spec))
                due = cron.next_after(datetime.fromtimestamp(last or deployed_at, UTC)).timestamp()
                if now >= due:
                    self.store.set_job_state(key, last_fire=now)
                    self.create_run(key, "schedule", {})
            periodic = job.get("periodic")
            if unpaused(periodic):
                every = int(periodic["interval"]) * PERIOD_UNIT_SECS[periodic["unit"]]
                if now >= (last or deployed_at) + every:
                    self.store.set_job_state(key, last_fire=now)
                    self.create_run(key, "periodic", {})

    @staticmethod
    def live(deployment: dict[str, Any] | None) -> bool:
        """Whether any deployed job may still start a run by itself (the runner must not exit idle)."""
        for job in (deployment or {}).get("jobs", {}).values():
            if unpaused(job.get("continuous")) or unpaused(job.get("schedule")) or unpaused(job.get("periodic")):
                return True
        return False

    def continuous_run_ended(self, job_key: str, job: dict[str, Any], state: str) -> None:
        """Record how a continuous job's run ended: a failure in a row more, or none after any other
        end, and so when its next run may start (``continuous_backoff``)."""
        job_state = self.store.job_state(job_key)
        failures = (int(job_state["failures"]) if job_state else 0) + 1 if state == "failed" else 0
        asked = min((int(t.get("min_retry_interval_millis") or 0) for t in job["tasks"]), default=0) / 1000
        delay = continuous_backoff(failures, asked)
        self.store.set_job_state(job_key, failures=failures, not_before=time.time() + delay)
