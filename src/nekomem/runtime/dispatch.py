"""Actors that cost no thread: pykka actors whose mailboxes a shared, bounded pool drains.

:class:`DispatchedActor` is a pykka actor type built on pykka's extension points for new
actor types (``_create_actor_inbox``, ``_create_future``, ``_start_actor_loop``). Its
inbox is a :class:`Mailbox`; putting a message into an idle mailbox hands the mailbox to
the :class:`Dispatcher`, whose ``workers`` threads run ready mailboxes in FIFO order. A
worker takes at most ``batch`` messages from one mailbox and then puts the mailbox back at
the end of the ready queue, so a flooded actor cannot starve a quiet one.

What stays as in ``pykka.ThreadingActor``: one message at a time per actor, in the order
received; ``tell``, ``ask``, ``stop``, :class:`pykka.ActorRef` and the registry; an
exception in a ``tell`` handler calls ``on_failure`` and stops the actor, an exception in
an ``ask`` handler goes back to the caller; messages still queued when an actor stops fail
their ``ask`` with :class:`pykka.ActorDeadError`. Two additions: putting a message into a
mailbox that has closed raises ``ActorDeadError`` (pykka would leave it unread), and
``on_release`` (pykka's ``on_stop`` with a result) may return a :class:`Completion`; the stop is then answered, and the mailbox's
``when_terminated`` callbacks run, only when that completes. Handlers must not block on
another dispatched actor (the pool is bounded): chain on a Completion instead.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka
from pykka import ActorRegistry, messages
from pykka._threading import ThreadingFuture

if TYPE_CHECKING:
    from pykka._envelope import Envelope

log = logging.getLogger("nekomem.dispatch")


class Completion:
    """A one-shot "this is done" signal with callbacks (no value, no error).

    ``then(fn)`` runs ``fn`` once the completion is done: at once, on the calling thread,
    when it already is; otherwise on the thread that calls ``done()``."""

    __slots__ = ("_lock", "_done", "_callbacks")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def is_done(self) -> bool:
        return self._done

    def then(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn()

    def done(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn()
            except Exception:
                log.exception("a completion callback failed")

    @staticmethod
    def all(parts: list[Completion]) -> Completion:
        """A completion done when every one of ``parts`` is."""
        joined = Completion()
        left = [len(parts)]
        lock = threading.Lock()
        if not parts:
            joined.done()
            return joined

        def one() -> None:
            with lock:
                left[0] -= 1
                finished = left[0] == 0
            if finished:
                joined.done()

        for part in parts:
            part.then(one)
        return joined


class Dispatcher:
    """A fixed pool of ``workers`` threads that run ready mailboxes, ``batch`` messages at
    a time. Threads start with the dispatcher and end with :meth:`shutdown`."""

    def __init__(self, workers: int, batch: int, *, name: str = "nekomem-actor") -> None:
        if workers < 1 or batch < 1:
            raise ValueError("a dispatcher needs at least one worker and a batch of at least one")
        self.batch = batch
        self._ready: collections.deque[Mailbox] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._local = threading.local()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    @property
    def workers(self) -> int:
        return len(self._threads)

    def on_worker(self) -> bool:
        """Whether the calling thread is one of this dispatcher's workers."""
        return getattr(self._local, "worker", False)

    def ready(self, mailbox: Mailbox) -> None:
        """Queue ``mailbox`` for a worker. Posted from a worker (one actor telling another),
        it is left to that worker, which takes it once its current run ends, unless a
        backlog is waiting: a wake-up per message costs more than the message."""
        with self._cond:
            self._ready.append(mailbox)
            if len(self._ready) > 1 or not self.on_worker():
                self._cond.notify()

    def queued(self) -> int:
        """Mailboxes waiting for a worker (for /health and the benchmarks)."""
        with self._cond:
            return len(self._ready)

    def _work(self) -> None:
        self._local.worker = True
        while True:
            with self._cond:
                while not self._ready and not self._closed:
                    self._cond.wait()
                if not self._ready:
                    return
                mailbox = self._ready.popleft()
            try:
                mailbox.run(self.batch)
            except BaseException:
                log.exception("a mailbox run failed")

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the workers once the ready queue is empty (mailboxes still queued are run)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if not self.on_worker():
            for thread in self._threads:
                thread.join(timeout)


_IDLE, _SCHEDULED = 0, 1


class Mailbox:
    """The inbox of one dispatched actor (pykka's ``ActorInbox`` protocol plus scheduling)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[Envelope[Any]] = collections.deque()
        self._state = _IDLE
        self._closed = False
        self._started = False
        self._actor: DispatchedActor | None = None
        self._dispatcher: Dispatcher | None = None
        self._terminated = Completion()
        self.handled = 0  # messages handled so far (for barriers and tests)

    # -- pykka's ActorInbox protocol -----------------------------------------------------
    def put(self, envelope: Envelope[Any], /) -> None:
        """Queue ``envelope``; raises ActorDeadError when the actor has stopped."""
        with self._lock:
            if self._closed:
                raise pykka.ActorDeadError("the actor has stopped")
            self._queue.append(envelope)
            wake = self._state == _IDLE and self._dispatcher is not None
            if wake:
                self._state = _SCHEDULED
        if wake:
            assert self._dispatcher is not None
            self._dispatcher.ready(self)

    def get(self) -> Envelope[Any]:
        raise NotImplementedError("a mailbox is drained by its dispatcher, not by get()")

    def empty(self) -> bool:
        with self._lock:
            return not self._queue

    def __len__(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- lifecycle -------------------------------------------------------------------------
    def bind(self, actor: DispatchedActor, dispatcher: Dispatcher, *, hold: bool = False) -> None:
        """Attach the mailbox to its actor and dispatcher and schedule the actor's start
        (with ``hold``, only at :meth:`release`; messages queue meanwhile)."""
        with self._lock:
            self._actor = actor
            self._dispatcher = dispatcher
            self._state = _SCHEDULED
        if not hold:
            dispatcher.ready(self)

    def release(self) -> None:
        """Schedule the start of an actor started with ``start_held``."""
        assert self._dispatcher is not None
        self._dispatcher.ready(self)

    def drain(self) -> list[Envelope[Any]]:
        """Close the mailbox and return what it still held (used by ``on_failure``)."""
        with self._lock:
            self._closed = True
            rest = list(self._queue)
            self._queue.clear()
        return rest

    def when_terminated(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the actor has stopped and finished ``on_release`` (at once if so)."""
        self._terminated.then(fn)

    @property
    def terminated(self) -> bool:
        return self._terminated.is_done

    @property
    def settled(self) -> bool:
        """No message queued and the actor reports no work already due (see quiesce)."""
        actor = self._actor
        return self.empty() and (actor is None or actor.actor_stopped.is_set() or actor.is_settled())

    # -- running ---------------------------------------------------------------------------
    def run(self, batch: int) -> None:
        """Handle up to ``batch`` messages on the calling worker, then reschedule or idle."""
        actor = self._actor
        assert actor is not None and self._dispatcher is not None
        if not self._started:
            self._started = True
            actor._actor_loop_setup()
        done = 0
        while done < batch and not actor.actor_stopped.is_set():
            with self._lock:
                if not self._queue:
                    break
                envelope = self._queue.popleft()
            actor._dispatch_envelope(envelope)
            self.handled += 1
            done += 1
        if actor.actor_stopped.is_set():
            self._teardown(actor)
            return
        with self._lock:
            again = bool(self._queue)
            if not again:
                self._state = _IDLE
        if again:
            self._dispatcher.ready(self)

    def _teardown(self, actor: DispatchedActor) -> None:
        for envelope in self.drain():
            if envelope.reply_to is None:
                continue
            if isinstance(envelope.message, messages._ActorStop):
                envelope.reply_to.set(None)
            else:
                envelope.reply_to.set_exception(
                    exc_info=(pykka.ActorDeadError, pykka.ActorDeadError(f"{actor.actor_ref} stopped before handling the message"), None)
                )
        stopping = actor._stopping
        # A stopped actor's state must not live on through a ref someone still holds.
        self._actor = None
        if stopping is None:
            self._terminated.done()
        else:
            stopping.then(self._terminated.done)


class DispatchFuture(ThreadingFuture[Any]):
    """The future of a dispatched actor's ``ask``: a pykka ThreadingFuture (blocking
    ``get`` with a timeout, for callers on plain threads)."""


_default_dispatcher: Dispatcher | None = None
_default_lock = threading.Lock()


def default_dispatcher() -> Dispatcher:
    """The process-wide dispatcher (two workers unless :func:`set_default_dispatcher` ran)."""
    global _default_dispatcher
    with _default_lock:
        if _default_dispatcher is None:
            _default_dispatcher = Dispatcher(2, 16)
        return _default_dispatcher


def set_default_dispatcher(dispatcher: Dispatcher) -> None:
    global _default_dispatcher
    with _default_lock:
        _default_dispatcher = dispatcher


def mailbox_of(ref: pykka.ActorRef[Any]) -> Mailbox:
    """The dispatcher mailbox behind ``ref``. Raises TypeError for an actor that is not a
    :class:`DispatchedActor`."""
    inbox = ref.actor_inbox
    if not isinstance(inbox, Mailbox):
        raise TypeError("not a dispatched actor")
    return inbox


class DispatchedActor(pykka.Actor):
    """A pykka actor run by a :class:`Dispatcher` instead of a thread of its own.

    Subclasses choose their dispatcher by overriding :meth:`dispatcher` (the process-wide
    default otherwise)."""

    actor_inbox: Mailbox
    _stopping: Completion | None = None
    _hold_start = False

    @classmethod
    def start_held(cls, *args: Any, **kwargs: Any) -> pykka.ActorRef[Any]:
        """Like ``start``, but ``on_start`` and the first messages wait for
        ``ref.actor_inbox.release()``: a supervisor hands out every child's ref before any
        child runs, so no sibling's message can take a detour and arrive out of order."""
        obj = cls(*args, **kwargs)
        obj._hold_start = True
        ActorRegistry.register(obj.actor_ref)
        obj._start_actor_loop()
        return obj.actor_ref

    @staticmethod
    def _create_actor_inbox() -> Mailbox:
        return Mailbox()

    @staticmethod
    def _create_future() -> DispatchFuture:
        return DispatchFuture()

    def _start_actor_loop(self) -> None:
        self.actor_inbox.bind(self, self.dispatcher(), hold=self._hold_start)

    def dispatcher(self) -> Dispatcher:
        return default_dispatcher()

    def on_release(self) -> Completion | None:
        """Called when the actor stops, in place of pykka's ``on_stop`` (which must return
        None): release what it holds, and return a Completion when the release finishes
        later (the stop is then answered only once it is done), or None."""
        return None

    def is_settled(self) -> bool:
        """Whether the actor has no work already due that it will post itself (read from
        other threads by barriers; True unless a subclass knows better)."""
        return True

    def _stop(self) -> Completion | None:  # type: ignore[override]  # pykka's _handle_receive returns it
        """Stop now (the rest of the inbox is failed by the teardown); returns what
        ``on_release`` returned when it is a Completion, so the stop is answered after it."""
        ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()
        try:
            self.on_stop()
            result = self.on_release()
        except Exception:  # noqa: BLE001
            self._handle_failure(*sys.exc_info())
            return None
        if result is not None:
            self._stopping = result
            return result
        return None

    def _dispatch_envelope(self, envelope: Envelope[Any]) -> None:
        # The body of pykka's Actor._actor_loop_running, for one envelope.
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                if isinstance(response, Completion):
                    reply_to = envelope.reply_to
                    response.then(lambda: reply_to.set(None))
                else:
                    envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                log.info("exception returned from %s to its caller", self, exc_info=sys.exc_info())
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:  # noqa: BLE001
                    self._handle_failure(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            log.debug("%r in %s; stopping all actors", sys.exc_info()[1], self)
            self._stop()
            ActorRegistry.stop_all(block=False)
