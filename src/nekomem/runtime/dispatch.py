"""Actors that cost no thread: mailboxes a shared, bounded pool drains.

This module is the actor runtime: :class:`DispatchedActor` (the base an actor class
extends: ``on_start``, ``on_receive``, ``on_failure``, ``on_release``), its
:class:`ActorRef` (``tell``, ``ask`` with a timeout, ``stop``, ``is_alive``) and its
:class:`Mailbox`. It stands on no actor framework's internals: of pykka it uses only the
public exceptions (``pykka.ActorDeadError``, ``pykka.Timeout``), which the rest of the
server catches. Putting a message into an idle mailbox hands the mailbox to the
:class:`Dispatcher`, whose ``workers`` threads run ready mailboxes in FIFO order. A worker
takes at most ``batch`` messages from one mailbox and then puts the mailbox back at the
end of the ready queue, so a flooded actor cannot starve a quiet one.

The semantics are pykka's ``ThreadingActor``'s: one message at a time per actor, in the
order received; an exception in a ``tell`` handler calls ``on_failure`` and stops the
actor, an exception in an ``ask`` handler goes back to the caller; messages still queued
when an actor stops fail their ``ask`` with ``ActorDeadError``. Two additions: putting a
message into a mailbox that has closed raises ``ActorDeadError``, and ``on_release``
(``on_stop`` with a result) may return a :class:`Completion`; the stop is then answered,
and the mailbox's ``when_terminated`` callbacks run, only when that completes. Handlers
must not block on another dispatched actor (the pool is bounded): chain on a Completion
instead. A blocking ``ask`` or ``stop`` takes a timeout.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import pykka

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
        self._live: set[Mailbox] = set()  # mailboxes bound and not yet torn down
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

    def adopt(self, mailbox: Mailbox) -> None:
        """Count ``mailbox`` among this dispatcher's live actors (until :meth:`drop`)."""
        with self._cond:
            self._live.add(mailbox)

    def drop(self, mailbox: Mailbox) -> None:
        with self._cond:
            self._live.discard(mailbox)

    def stop_all(self) -> None:
        """Queue the stop of every live actor of this dispatcher (never blocks)."""
        with self._cond:
            live = list(self._live)
        for mailbox in live:
            try:
                mailbox.put(Envelope(_STOP))
            except pykka.ActorDeadError:
                pass

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
    """The inbox of one dispatched actor and its place in the dispatcher's ready queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[Envelope] = collections.deque()
        self._state = _IDLE
        self._closed = False
        self._started = False
        self._actor: DispatchedActor | None = None
        self._dispatcher: Dispatcher | None = None
        self._terminated = Completion()
        self.handled = 0  # messages handled so far (for barriers and tests)

    # -- the queue -------------------------------------------------------------------------
    def put(self, envelope: Envelope, /) -> None:
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
        dispatcher.adopt(self)
        if not hold:
            dispatcher.ready(self)

    def release(self) -> None:
        """Schedule the start of an actor started with ``start_held``."""
        assert self._dispatcher is not None
        self._dispatcher.ready(self)

    def drain(self) -> list[Envelope]:
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
            actor._run_start()
        done = 0
        while done < batch and not actor.actor_stopped.is_set():
            with self._lock:
                if not self._queue:
                    break
                envelope = self._queue.popleft()
            actor._run_message(envelope)
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
            if isinstance(envelope.message, _Stop):
                envelope.reply_to.set(None)
            else:
                envelope.reply_to.set_exception(pykka.ActorDeadError(f"{actor.actor_ref} stopped before handling the message"))
        stopping = actor._stopping
        if self._dispatcher is not None:
            self._dispatcher.drop(self)
        # A stopped actor's state must not live on through a ref someone still holds.
        self._actor = None
        if stopping is None:
            self._terminated.done()
        else:
            stopping.then(self._terminated.done)


A = TypeVar("A", bound="DispatchedActor", covariant=True)  # a ref to a ChildActor is a ref to a DispatchedActor


class _Stop:
    """The message that stops an actor (queued behind what was told before it)."""


_STOP = _Stop()


class Future:
    """The answer to an :meth:`ActorRef.ask`: set once, from any thread; :meth:`get`
    waits for it at most ``timeout`` seconds."""

    __slots__ = ("_event", "_value", "_error")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def set(self, value: Any = None) -> None:
        self._value = value
        self._event.set()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._event.set()

    def get(self, timeout: float) -> Any:
        """The answer. Raises pykka.Timeout when none came within ``timeout`` seconds,
        and the handler's exception (ActorDeadError: the actor stopped first) as is."""
        if not self._event.wait(timeout):
            raise pykka.Timeout(f"no answer within {timeout} seconds")
        if self._error is not None:
            raise self._error
        return self._value


class StopFuture:
    """The answer to a :meth:`ActorRef.stop`: True once this stop has stopped the actor,
    False when the actor was already dead."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Future) -> None:
        self._inner = inner

    def get(self, timeout: float) -> bool:
        """Raises pykka.Timeout when the stop is not done within ``timeout`` seconds."""
        try:
            self._inner.get(timeout)
        except pykka.ActorDeadError:
            return False
        return True


@dataclass(slots=True)
class Envelope:
    """A message in a mailbox, with the future of an ask (None for a tell)."""

    message: object
    reply_to: Future | None = None


class ActorRef(Generic[A]):
    """How the rest of the process reaches an actor: it holds the mailbox, never the
    actor itself (a stopped actor's state is not kept alive by a ref)."""

    __slots__ = ("actor_class", "actor_inbox", "actor_stopped")

    def __init__(self, actor: A) -> None:
        self.actor_class: type[A] = type(actor)
        self.actor_inbox: Mailbox = actor.actor_inbox
        self.actor_stopped: threading.Event = actor.actor_stopped

    def __repr__(self) -> str:
        return f"<ActorRef for {self.actor_class.__name__}>"

    def is_alive(self) -> bool:
        return not self.actor_stopped.is_set()

    def tell(self, message: object) -> None:
        """Queue ``message`` (never blocks). Raises pykka.ActorDeadError when the actor has stopped."""
        if not self.is_alive():
            raise pykka.ActorDeadError(f"{self} not found")
        self.actor_inbox.put(Envelope(message))

    def ask_later(self, message: object) -> Future:
        """Queue ``message`` and return the future of its answer (an ActorDeadError in it
        when the actor has stopped)."""
        future = Future()
        try:
            if not self.is_alive():
                raise pykka.ActorDeadError(f"{self} not found")
            self.actor_inbox.put(Envelope(message, future))
        except pykka.ActorDeadError as exc:
            future.set_exception(exc)
        return future

    def ask(self, message: object, *, timeout: float) -> Any:
        """Send ``message`` and wait at most ``timeout`` seconds for the answer. Raises
        pykka.Timeout, pykka.ActorDeadError, or the exception the handler raised."""
        return self.ask_later(message).get(timeout)

    def stop_later(self) -> StopFuture:
        """Queue a stop behind every message told before it; the future of its end."""
        return StopFuture(self.ask_later(_STOP))

    def stop(self, *, timeout: float) -> bool:
        """Stop the actor and wait for it (see :meth:`stop_later`). Raises pykka.Timeout."""
        return self.stop_later().get(timeout)


class DispatchedActor:
    """An actor run by a :class:`Dispatcher`, with no thread of its own.

    Subclasses name their dispatcher in :meth:`dispatcher` and handle messages in
    :meth:`on_receive`; :meth:`on_start`, :meth:`on_failure` and :meth:`on_release` are
    the other hooks (see the module). ``start`` builds the actor with its arguments and
    schedules its ``on_start``; the actor is then reached only through its :class:`ActorRef`."""

    def __init__(self) -> None:
        self.actor_inbox = Mailbox()
        self.actor_stopped = threading.Event()
        self._stopping: Completion | None = None
        self._actor_ref: ActorRef[Any] = ActorRef(self)

    @property
    def actor_ref(self) -> ActorRef[Self]:
        """How others reach this actor."""
        return self._actor_ref

    def __str__(self) -> str:
        return type(self).__name__

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> ActorRef[Self]:
        """Build the actor and schedule its start on its dispatcher."""
        obj = cls(*args, **kwargs)
        obj.actor_inbox.bind(obj, obj.dispatcher())
        return obj.actor_ref

    @classmethod
    def start_held(cls, *args: Any, **kwargs: Any) -> ActorRef[Self]:
        """Like ``start``, but ``on_start`` and the first messages wait for
        ``ref.actor_inbox.release()``: a supervisor hands out every child's ref before any
        child runs, so no sibling's message can take a detour and arrive out of order."""
        obj = cls(*args, **kwargs)
        obj.actor_inbox.bind(obj, obj.dispatcher(), hold=True)
        return obj.actor_ref

    # -- hooks -------------------------------------------------------------------------
    def dispatcher(self) -> Dispatcher:
        """The dispatcher whose workers run this actor."""
        raise NotImplementedError(f"{type(self).__name__} names no dispatcher")

    def on_start(self) -> None:
        """Run first, on a worker, before any message. An exception stops the actor."""

    def on_receive(self, message: Any) -> Any:
        """Handle one message; what it returns answers an ask."""
        log.warning("unexpected message received by %s: %s", self, type(message).__name__)
        return None

    def on_failure(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """A ``tell`` handler raised: the actor has stopped; clean up (runs on the worker)."""

    def on_release(self) -> Completion | None:
        """Called when the actor stops: release what it holds, and return a Completion
        when the release finishes later (the stop is then answered only once it is
        done), or None."""
        return None

    def is_settled(self) -> bool:
        """Whether the actor has no work already due that it will post itself (read from
        other threads by barriers; True unless a subclass knows better)."""
        return True

    def stop(self) -> None:
        """Queue this actor's stop (as ``actor_ref.stop_later()``)."""
        self.actor_ref.tell(_STOP)

    # -- what the mailbox runs -------------------------------------------------------
    def _run_start(self) -> None:
        try:
            self.on_start()
        except Exception:  # noqa: BLE001 - a start that fails stops the actor, logged
            self._failed(*sys.exc_info())

    def _failed(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        log.error("unhandled exception in %s", self, exc_info=(exc_type, exc, tb) if exc_type is not None and exc is not None else None)
        self.actor_stopped.set()

    def _stop_now(self) -> Completion | None:
        """Stop now (the rest of the inbox is failed by the teardown); returns what
        ``on_release`` returned when it is a Completion, so the stop is answered after it."""
        self.actor_stopped.set()
        try:
            result = self.on_release()
        except Exception:  # noqa: BLE001
            self._failed(*sys.exc_info())
            return None
        if result is not None:
            self._stopping = result
        return result

    def _run_message(self, envelope: Envelope) -> None:
        try:
            message = envelope.message
            response = self._stop_now() if isinstance(message, _Stop) else self.on_receive(message)
            if envelope.reply_to is not None:
                if isinstance(response, Completion):
                    reply_to = envelope.reply_to
                    response.then(lambda: reply_to.set(None))
                else:
                    envelope.reply_to.set(response)
        except Exception as exc:
            if envelope.reply_to is not None:
                log.info("exception returned from %s to its caller", self, exc_info=True)
                envelope.reply_to.set_exception(exc)
            else:
                self._failed(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:  # noqa: BLE001
                    self._failed(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            log.debug("%r in %s; stopping every actor of its dispatcher", sys.exc_info()[1], self)
            self._stop_now()
            self.dispatcher().stop_all()


def mailbox_of(ref: ActorRef[Any]) -> Mailbox:
    """The dispatcher mailbox behind ``ref``."""
    return ref.actor_inbox
