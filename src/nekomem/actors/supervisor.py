"""The per-character supervisor: starts, routes to and restarts the six child actors."""

from __future__ import annotations

import collections
import logging
from typing import Any

import pykka

from nekomem.actors.base import CharacterContext, Services, fail_message
from nekomem.actors.messages import ChildCrashed, Deliver, Describe, Flush, Tick
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.faults import StorageFault, classify

log = logging.getLogger("nekomem.supervisor")

# Start order matters: recall first so the owners can feed it while loading; outbox last
# so that replayed work finds every handler alive.
CHILD_ORDER = ("recall", "recent", "facts", "reflections", "persona", "outbox")


def child_classes() -> dict[str, type[Any]]:
    from nekomem.actors.facts import FactActor
    from nekomem.actors.outbox import OutboxActor
    from nekomem.actors.persona import PersonaActor
    from nekomem.actors.recall import RecallActor
    from nekomem.actors.recent import RecentActor
    from nekomem.actors.reflections import ReflectionActor

    return {
        "recall": RecallActor,
        "recent": RecentActor,
        "facts": FactActor,
        "reflections": ReflectionActor,
        "persona": PersonaActor,
        "outbox": OutboxActor,
    }


class CharacterSupervisor(pykka.ThreadingActor):
    """Owns one character's children. Every request for the character enters here as a
    :class:`Deliver`; a crashed child is restarted from disk within the restart budget and
    the messages it had queued are redelivered to the new instance."""

    def __init__(self, name: str, services: Services) -> None:
        super().__init__()
        self.name = name
        self.services = services
        self.children: dict[str, pykka.ActorRef[Any]] = {}
        self.failed: dict[str, str] = {}
        self.restarts: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
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
            log.warning("a character could not start: %s", fault.code)

    def _start_children(self) -> None:
        from nekomem.actors.events import EVENT_OWNERS
        from nekomem.stores.applied import SharedJournal
        from nekomem.stores.layout import CharacterPaths

        paths = CharacterPaths(self.services.memory_root, self.name)
        paths.ensure()
        journal = SharedJournal(paths.events, paths.events_applied, EVENT_OWNERS)
        self.ctx = CharacterContext(
            name=self.name, paths=paths, services=self.services, journal=journal, supervisor=self.actor_ref
        )
        classes = child_classes()
        for child in CHILD_ORDER:
            self.children[child] = classes[child].start(self.ctx)

    def on_stop(self) -> None:
        # Stop in reverse order; each child flushes its views in on_stop.
        for child in reversed(CHILD_ORDER):
            ref = self.children.get(child)
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=self.services.settings.server.ask_timeout_seconds)
                except (pykka.ActorDeadError, pykka.Timeout):
                    log.warning("child %s did not stop cleanly", child)
        self.children.clear()
        if self.ctx is not None:
            try:
                getattr(self.ctx.journal, "close", lambda: None)()
            except Exception:  # noqa: BLE001
                log.exception("closing the journal failed")

    def on_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        for ref in self.children.values():
            try:
                ref.stop(block=False)
            except pykka.ActorDeadError:
                pass

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Deliver):
            self._deliver(message.child, message.message)
        elif isinstance(message, ChildCrashed):
            self._restart(message)
        elif isinstance(message, Tick | Flush):
            for child in CHILD_ORDER:
                if child not in self.failed:
                    self._deliver(child, message if isinstance(message, Tick) else Flush())
            if isinstance(message, Flush) and message.reply is not None:
                message.reply.ok(True)
        elif isinstance(message, Describe):
            message.reply.ok(self.describe())
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "children": {name: ref.is_alive() for name, ref in self.children.items()},
            "failed": dict(self.failed),
            "restarts": self.restart_total,
        }

    def _deliver(self, child: str, message: Any) -> None:
        if self.start_fault is not None:
            self.on_start()
            if self.start_fault is not None:
                fault = self.start_fault
                fail_message(message, ActorFailure(fault.code, fault.message, fault.status))
                return
        if child in self.failed:
            fail_message(message, ActorFailure("character_failed", f"the {child} layer of this character failed: {self.failed[child]}", 503))
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
            # Already restarted (a second report for the same crash): just redeliver.
            for message in crash.pending:
                ref.tell(message)
            return
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
            self.children[child].tell(message)
