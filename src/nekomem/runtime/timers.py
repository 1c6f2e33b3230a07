"""One process-wide timer: delayed and periodic work without a thread or a tick per actor.

A timer is a callback due at a time on one of two bases: the injectable clock (domain time:
synthesis, sweeps, idle triggers, retries; a :class:`~nekomem.runtime.clock.ManualClock`
fires what is due when a test advances it, on the test's thread, so tests are
deterministic) or real monotonic time (I/O batching such as view flushes, which must happen
whatever a manual clock says). One thread sleeps until the earliest real deadline. Callbacks
must be short and must not block: they post a message to an actor and return.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from nekomem.runtime.clock import Clock, ManualClock

log = logging.getLogger("nekomem.timers")


def _nothing() -> None:
    pass


class TimerHandle:
    """What :meth:`Timers.call_at` returns; ``cancel()`` makes the callback not run."""

    __slots__ = ("due", "real", "callback", "cancelled")

    def __init__(self, due: float, real: bool, callback: Callable[[], None]) -> None:
        self.due = due
        self.real = real
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        # A cancelled timer stays in the heap until its time: it must not keep what the
        # callback refers to (a stopped actor's whole state) alive until then.
        self.callback = _nothing


_Entry = tuple[float, int, TimerHandle]


class Timers:
    """Heaps of pending timers, one per time base, and the thread that fires them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._manual = isinstance(clock, ManualClock)
        self._domain: list[_Entry] = []
        self._real: list[_Entry] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.fired = 0
        self._compact_at = 1024
        if isinstance(clock, ManualClock):
            clock.on_advance(self.run_due)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nekomem-timers", daemon=True)
        self._thread.start()

    def call_at(self, due: float, callback: Callable[[], None], *, real: bool = False) -> TimerHandle:
        """Run ``callback`` once at ``due``: on the clock's monotonic scale, or on
        ``time.monotonic()`` when ``real``."""
        handle = TimerHandle(due, real, callback)
        heap = self._real if real or not self._manual else self._domain
        with self._cond:
            if len(heap) >= self._compact_at:
                # Cancelled timers stay in the heap until their time; drop them in bulk.
                heap[:] = [entry for entry in heap if not entry[2].cancelled]
                heapq.heapify(heap)
                self._compact_at = max(1024, 2 * len(heap))
            heapq.heappush(heap, (due, next(self._seq), handle))
            if heap[0][2] is handle:
                self._cond.notify()
        return handle

    def call_later(self, delay: float, callback: Callable[[], None], *, real: bool = False) -> TimerHandle:
        now = time.monotonic() if real else self.clock.monotonic()
        return self.call_at(now + max(0.0, delay), callback, real=real)

    def pending(self) -> int:
        """Timers not yet fired or dropped (cancelled ones count until their time)."""
        with self._cond:
            return len(self._domain) + len(self._real)

    def run_due(self) -> int:
        """Fire every timer that is due now, on the calling thread; returns how many ran."""
        due: list[TimerHandle] = []
        with self._cond:
            self._pop_due(self._real, time.monotonic(), due)
            self._pop_due(self._domain, self.clock.monotonic(), due)
        for handle in due:
            try:
                handle.callback()
            except Exception:
                log.exception("a timer callback failed")
        self.fired += len(due)
        return len(due)

    @staticmethod
    def _pop_due(heap: list[_Entry], now: float, out: list[TimerHandle]) -> None:
        while heap and (heap[0][2].cancelled or heap[0][0] <= now):
            handle = heapq.heappop(heap)[2]
            if not handle.cancelled:
                out.append(handle)

    def _wait_seconds(self) -> float | None:
        # Called with the lock held. Domain timers of a manual clock fire on advance().
        while self._real and self._real[0][2].cancelled:
            heapq.heappop(self._real)
        if not self._real:
            return None
        return max(0.0, self._real[0][0] - time.monotonic())

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                wait = self._wait_seconds()
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
            self.run_due()

    def stop(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)


class Wakeup:
    """One actor's alarm: keeps a single timer armed at the actor's next due time.

    The actor calls :meth:`want` after each message with when it next has work (None:
    nothing). ``fire`` (which posts the actor its wake-up message) runs only when that time
    has come: a timer that finds the wanted time moved later re-arms instead of waking the
    actor, so an actor with nothing due receives no message. Work that is already due when
    asked for waits ``floor`` real seconds: a retry after "the pool is full" backs off, and
    a gate that stays open cannot spin.
    """

    def __init__(self, timers: Timers, fire: Callable[[], None], *, real: bool, floor: float) -> None:
        self._timers = timers
        self._fire = fire
        self._real = real
        self._floor = floor
        self._lock = threading.Lock()
        self._want: float | None = None
        self._armed: TimerHandle | None = None
        self._closed = False
        self.retrying = False  # armed for work that was already due (see quiesce)

    def _now(self) -> float:
        return time.monotonic() if self._real else self._timers.clock.monotonic()

    def want(self, due: float | None) -> None:
        # Called after every message, and usually with what was wanted before: answer
        # those without the lock. Each check reads attributes once (atomic under the GIL);
        # a timer firing meanwhile is ordered before or after this call, as with the lock.
        if due == self._want:
            if due is None:
                return
            armed = self._armed
            if armed is not None and not armed.cancelled and armed.real == self._real and armed.due <= due and due > self._now():
                return
        with self._lock:
            if self._closed:
                return
            self._want = due
            if due is None:
                return
            if due <= self._now():
                # Already due: wake after the floor, on real time (a manual clock that does
                # not move must not hold back work that is due).
                target, real = time.monotonic() + self._floor, True
            else:
                target, real = due, self._real
            armed = self._armed
            if armed is not None and not armed.cancelled and (armed.real == real and armed.due <= target):
                return
            if armed is not None:
                armed.cancel()
            self._armed = self._arm(target, real)
            self.retrying = due <= self._now()

    def _arm(self, due: float, real: bool) -> TimerHandle:
        box: list[TimerHandle] = []
        handle = self._timers.call_at(due, lambda: self._on_timer(box[0]), real=real)
        box.append(handle)
        return handle

    def _on_timer(self, handle: TimerHandle) -> None:
        with self._lock:
            if handle is not self._armed or self._closed:
                return
            self._armed = None
            self.retrying = False
            want = self._want
            if want is None:
                return
            if want > self._now():
                self._armed = self._arm(want, self._real)
                return
            self._want = None
        self._fire()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.retrying = False
            if self._armed is not None:
                self._armed.cancel()
                self._armed = None
