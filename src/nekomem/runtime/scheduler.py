"""The scheduler: one thread that ticks every active character and passivates idle ones.

Periodic per-character work (compression when idle, fact batches, synthesis, sweeps)
is decided by each child on its Tick from the injectable clock, so a test that moves a
ManualClock triggers it without sleeping for real.
"""

from __future__ import annotations

import logging
import threading

from nekomem.runtime.registry import CharacterRegistry

log = logging.getLogger("nekomem.scheduler")


class Scheduler:
    def __init__(self, registry: CharacterRegistry, tick_seconds: float) -> None:
        self.registry = registry
        self.tick_seconds = tick_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nekomem-scheduler", daemon=True)
        self._thread.start()

    def tick_now(self) -> None:
        """Run one tick on the calling thread (tests, and the scheduler loop)."""
        self.registry.tick()
        self.registry.sweep()
        self.ticks += 1

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            try:
                self.tick_now()
            except Exception:  # noqa: BLE001 - the scheduler must outlive one bad tick
                log.exception("scheduler tick failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
