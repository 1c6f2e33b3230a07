"""Activation and passivation of characters.

The registry maps a character name to its live supervisor. A character is activated on its
first message and passivated (its actors stopped, its state on disk) when it has been idle
for ``passivate_idle_seconds`` or when more than ``max_active_characters`` are alive; the
least recently used idle character goes first. A character with a request or a model job in
flight is never passivated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pykka

from nekomem.actors.base import Services
from nekomem.actors.messages import Deliver, Describe, Tick
from nekomem.runtime.reply import ActorFailure, Reply

log = logging.getLogger("nekomem.registry")


class CharacterBusy(RuntimeError):
    """A hold could not take a character: it stayed busy, or another hold has it."""


class _Entry:
    __slots__ = ("ref", "last_used", "inflight")

    def __init__(self, ref: pykka.ActorRef[Any], now: float) -> None:
        self.ref = ref
        self.last_used = now
        self.inflight = 0


class CharacterRegistry:
    def __init__(self, services: Services) -> None:
        self.services = services
        self._lock = threading.Lock()  # guards the name -> supervisor map, not domain state
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # name -> future of a supervisor that is stopping. A character is not activated
        # again until its previous instance has flushed and released its files.
        self._stopping: dict[str, Any] = {}
        # name -> event set when a hold (an import writing the character's files) ends.
        self._held: dict[str, threading.Event] = {}
        self._changed = threading.Condition(self._lock)
        self.activations = 0
        self.passivations = 0

    # -- activation --------------------------------------------------------------------
    def _acquire(self, name: str) -> _Entry:
        from nekomem.actors.supervisor import CharacterSupervisor

        self._wait_stopped(name)
        now = self.services.clock.monotonic()
        with self._lock:
            if name in self._held:
                raise ActorFailure("character_importing", "an import into this character is running; try again shortly", 409)
            entry = self._entries.get(name)
            if entry is not None and not entry.ref.is_alive():
                del self._entries[name]
                entry = None
            if entry is None:
                ref = CharacterSupervisor.start(name, self.services)
                entry = _Entry(ref, now)
                self._entries[name] = entry
                self.activations += 1
                log.info("activated a character (active=%d)", len(self._entries))
            self._entries.move_to_end(name)
            entry.last_used = now
            entry.inflight += 1
            victims = self._over_limit_locked()
        for victim in victims:
            self._stop(victim)
        return entry

    def _wait_stopped(self, name: str) -> None:
        future = self._stopping.get(name)
        if future is None:
            return
        try:
            future.get(timeout=self.services.settings.server.ask_timeout_seconds)
        except Exception:  # noqa: BLE001 - a failed stop still released the actor
            pass
        with self._lock:
            if self._stopping.get(name) is future:
                del self._stopping[name]

    async def _await_stopped(self, name: str) -> None:
        if name in self._stopping:
            await asyncio.to_thread(self._wait_stopped, name)

    def _release(self, name: str, entry: _Entry) -> None:
        with self._lock:
            entry.inflight -= 1
            entry.last_used = self.services.clock.monotonic()
            self._changed.notify_all()

    async def _await_unheld(self, name: str, timeout: float) -> None:
        event = self._held.get(name)
        if event is not None:
            await asyncio.to_thread(event.wait, timeout)

    @contextlib.contextmanager
    def hold(self, name: str, timeout: float) -> Iterator[None]:
        """Stop ``name``'s actors and keep them stopped while the block runs.

        New requests for ``name`` wait for the hold to end (up to their ask timeout) and
        then answer 409 ``character_importing``. The actors are stopped once the requests
        and model jobs in flight have finished, so their views are flushed and their files
        closed; the next request activates them again from disk. Raises CharacterBusy when
        ``name`` is not idle within ``timeout`` seconds, or is already held.
        """
        event = threading.Event()
        with self._lock:
            if name in self._held:
                raise CharacterBusy("another import into this character is running")
            self._held[name] = event
        try:
            entry = self._take_idle(name, timeout)
            if entry is not None:
                self._stop((name, entry))
            self._wait_stopped(name)
            if entry is not None and entry.ref.is_alive():
                raise CharacterBusy("the character's actors did not stop in time")
            yield
        finally:
            with self._lock:
                del self._held[name]
            event.set()

    def _take_idle(self, name: str, timeout: float) -> _Entry | None:
        """Remove ``name``'s entry once it is idle; None when it is not active."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                entry = self._entries.get(name)
                if entry is None:
                    return None
                if self._idle(name, entry):
                    del self._entries[name]
                    return entry
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CharacterBusy(f"the character stayed busy for {timeout:g} s")
                # Woken by a finished request; model jobs end without a notification,
                # so the wait is also bounded.
                self._changed.wait(min(left, 0.1))

    def tell(self, name: str, child: str, message: Any) -> None:
        """Deliver ``message`` to ``child`` of ``name``, activating the character."""
        entry = self._acquire(name)
        try:
            entry.ref.tell(Deliver(child=child, message=message))
        except pykka.ActorDeadError:
            # Passivated between lookup and tell: activate again, once.
            self._release(name, entry)
            entry = self._acquire(name)
            entry.ref.tell(Deliver(child=child, message=message))
        finally:
            self._release(name, entry)

    async def ask(self, name: str, child: str, make: Callable[[Reply], Any], timeout: float | None = None) -> Any:
        """Send ``make(reply)`` to ``child`` of character ``name`` and await the reply.

        Never blocks the event loop. Raises AskTimeout after ``timeout`` seconds (the
        ``ask_timeout_seconds`` setting by default) and ActorFailure when the actor failed.
        """
        loop = asyncio.get_running_loop()
        reply = Reply(loop)
        timeout = timeout or self.services.settings.server.ask_timeout_seconds
        await self._await_unheld(name, timeout)
        await self._await_stopped(name)
        entry = self._acquire(name)
        try:
            try:
                entry.ref.tell(Deliver(child=child, message=make(reply)))
            except pykka.ActorDeadError:
                self._release(name, entry)
                entry = self._acquire(name)
                entry.ref.tell(Deliver(child=child, message=make(reply)))
            return await reply.wait(timeout, f"character {child} actor")
        finally:
            self._release(name, entry)

    def ask_sync(self, name: str, child: str, make: Callable[[Reply], Any], timeout: float | None = None) -> Any:
        """Like :meth:`ask`, for callers on plain threads."""
        reply = Reply()
        timeout = timeout or self.services.settings.server.ask_timeout_seconds
        self.tell(name, child, make(reply))
        return reply.result(timeout, f"character {child} actor")

    # -- passivation -------------------------------------------------------------------
    def _idle(self, name: str, entry: _Entry) -> bool:
        return entry.inflight == 0 and self.services.pool.busy(name) == 0

    def _over_limit_locked(self) -> list[tuple[str, _Entry]]:
        limit = self.services.settings.runtime.max_active_characters
        victims: list[tuple[str, _Entry]] = []
        if len(self._entries) <= limit:
            return victims
        for name, entry in list(self._entries.items()):
            if len(self._entries) <= limit:
                break
            if self._idle(name, entry):
                del self._entries[name]
                victims.append((name, entry))
        return victims

    def sweep(self) -> int:
        """Passivate characters idle for longer than the setting; returns how many."""
        idle_for = self.services.settings.runtime.passivate_idle_seconds
        now = self.services.clock.monotonic()
        with self._lock:
            victims = [
                (name, entry)
                for name, entry in self._entries.items()
                if now - entry.last_used >= idle_for and self._idle(name, entry)
            ]
            for name, _entry in victims:
                del self._entries[name]
        for victim in victims:
            self._stop(victim)
        return len(victims)

    def _stop(self, victim: tuple[str, _Entry]) -> None:
        name, entry = victim
        try:
            # Non-blocking: the stop is queued behind the character's pending messages.
            future = entry.ref.stop(block=False)
            with self._lock:
                self._stopping[name] = future
        except pykka.ActorDeadError:
            pass
        self.passivations += 1
        log.info("passivated a character")

    def tick(self) -> None:
        with self._lock:
            refs = [entry.ref for entry in self._entries.values()]
        now = self.services.clock.monotonic()
        for ref in refs:
            try:
                ref.tell(Tick(monotonic=now))
            except pykka.ActorDeadError:
                pass

    # -- inspection --------------------------------------------------------------------
    def active_names(self) -> list[str]:
        with self._lock:
            return [name for name, entry in self._entries.items() if entry.ref.is_alive()]

    def active_count(self) -> int:
        return len(self.active_names())

    def describe(self, name: str, timeout: float = 5.0) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            return None
        reply = Reply()
        try:
            entry.ref.tell(Describe(reply=reply))
            described: dict[str, Any] | None = reply.result(timeout)
            return described
        except (pykka.ActorDeadError, ActorFailure):
            return None

    def release(self, name: str) -> bool:
        """Stop ``name``'s actors now and wait until they have flushed and closed every
        file, so that the folder can be renamed or deleted. False when it was not active."""
        with self._lock:
            entry = self._entries.pop(name, None)
            if entry is not None:
                # Registered as stopping first, so that a request arriving meanwhile waits
                # for the old instance to close its files before a new one opens them.
                try:
                    self._stopping[name] = entry.ref.stop(block=False)
                except pykka.ActorDeadError:
                    pass
        self._wait_stopped(name)
        if entry is None:
            return False
        self.passivations += 1
        log.info("released a character")
        return True

    def stop_all(self, timeout: float = 30.0) -> None:
        with self._lock:
            entries = list(self._entries.items())
            self._entries.clear()
        for _name, entry in entries:
            try:
                entry.ref.stop(block=True, timeout=timeout)
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
