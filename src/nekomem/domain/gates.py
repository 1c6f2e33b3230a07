"""When a background model task may run again.

No background task calls a model on a fixed tick: each asks its :class:`TaskGate` first.
A gate holds one task of one character and blocks while a call is in flight, during the
minimum interval after a call, during an exponential backoff after failures, and while
the task's input is the one a model already answered (its fingerprint is unchanged).
Plain state, no clock of its own: callers pass monotonic seconds.
"""

from __future__ import annotations

from typing import Literal

from nekomem.config.longterm import LongTermSettings

GateReason = Literal["in_flight", "min_interval", "backoff", "unchanged"]


def backoff_delay(base: float, failures: int, cap: float) -> float:
    """``base`` doubled for each failure after the first (``failures`` >= 1; fewer counts
    as one), never more than ``cap``."""
    # 2**n overflows a float for a huge n: the cap is reached long before 2**60.
    return min(cap, base * (2.0 ** min(max(failures, 1) - 1, 60)))


class TaskGate:
    """The gate of one background model task (see the module docstring).

    ``min_interval``: seconds after any answered call before the next may start.
    ``backoff_base`` / ``backoff_max``: the delay after the first failure and its cap;
    it doubles with each failure in a row. ``calls`` counts the calls started.
    """

    def __init__(self, min_interval: float, backoff_base: float, backoff_max: float) -> None:
        self.min_interval = min_interval
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.in_flight = False
        self.failures = 0
        self.not_before = float("-inf")
        self.answered: str | None = None  # fingerprint of the input last answered
        self.calls = 0
        self._asked: str | None = None

    def blocked(self, now: float, fingerprint: str | None = None) -> GateReason | None:
        """None when a call on input ``fingerprint`` may start at ``now``, else why not.
        A None fingerprint never counts as unchanged."""
        if self.in_flight:
            return "in_flight"
        if now < self.not_before:
            return "backoff" if self.failures else "min_interval"
        if fingerprint is not None and fingerprint == self.answered:
            return "unchanged"
        return None

    def start(self, fingerprint: str | None = None) -> None:
        """A call on input ``fingerprint`` was submitted."""
        self.in_flight = True
        self.calls += 1
        self._asked = fingerprint

    def not_started(self) -> None:
        """The call could not be submitted (pool full): nothing is in flight."""
        self.in_flight = False

    def answered_at(self, now: float) -> None:
        """The model answered (whatever it said): its input counts as answered, failures are
        cleared and the minimum interval starts."""
        self.in_flight = False
        self.failures = 0
        self.answered = self._asked
        self.not_before = now + self.min_interval

    def failed_at(self, now: float) -> float:
        """The call failed: one more failure in a row; returns the backoff delay."""
        self.in_flight = False
        self.failures += 1
        delay = max(self.min_interval, backoff_delay(self.backoff_base, self.failures, self.backoff_max))
        self.not_before = now + delay
        return delay

    def forget_input(self) -> None:
        """Let the same input be asked again (e.g. its earlier answer was discarded)."""
        self.answered = None


def task_gate(settings: LongTermSettings, min_interval: float = 0.0) -> TaskGate:
    """A gate with the long-term backoff settings and ``min_interval``."""
    return TaskGate(min_interval, settings.longterm_task_backoff_base_seconds, settings.longterm_task_backoff_max_seconds)
