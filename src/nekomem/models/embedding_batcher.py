"""The micro-batcher of the embedding service: inference threads (two by default),
concurrent callers' texts merged into bounded batches.

Every caller of :meth:`MicroBatcher.submit` hands over a request (a list of items) and waits
for its answer (or is called back). The worker threads run the batches: requests that
arrive while a batch runs wait, and the next batch takes as many of them as fit in
``max_items`` and in an even share of the waiting items among the workers that may run
them (a request is never split, so a request larger than that runs alone).
Requests of a lower ``priority`` number go first (a user's query before background work);
within a priority, first come, first served. With more than one worker, ``reserve`` keeps a
worker for urgent requests: batches led by a request of priority ``reserve`` or more run on
at most ``workers - 1`` threads at once, so a request of a lower number never waits for one
of them to end. A request whose expiry passed while queued is dropped, not run.

Why so few threads: the model call is CPU-bound and already uses the intra-op threads of
its session, so more calls at once only oversubscribe the cores; the order of the queue,
not of a lock, decides who waits; and memory that the allocator hands out per calling
thread (glibc malloc arenas) exists once instead of once per model-pool worker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["BatcherClosed", "MicroBatcher", "Pending", "RequestExpired"]

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class BatcherClosed(RuntimeError):
    """The batcher was closed before this request ran."""


class RequestExpired(RuntimeError):
    """The request's expiry passed while it was queued; it was not run."""


@dataclass(eq=False)
class Pending(Generic[Item, Answer]):
    """One caller's request: its items, then (once its batch ran) its answer or the error."""

    items: list[Item]
    priority: int
    seq: int
    expires: float | None = None
    callback: Callable[[Pending[Item, Answer]], None] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | None = None
    error: BaseException | None = None

    def finish(self) -> None:
        """Mark the request done and tell its callback (errors of which are swallowed: it
        runs on a worker or closing thread that must go on)."""
        self.done.set()
        if self.callback is not None:
            try:
                self.callback(self)
            except Exception:
                log.exception("a micro-batch callback raised")

    def wait(self) -> Answer:
        """Block until the request's batch ran; its answer. Raises what the batch raised."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.answer  # type: ignore[return-value]  # set whenever error is None


BatchRun = Callable[[list[Pending[Item, Answer]]], list[Answer | BaseException]]
"""Runs one batch: the requests in order, answered with one answer per request (an
exception as a request's answer fails that request alone; raising fails the batch)."""
BatchEnd = Callable[[int, int], None]
"""Told after each batch ``(requests, items)`` on the worker thread (e.g. to trim memory)."""


class MicroBatcher(Generic[Item, Answer]):
    """``workers`` threads running ``run`` on batches of waiting requests; thread-safe.

    The threads start with the first requests; :meth:`close` ends them."""

    def __init__(
        self,
        run: BatchRun[Item, Answer],
        max_items: int,
        name: str,
        on_batch_end: BatchEnd | None = None,
        workers: int = 1,
        reserve: int | None = None,
    ) -> None:
        if max_items < 1 or workers < 1:
            raise ValueError("max_items and workers must be >= 1")
        self._workers = workers
        # Batches of priority >= reserve may hold this many workers at once (all of them
        # with one worker: there is nothing to keep free then).
        self._reserve = reserve
        self._background_limit = workers - 1 if workers > 1 and reserve is not None else workers
        self._background_running = 0
        self._run = run
        self._max_items = max_items
        self._name = name
        self._on_batch_end = on_batch_end
        self._cond = threading.Condition()
        self._queue: list[Pending[Item, Answer]] = []
        self._seq = 0
        self._closed = False
        self._threads: list[threading.Thread] = []
        self.batches = 0  # batches run so far (for tests and diagnostics)
        self.expired = 0  # requests dropped because they expired while queued

    def submit(
        self,
        items: Sequence[Item],
        priority: int = 0,
        expires: float | None = None,
        callback: Callable[[Pending[Item, Answer]], None] | None = None,
    ) -> Pending[Item, Answer]:
        """Queue a request and return at once; ``.wait()`` on the result gives its answer.

        ``expires`` (a ``time.monotonic()`` value): a request still queued then is dropped
        (its wait raises RequestExpired) instead of run: whoever asked has moved on.
        ``callback`` is called with the request once it is done (answered, failed, expired
        or dropped by close), on the thread that finished it: it must be quick.
        Raises BatcherClosed after :meth:`close`.
        """
        with self._cond:
            if self._closed:
                raise BatcherClosed(f"{self._name} is closed")
            self._seq += 1
            pending: Pending[Item, Answer] = Pending(list(items), priority, self._seq, expires, callback)
            self._queue.append(pending)
            if len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._cond.notify()
        return pending

    def call(self, items: Sequence[Item], priority: int = 0, expires: float | None = None) -> Answer:
        """Submit and wait: the request's answer; raises what its batch raised."""
        return self.submit(items, priority, expires).wait()

    def waiting(self) -> int:
        """Requests queued and not yet taken into a batch."""
        with self._cond:
            return len(self._queue)

    def close(self) -> None:
        """Refuse new requests and fail the queued ones with BatcherClosed; a running batch ends normally."""
        with self._cond:
            self._closed = True
            dropped, self._queue = self._queue, []
            self._cond.notify_all()
        for pending in dropped:
            pending.error = BatcherClosed(f"{self._name} closed before the request ran")
            pending.finish()

    def _is_background(self, pending: Pending[Item, Answer]) -> bool:
        return self._reserve is not None and pending.priority >= self._reserve

    def _runnable(self) -> bool:
        """Whether this worker may take a batch now (under the lock): something urgent
        waits, or background waits and the background batches leave a worker free."""
        if self._background_running < self._background_limit:
            return bool(self._queue)
        return any(not self._is_background(p) for p in self._queue)

    def _share(self, background: bool) -> int:
        """Most items this worker takes now (under the lock): ``max_items``, and no more
        than an even share of the waiting items among the workers this batch's class may
        use. A worker that took every waiting request would leave the others idle until new
        ones arrived, while its callers waited for the whole batch, one core doing the work
        of two; with an even share the next free worker takes the rest at once. (Nothing is
        lost by smaller batches here: a batch-invariant model's time per text does not fall
        with the batch's size on CPU, and a batch-variant one runs each request alone.)"""
        workers = self._background_limit if background else self._workers
        if workers <= 1:
            return self._max_items
        waiting = sum(len(p.items) for p in self._queue)
        return min(self._max_items, -(-waiting // workers))

    def _take(self) -> tuple[list[Pending[Item, Answer]], list[Pending[Item, Answer]]] | None:
        """The next batch (lowest priority number first, then arrival) and the requests
        that expired meanwhile (not yet finished: the caller does that outside the lock),
        or None once closed."""
        with self._cond:
            while not self._runnable() and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            now = time.monotonic()
            expired = [p for p in self._queue if p.expires is not None and p.expires <= now]
            if expired:
                self._queue = [p for p in self._queue if p.expires is None or p.expires > now]
                self.expired += len(expired)
                if not self._runnable():
                    return [], expired
            self._queue.sort(key=lambda p: (p.priority, p.seq))
            background = self._is_background(self._queue[0])
            if background:
                self._background_running += 1
            limit = self._share(background)
            batch = [self._queue[0]]
            size = len(batch[0].items)
            for pending in self._queue[1:]:
                if size + len(pending.items) > limit:
                    break
                batch.append(pending)
                size += len(pending.items)
            del self._queue[: len(batch)]
            return batch, expired

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            batch, expired = taken
            for pending in expired:
                pending.error = RequestExpired(f"{self._name}: the request expired before it ran")
                pending.finish()
            if not batch:
                continue
            try:
                answers = self._run(batch)
                if len(answers) != len(batch):
                    raise RuntimeError(f"batch run answered {len(answers)} of {len(batch)} requests")
                for pending, answer in zip(batch, answers, strict=True):
                    if isinstance(answer, BaseException):
                        pending.error = answer  # this request alone failed
                    else:
                        pending.answer = answer
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to its callers
                for pending in batch:
                    pending.error = exc
            self.batches += 1
            if self._is_background(batch[0]):
                with self._cond:
                    self._background_running -= 1
                    self._cond.notify_all()  # a worker may wait for a background slot
            for pending in batch:
                pending.finish()
            if self._on_batch_end is not None:
                try:
                    self._on_batch_end(len(batch), sum(len(p.items) for p in batch))
                except Exception:  # noqa: BLE001 - a hook must never stop the worker
                    pass
