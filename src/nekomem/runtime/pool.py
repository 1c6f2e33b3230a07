"""The bounded worker pool that runs model (LLM and embedding) calls off the actors.

No actor waits on a model call: it submits a job here and receives the result later as a
message (through the ``on_done`` callback it passed). Each character has its own FIFO and
may run at most ``per_key`` jobs at once, so one character with a slow model cannot take
every worker from the others.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger("nekomem.pool")

Job = Callable[[], Any]
Done = Callable[[Any, BaseException | None], None]


class PoolFull(RuntimeError):
    """The pool's queue is at its limit; the caller should retry later."""


class ModelPool:
    def __init__(self, workers: int, queue_max: int, per_key: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nekomem-model")
        self._queue_max = queue_max
        self._per_key = per_key
        self._lock = threading.Lock()
        self._waiting: dict[str, collections.deque[tuple[Job, Done]]] = {}
        self._running: dict[str, int] = {}
        self._queued = 0
        self._closed = False

    def submit(self, key: str, job: Job, on_done: Done) -> None:
        """Queue ``job`` for ``key`` (a character name); ``on_done(result, error)`` runs on the
        worker thread when it ends. Raises PoolFull when the queue is at its limit."""
        with self._lock:
            if self._closed:
                raise PoolFull("the model pool is shut down")
            if self._queued >= self._queue_max:
                raise PoolFull(f"{self._queued} model jobs are waiting")
            self._waiting.setdefault(key, collections.deque()).append((job, on_done))
            self._queued += 1
            self._pump(key)

    def busy(self, key: str) -> int:
        """Jobs of ``key`` waiting or running."""
        with self._lock:
            return self._running.get(key, 0) + len(self._waiting.get(key, ()))

    def total_busy(self) -> int:
        with self._lock:
            return self._queued + sum(self._running.values())

    def _pump(self, key: str) -> None:
        # Called with the lock held.
        queue = self._waiting.get(key)
        while queue and self._running.get(key, 0) < self._per_key:
            job, on_done = queue.popleft()
            self._queued -= 1
            self._running[key] = self._running.get(key, 0) + 1
            self._executor.submit(self._run, key, job, on_done)
        if queue is not None and not queue:
            del self._waiting[key]

    def _run(self, key: str, job: Job, on_done: Done) -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = job()
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the actor
            error = exc
        try:
            on_done(result, error)
        except Exception:
            log.exception("model job callback failed for a character")
        finally:
            with self._lock:
                left = self._running.get(key, 1) - 1
                if left <= 0:
                    self._running.pop(key, None)
                else:
                    self._running[key] = left
                self._pump(key)

    def shutdown(self, wait: bool = False) -> None:
        with self._lock:
            self._closed = True
            self._waiting.clear()
        self._executor.shutdown(wait=wait, cancel_futures=True)
