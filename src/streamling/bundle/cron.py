"""Quartz cron expressions, as Databricks writes job schedules, evaluated with croniter.

Quartz has a seconds field first, an optional year last, ``?`` for "no specific value" and
numbers days of the week 1 (Sunday) to 7 (Saturday); croniter numbers them 0 to 6. The
translation is the only thing done here: the calendar arithmetic is croniter's.
"""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from streamling.errors import StreamlingError

_DOW_NUMBER = re.compile(r"(?<![#\d])([1-7])(?!\d)")


def _dow(field: str) -> str:
    """Quartz 1-7 (SUN=1) → cron 0-6 (SUN=0); names (MON-FRI), ``L`` and ``#n`` carry over."""
    return _DOW_NUMBER.sub(lambda m: str(int(m.group(1)) - 1), field)


class QuartzSchedule:
    """``next_after(t)``: the first fire time strictly after ``t`` in the schedule's time zone."""

    def __init__(self, expression: str, timezone_id: str = "UTC") -> None:
        self.expression = expression
        fields = expression.split()
        if len(fields) not in (6, 7):
            raise StreamlingError(
                f"quartz_cron_expression '{expression}' has {len(fields)} fields; Quartz expects 6 or 7 "
                "(seconds minutes hours day-of-month month day-of-week [year])",
                code="bundle_cron", hint="e.g. '0 0/15 * * * ?' fires every 15 minutes")
        try:
            self.zone = ZoneInfo(timezone_id)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise StreamlingError(f"timezone_id '{timezone_id}' is not a known time zone", code="bundle_cron",
                                  hint="use an IANA name such as 'UTC' or 'Europe/Paris'") from exc
        fields = [f.replace("?", "*") for f in fields]
        fields[5] = _dow(fields[5])
        self._cron = " ".join(fields)
        try:
            croniter(self._cron, datetime.now(self.zone), second_at_beginning=True).get_next(datetime)
        except Exception as exc:  # noqa: BLE001 - croniter raises several types for bad input
            raise StreamlingError(f"quartz_cron_expression '{expression}' is not valid: {exc}",
                                  code="bundle_cron", hint="check each field against the Quartz syntax") from exc

    def next_after(self, moment: datetime) -> datetime:
        start = moment.astimezone(self.zone)
        return croniter(self._cron, start, second_at_beginning=True).get_next(datetime)  # type: ignore[no-any-return]
