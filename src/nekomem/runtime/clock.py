"""Injectable clocks: every timer, decay and schedule reads time through one of these."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current wall-clock time, timezone-aware (UTC)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for idle timers and schedules)."""


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; used by tests to exercise decay and timers.

    ``advance`` moves both the wall clock and the monotonic clock.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        if self._now.tzinfo is None:
            self._now = self._now.replace(tzinfo=timezone.utc)
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float = 0.0, **delta: float) -> None:
        step = timedelta(seconds=seconds, **delta)
        with self._lock:
            self._now += step
            self._mono += step.total_seconds()

    def set(self, when: datetime) -> None:
        with self._lock:
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            self._mono += max(0.0, (when - self._now).total_seconds())
            self._now = when


def iso(dt: datetime) -> str:
    """ISO 8601 in UTC with offset, the one timestamp format written to disk."""
    return dt.astimezone(timezone.utc).isoformat()
