"""Full garbage collections on the process timer instead of on allocation growth.

CPython runs a full collection (a walk of every live tracked object, holding the
interpreter lock, so every request in flight waits) whenever the objects that survived
the younger generations have grown by a quarter since the last one. A server that
activates characters grows in exactly that way: activating 1,000 characters ran seven full
collections, the last ones 0.2–0.3 s each on a 2-core machine. Young garbage is still
collected by generations 0 and 1 as before; the full collections, which reclaim cycles
among old objects (the actors of a stopped character, for instance), run here instead:

- at most every ``every_seconds``, and only when the younger collections ran since the
  last full one (the process did something);
- sooner, once the characters stopped since the last full collection reach a quarter of
  those still active (the same "grew by a quarter" rule, counted in characters).

``gc_full_collection_seconds = 0`` keeps Python's own rule.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from nekomem.runtime.timers import TimerHandle, Timers

log = logging.getLogger("nekomem.collector")

# Above any count generation 2 reaches in practice: its automatic collection never runs.
_NEVER = 2**30
# The thresholds are the interpreter's: switched off by the first running instance and
# restored by the last one to stop (tests run several runtimes in one process).
_switch_lock = threading.Lock()
_running = 0
_saved_thresholds: tuple[int, int, int] = (0, 0, 0)


def _switch_off() -> None:
    global _running, _saved_thresholds
    with _switch_lock:
        if _running == 0:
            _saved_thresholds = gc.get_threshold()
            gc.set_threshold(_saved_thresholds[0], _saved_thresholds[1], _NEVER)
        _running += 1


def _restore() -> None:
    global _running
    with _switch_lock:
        _running -= 1
        if _running == 0:
            gc.set_threshold(*_saved_thresholds)


def younger_collections_ran() -> bool:
    """Whether generation 1 was collected since the last full collection."""
    return gc.get_count()[2] > 0


class FullCollections:
    """Scheduled full collections (see the module docstring). ``start`` switches the
    interpreter's automatic full collections off and arms the timer; ``stop`` disarms it
    and restores the thresholds it found."""

    def __init__(self, timers: Timers, every_seconds: float, *, activity: Callable[[], bool] = younger_collections_ran) -> None:
        if every_seconds <= 0:
            raise ValueError("every_seconds must be positive")
        self.every_seconds = every_seconds
        self.runs = 0  # full collections run here (read by the tests)
        self._timers = timers
        self._activity = activity
        self._lock = threading.Lock()
        self._timer: TimerHandle | None = None
        self._stopped = 0
        self._running = False

    def start(self) -> None:
        with self._lock:
            if self._running:
                return
            self._running = True
            _switch_off()
            self._arm(self.every_seconds)

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._running:
                self._running = False
                _restore()

    def characters_stopped(self, count: int, active: int) -> None:
        """``count`` characters were stopped, ``active`` are still alive: once the stopped
        ones since the last full collection reach a quarter of the active, run one now."""
        with self._lock:
            self._stopped += count
            if self._running and self._stopped * 4 >= max(1, active):
                self._arm(0.0)

    def _arm(self, delay: float) -> None:
        # On the clock's scale (a ManualClock drives it in tests).
        due = self._timers.clock.monotonic() + delay
        if self._timer is not None:
            if self._timer.due <= due:
                return
            self._timer.cancel()
        self._timer = self._timers.call_at(due, self._fire)

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
            if not self._running:
                return
            stopped, self._stopped = self._stopped, 0
            run = stopped > 0 or self._activity()
        if run:
            started = time.perf_counter()
            found = gc.collect()
            self.runs += 1
            log.debug("full collection: %d unreachable objects, %.0f ms", found, (time.perf_counter() - started) * 1000)
        with self._lock:
            if self._running and self._timer is None:
                self._arm(self.every_seconds)
