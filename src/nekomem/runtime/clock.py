"""Injectable clocks: every timer, decay and schedule reads time through one of these."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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

    ``advance`` moves both the wall clock and the monotonic clock, then runs the
    ``on_advance`` listeners (the process timer fires what became due) on the caller's
    thread, so a test that advances the clock has every due timer posted when it returns.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        if self._now.tzinfo is None:
            self._now = self._now.replace(tzinfo=timezone.utc)
        self._mono = 1000.0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], object]] = []

    def on_advance(self, listener: Callable[[], object]) -> None:
        """Call ``listener()`` after every advance or set."""
        self._listeners.append(listener)

    def _moved(self) -> None:
        for listener in list(self._listeners):
            listener()

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
        self._moved()

    def set(self, when: datetime) -> None:
        with self._lock:
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            self._mono += max(0.0, (when - self._now).total_seconds())
            self._now = when
        self._moved()


def iso(dt: datetime) -> str:
    """ISO 8601 in UTC with offset, the one timestamp format written to disk."""
    return dt.astimezone(timezone.utc).isoformat()
