"""The per-character supervisor: starts, routes to and restarts the six child actors."""

from __future__ import annotations

import collections
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from nekomem.actors.base import ChildActor
from nekomem.domain.layers import OUTBOX, Address, event_owners, layers
from nekomem.runtime.dispatch import ActorRef, Completion, DispatchedActor, Dispatcher, mailbox_of
from nekomem.runtime.protocol import ChildCrashed, Deliver, Describe, Flush, fail_message
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.runtime.services import CharacterContext, Routes, Services
from nekomem.stores.applied import SharedJournal
from nekomem.stores.faults import StorageFault, classify
from nekomem.stores.layout import CharacterPaths

log = logging.getLogger("nekomem.supervisor")


def child_order() -> tuple[Address, ...]:
    """The children of a character in start order (see nekomem.domain.layers)."""
    return tuple(spec.address for spec in layers())


def child_classes() -> dict[Address, type[ChildActor]]:
    """Address -> the ChildActor class of every declared layer, importing each once."""
    return {spec.address: _actor_class(spec.actor) for spec in layers()}


def _actor_class(path: str) -> type[ChildActor]:
    module_name, _, class_name = path.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, ChildActor)):
        raise TypeError(f"{path} is not a ChildActor")
    return cls


class CharacterSupervisor(DispatchedActor):
    """Owns one character's children. Requests reach a live child directly (through
    :class:`Routes`); anything for a child that is not alive enters here as a
    :class:`Deliver`. A crashed child is restarted from disk within the restart budget and
    the messages it had queued are redelivered to the new instance. Nothing here blocks:
    stopping chains the children's stops, and ``Flush`` answers once every child has."""

    def __init__(self, name: str, services: Services, routes: Routes | None = None) -> None:
        super().__init__()
        self.name = name
        self.services = services
        self.routes = routes if routes is not None else Routes()
        self.children: dict[Address, ActorRef[DispatchedActor]] = self.routes.children
        self.failed: dict[Address, str] = {}
        self.restarts: dict[Address, collections.deque[float]] = collections.defaultdict(collections.deque)
        self.restart_total = 0
        self.ctx: CharacterContext | None = None
        self.start_fault: StorageFault | None = None

    def on_start(self) -> None:
        # A disk that cannot create the character's folder must answer fast and let the
        # character start once the disk recovers, not leave callers waiting for a reply.
        try:
            self._start_children()
            self.start_fault = None
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            self.start_fault = fault
            if self.services.storage is not None:
                self.services.storage.count("supervisor", fault)
            log.warning("a character could not start: %s", fault.code)

    def _start_children(self) -> None:
        paths = CharacterPaths(self.services.root_for(self.name), self.name)
        paths.ensure()
        journal = SharedJournal(paths.events, paths.events_applied, event_owners())
        self.ctx = CharacterContext(
            name=self.name, paths=paths, services=self.services, journal=journal, supervisor=self.actor_ref, routes=self.routes
        )
        classes = child_classes()
        # Every child's ref is routable before any child loads (a loading child already
        # sends to its siblings), then they start in order.
        order = child_order()
        for child in order:
            self.children[child] = classes[child].start_held(self.ctx)
        for child in order:
            mailbox_of(self.children[child]).release()

    def dispatcher(self) -> Dispatcher:
        return self.services.dispatcher

    def on_release(self) -> Completion:
        """Stop the children one after the other in reverse start order (each flushes its
        views in its own on_release). Returns the completion of all
        that: the supervisor's stop is answered only then, so a new activation of the
        character never races the old one for its files."""
        released = Completion()
        order = [self.children[c] for c in reversed(child_order()) if c in self.children]

        def stop_next() -> None:
            while order:
                ref = order.pop(0)
                try:
                    ref.stop_later()
                except pykka.ActorDeadError:
                    pass
                mailbox = mailbox_of(ref)
                if not mailbox.terminated:
                    mailbox.when_terminated(stop_next)
                    return
            released.done()

        stop_next()
        return released

    def on_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        for ref in self.children.values():
            try:
                ref.stop_later()
            except pykka.ActorDeadError:
                pass

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Deliver):
            self._deliver(message.child, message.message)
        elif isinstance(message, ChildCrashed):
            self._restart(message)
        elif isinstance(message, Flush):
            self._barrier(message.reply)
        elif isinstance(message, _FlushOutbox):
            self._flush_children((OUTBOX,), message.done)
        elif isinstance(message, Describe):
            if message.reply is not None:
                message.reply.ok(self.describe())
        return None

    def _barrier(self, reply: Reply | None) -> None:
        """Send Flush to every live child and answer ``reply`` once all have answered: each
        child has then handled everything it had queued before the flush. The outbox is
        flushed last, after the others have answered, so the records they sent it before
        their flush (a replay enqueued while loading, say) are in its file too."""
        first = [child for child in child_order() if child != OUTBOX]
        done = Completion()
        ref = self.actor_ref

        def then_last() -> None:
            try:
                ref.tell(_FlushOutbox(done=done))
            except pykka.ActorDeadError:
                done.done()

        self._flush_children(tuple(first), _then(then_last))
        if reply is not None:
            done.then(lambda: reply.ok(True))

    def _flush_children(self, children: tuple[Address, ...], done: Completion) -> None:
        parts: list[Completion] = []
        for child in children:
            if child in self.failed:
                continue
            part = Completion()
            parts.append(part)
            self._deliver(child, Flush(reply=_CompletionReply(part)))
        Completion.all(parts).then(done.done)

    def describe(self) -> dict[str, Any]:
        return {
            "children": {name: ref.is_alive() for name, ref in self.children.items()},
            "failed": dict(self.failed),
            "restarts": self.restart_total,
        }

    def _deliver(self, child: Address, message: Any) -> None:
        if self.start_fault is not None:
            self.on_start()
            if self.start_fault is not None:
                fault = self.start_fault
                fail_message(message, ActorFailure(fault.code, fault.message, fault.status))
                return
        if child in self.failed:
            fail_message(
                message, ActorFailure("character_failed", f"the {child} layer of this character failed: {self.failed[child]}", 503)
            )
            return
        ref = self.children.get(child)
        if ref is None:
            fail_message(message, ActorFailure("unknown_child", f"no {child} actor", 500))
            return
        try:
            ref.tell(message)
        except pykka.ActorDeadError:
            # The child died and its crash report has not arrived yet: the report will
            # restart it; hand this message over with the report's pending list.
            self._restart(ChildCrashed(child=child, error="dead on delivery", pending=[message]))

    def _restart(self, crash: ChildCrashed) -> None:
        assert self.ctx is not None
        settings = self.services.settings.runtime
        child = crash.child
        if child in self.failed:
            for message in crash.pending:
                fail_message(message, ActorFailure("character_failed", f"the {child} layer of this character failed", 503))
            return
        ref = self.children.get(child)
        if ref is not None and ref.is_alive():
            # Already restarted (a second report for the same crash): just redeliver,
            # unless that instance is dying too (its mailbox closed before it stopped).
            pending = list(crash.pending)
            try:
                while pending:
                    ref.tell(pending[0])
                    pending.pop(0)
                return
            except pykka.ActorDeadError:
                crash = ChildCrashed(child=child, error=crash.error, pending=pending)
        now = self.services.clock.monotonic()
        window = self.restarts[child]
        while window and now - window[0] > settings.restart_window_seconds:
            window.popleft()
        if len(window) >= settings.restart_budget:
            self.failed[child] = crash.error
            self.services.counters.add("failed_children")
            log.error("character child %s exceeded its restart budget; marked failed", child)
            for message in crash.pending:
                fail_message(message, ActorFailure("character_failed", f"the {child} layer of this character failed", 503))
            return
        window.append(now)
        self.restart_total += 1
        self.services.counters.add("child_restarts")
        log.warning("restarting crashed child %s (restart %d in window)", child, len(window))
        try:
            self.children[child] = child_classes()[child].start(self.ctx)
        except Exception as exc:  # noqa: BLE001
            self.failed[child] = repr(exc)
            for message in crash.pending:
                fail_message(message, ActorFailure("character_failed", f"the {child} layer could not restart", 503))
            return
        for message in crash.pending:
            # Through _deliver: a child that dies again at once (it cannot load) is
            # restarted again, or marked failed with these messages answered.
            self._deliver(child, message)


@dataclass(frozen=True)
class _FlushOutbox:
    """The supervisor's own message: the second step of a flush barrier (the outbox's
    flush, after the other children have answered)."""

    done: Completion


def _then(fn: Callable[[], None]) -> Completion:
    """A Completion that runs ``fn`` once done."""
    completion = Completion()
    completion.then(fn)
    return completion


class _CompletionReply(Reply):
    """A Reply whose answer (ok or failure alike) completes a Completion: the barrier
    waits for every child to answer, not for every child to succeed."""

    __slots__ = ("_part",)

    def __init__(self, part: Completion) -> None:
        super().__init__()
        self._part = part

    def ok(self, value: Any = None) -> None:
        self._part.done()

    def fail(self, exc: BaseException) -> None:
        self._part.done()
