"""Callbacks at real-time deadlines, run by one daemon thread.

Used for waits on a model on this machine (a query's embedding): real time, not the
injectable clock, so that a ManualClock that never moves cannot leave a caller waiting
forever.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

import pykka

log = logging.getLogger("nekomem.runtime.deadlines")


class Deadlines:
    """Runs each scheduled callback once, after its delay, on a shared daemon thread."""

    def __init__(self, name: str = "nekomem-deadlines") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in ``delay`` seconds (the thread starts on first use). An
        exception from the callback is logged, never raised: a late timeout to a stopped
        actor is harmless (DEBUG), anything else is a WARNING naming its type."""
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def stop(self) -> None:
        """End the thread; deadlines not yet due never run (their actors have stopped)."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                due, _, callback = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            try:
                callback()
            except pykka.ActorDeadError:
                log.debug("a deadline came after its actor stopped")
            except Exception as exc:  # noqa: BLE001 - the one thread serves every character's deadlines: it goes on
                log.warning("a deadline callback raised %s", type(exc).__name__)
