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
from typing import Any, Protocol

import pykka

from nekomem.domain.layers import Address
from nekomem.runtime.dispatch import ActorRef, mailbox_of
from nekomem.runtime.protocol import Deliver, Describe, Flush
from nekomem.runtime.reply import ActorFailure, AskTimeout, Reply
from nekomem.runtime.services import Routes, Services
from nekomem.runtime.timers import TimerHandle
from nekomem.stores.layout import CharacterPaths

log = logging.getLogger("nekomem.registry")


class CharacterBusy(RuntimeError):
    """A hold could not take a character: it stayed busy, or another hold has it."""


class ActorLayer(Protocol):
    """What the runtime needs of the actors layer (which it never imports)."""

    def start_supervisor(self, name: str, services: Services, routes: Routes) -> ActorRef[Any]:
        """Post the start of character ``name``'s supervisor, which keeps ``routes`` up to
        date with its live children."""
        ...

    def has_unfinished(self, paths: CharacterPaths, *, mine_backlog: bool = False, hold: contextlib.ExitStack | None = None) -> bool:
        """Whether the character has work left over from a crash, or with ``mine_backlog``
        turns waiting for fact extraction (start-up recovery). ``hold``: what the look
        opened to read the journal stays open until ``hold`` closes, so that the
        activation it decides does not read the WAL again to index it."""
        ...


class _Entry:
    __slots__ = ("ref", "routes", "last_used", "inflight")

    def __init__(self, ref: ActorRef[Any], routes: Routes, now: float) -> None:
        self.ref = ref
        self.routes = routes
        self.last_used = now
        self.inflight = 0

    def tell(self, child: Address, message: object) -> None:
        """To the live child directly, else through the supervisor; raises ActorDeadError
        when the character has stopped."""
        ref = self.routes.live(child)
        if ref is not None:
            try:
                ref.tell(message)
                return
            except pykka.ActorDeadError:
                pass
        self.ref.tell(Deliver(child=child, message=message))


# The error code of a request that met a hold for longer than its ask timeout.
HELD_CODE = "character_importing"


class CharacterRegistry:
    def __init__(self, services: Services, actors: ActorLayer, *, on_stopped: Callable[[int, int], None] | None = None) -> None:
        self.services = services
        # Told (stopped, still active) when a character's instance has stopped.
        self._on_stopped = on_stopped
        self._start_supervisor = actors.start_supervisor
        # True for a name /release_character holds: no instance of it is started then.
        self.released: Callable[[str], bool] | None = None
        self._sweep_timer: TimerHandle | None = None
        self._lock = threading.Lock()  # guards the name -> supervisor map, not domain state
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # name -> the supervisor of a stopping instance. A character is not activated
        # again until its previous instance has flushed and released its files.
        self._stopping: dict[str, ActorRef[Any]] = {}
        # name -> event set when a hold (an import writing the character's files) ends.
        self._held: dict[str, threading.Event] = {}
        # name -> requests waiting for a hold to end: a new hold lets them in first.
        self._waiting: dict[str, int] = {}
        self._changed = threading.Condition(self._lock)
        self.activations = 0
        self.passivations = 0
        # Told a name once this process may have finished changing its files: its instance
        # stopped (or died), or a hold of it ended (the character list's summary compares
        # that character's row again; stores/character_summary.py).
        self.on_released: Callable[[str], None] | None = None

    # -- activation --------------------------------------------------------------------
    def _acquire(self, name: str, *, block: bool = True) -> _Entry | None:
        """The live entry of ``name``, activating it; counts one request in flight. While a
        previous instance is still stopping: waits for it, or returns None unless ``block``."""
        if block:
            self._wait_stopped(name)
        now = self.services.clock.monotonic()
        with self._lock:
            if name in self._held:
                raise ActorFailure(HELD_CODE, "an import, export or deletion of this character is running; try again shortly", 409)
            stopping = self._stopping.get(name)
            if stopping is not None:
                if not mailbox_of(stopping).terminated:
                    if block:
                        raise AskTimeout(
                            "the previous instance of the character to stop", self.services.settings.server.ask_timeout_seconds
                        )
                    return None
                del self._stopping[name]
            entry = self._entries.get(name)
            if entry is not None and not entry.ref.is_alive():
                del self._entries[name]
                entry = None
                self._released(name)
            if entry is None and self.released is not None and self.released(name):
                # /release_character holds the name: its folder is being renamed or deleted,
                # and an instance started now would reopen (or recreate) it.
                raise ActorFailure("character_release_in_progress", "character release in progress", 409)
            if entry is None:
                # Only the start is posted here; the supervisor opens the character's files
                # and starts its children on a dispatcher worker, never on the caller.
                routes = Routes()
                ref = self._start_supervisor(name, self.services, routes)
                entry = _Entry(ref, routes, now)
                self._entries[name] = entry
                self.activations += 1
                log.info("activated a character (active=%d)", len(self._entries))
            self._entries.move_to_end(name)
            entry.last_used = now
            entry.inflight += 1
            victims = self._over_limit_locked()
        for victim in victims:
            self._stop(victim)
        self._arm_sweep()
        return entry

    def _forget_when_stopped(self, name: str, ref: ActorRef[Any]) -> None:
        """Once the stopping instance has released its files, drop it from the stopping
        map: it holds the instance's whole state, which would otherwise stay in memory
        until the character's next activation."""

        def forget() -> None:
            with self._lock:
                if self._stopping.get(name) is ref:
                    del self._stopping[name]
                active = len(self._entries)
            self._released(name)
            if self._on_stopped is not None:
                self._on_stopped(1, active)

        mailbox_of(ref).when_terminated(forget)

    def _wait_stopped(self, name: str) -> None:
        """Block (a plain thread) until a stopping previous instance of ``name`` has
        released its files; bounded by ``ask_timeout_seconds``."""
        ref = self._stopping.get(name)
        if ref is None:
            return
        done = threading.Event()
        mailbox_of(ref).when_terminated(done.set)
        done.wait(self.services.settings.server.ask_timeout_seconds)

    async def _await_stopped(self, name: str) -> None:
        """Like :meth:`_wait_stopped` without blocking the event loop."""
        ref = self._stopping.get(name)
        if ref is None:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not done.done():
                done.set_result(None)

        def wake() -> None:
            loop.call_soon_threadsafe(settle)

        mailbox_of(ref).when_terminated(wake)
        try:
            await asyncio.wait_for(done, self.services.settings.server.ask_timeout_seconds)
        except TimeoutError:
            raise AskTimeout("the previous instance of the character to stop", self.services.settings.server.ask_timeout_seconds) from None

    def _release(self, name: str, entry: _Entry) -> None:
        with self._lock:
            entry.inflight -= 1
            entry.last_used = self.services.clock.monotonic()
            self._changed.notify_all()

    async def _acquire_unheld(self, name: str, timeout: float) -> _Entry:
        """:meth:`_acquire_async` once no hold of ``name`` runs: a request that meets a hold
        (an export, import or deletion) waits for it, and for any hold taken before it
        got in, up to ``timeout`` seconds; past that it answers 409 ``character_importing``.
        While such a request waits, no new hold starts (see :meth:`hold`)."""
        if name not in self._held:
            try:
                return await self._acquire_async(name)
            except ActorFailure as exc:
                if exc.code != HELD_CODE:
                    raise
        deadline = time.monotonic() + timeout
        with self._lock:
            self._waiting[name] = self._waiting.get(name, 0) + 1
        try:
            while True:
                event = self._held.get(name)
                left = deadline - time.monotonic()
                if event is not None and left > 0:
                    await asyncio.to_thread(event.wait, left)
                    continue
                try:
                    return await self._acquire_async(name)
                except ActorFailure as exc:
                    # Held again between the wake-up and the acquire: wait again.
                    if exc.code != HELD_CODE or time.monotonic() >= deadline:
                        raise
        finally:
            with self._lock:
                left_waiting = self._waiting[name] - 1
                if left_waiting:
                    self._waiting[name] = left_waiting
                else:
                    del self._waiting[name]
                self._changed.notify_all()

    @contextlib.contextmanager
    def hold(self, name: str, timeout: float) -> Iterator[None]:
        """Stop ``name``'s actors and keep them stopped while the block runs.

        New requests for ``name`` wait for the hold to end (up to their ask timeout; past
        it they answer 409 ``character_importing``). Held by an import, a character
        deletion and a character export. A second hold waits for the first to end, and
        for the requests that waited for it to get in (so two export loops cannot keep a
        writer out). The actors are stopped once the requests and model jobs in flight
        have finished, so their views are flushed and their files closed; the next
        request activates them again from disk. Raises CharacterBusy when ``name`` is not
        free and idle within ``timeout`` seconds.
        """
        event = threading.Event()
        deadline = time.monotonic() + timeout
        with self._lock:
            while name in self._held or self._waiting.get(name):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CharacterBusy(f"another import, export or deletion of this character ran for {timeout:g} s")
                self._changed.wait(min(left, 0.1))
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
            # The block may have replaced or removed the files: the fact backlog count
            # published by the stopped actors is read again (from disk, or at the next load).
            self.services.backlog.forget(name)
            with self._lock:
                del self._held[name]
                self._changed.notify_all()
            event.set()
            self._released(name)

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

    def tell(self, name: str, child: Address, message: object) -> None:
        """Deliver ``message`` to ``child`` of ``name``, activating the character."""
        entry = self._acquire_now(name)
        try:
            entry.tell(child, message)
        except pykka.ActorDeadError:
            # Passivated between lookup and tell: activate again, once.
            self._release(name, entry)
            entry = self._acquire_now(name)
            entry.tell(child, message)
        finally:
            self._release(name, entry)

    async def ask(self, name: str, child: Address, make: Callable[[Reply], object], timeout: float | None = None) -> object:
        """Send ``make(reply)`` to ``child`` of character ``name`` and await the reply.

        Never blocks the event loop. Raises AskTimeout after ``timeout`` seconds (the
        ``ask_timeout_seconds`` setting by default) and ActorFailure when the actor failed.
        """
        loop = asyncio.get_running_loop()
        reply = Reply(loop)
        timeout = timeout or self.services.settings.server.ask_timeout_seconds
        entry = await self._acquire_unheld(name, timeout)
        try:
            try:
                entry.tell(child, make(reply))
            except pykka.ActorDeadError:
                self._release(name, entry)
                entry = await self._acquire_async(name)
                entry.tell(child, make(reply))
            return await reply.wait(timeout, f"character {child} actor")
        finally:
            self._release(name, entry)

    def _acquire_now(self, name: str) -> _Entry:
        """:meth:`_acquire` that waits for a stopping instance (so it never returns None)."""
        entry = self._acquire(name, block=True)
        assert entry is not None  # a blocking acquire waits or raises
        return entry

    async def _acquire_async(self, name: str) -> _Entry:
        # Activation only posts the supervisor's start: nothing here blocks the loop.
        while True:
            await self._await_stopped(name)
            entry = self._acquire(name, block=False)
            if entry is not None:
                return entry

    def activate(self, name: str) -> None:
        """Make character ``name`` active (its start is posted, not awaited)."""
        entry = self._acquire_now(name)
        self._release(name, entry)

    def ask_sync(self, name: str, child: Address, make: Callable[[Reply], object], timeout: float | None = None) -> object:
        """Like :meth:`ask`, for callers on plain threads."""
        reply = Reply()
        timeout = timeout or self.services.settings.server.ask_timeout_seconds
        self.tell(name, child, make(reply))
        return reply.result(timeout, f"character {child} actor")

    # -- passivation -------------------------------------------------------------------
    def _idle(self, name: str, entry: _Entry) -> bool:
        return entry.inflight == 0 and self.services.pool.busy(name) == 0

    def _over_limit_locked(self) -> list[tuple[str, _Entry]]:
        limit = self.services.max_active or self.services.settings.runtime.max_active_characters
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
                (name, entry) for name, entry in self._entries.items() if now - entry.last_used >= idle_for and self._idle(name, entry)
            ]
            for name, _entry in victims:
                del self._entries[name]
        for victim in victims:
            self._stop(victim)
        return len(victims)

    def _arm_sweep(self) -> None:
        """Keep one timer armed at the earliest time an active character can become idle
        long enough to passivate; nothing runs while no character is active."""
        with self._lock:
            if not self._entries:
                return
            # Entries are in least-recently-acquired order: the first is (about) the oldest;
            # the sweep itself checks every entry exactly.
            oldest = next(iter(self._entries.values())).last_used
            due = oldest + self.services.settings.runtime.passivate_idle_seconds
            armed = self._sweep_timer
            if armed is not None and not armed.cancelled and armed.due <= due:
                return
            if armed is not None:
                armed.cancel()
            self._sweep_timer = self.services.timers.call_at(due, self._on_sweep_timer)

    def _on_sweep_timer(self) -> None:
        with self._lock:
            self._sweep_timer = None
        self.sweep()
        rt = self.services.settings.runtime
        now = self.services.clock.monotonic()
        with self._lock:
            busy = any(now - e.last_used >= rt.passivate_idle_seconds for e in self._entries.values())
        if busy:
            # Idle long enough but with work in flight: look again after the retry floor.
            with self._lock:
                self._sweep_timer = self.services.timers.call_later(rt.timer_retry_floor_seconds, self._on_sweep_timer, real=True)
        else:
            self._arm_sweep()

    def _stop(self, victim: tuple[str, _Entry]) -> None:
        name, entry = victim
        try:
            # Non-blocking: the stop is queued behind the character's pending messages.
            entry.ref.stop_later()
            with self._lock:
                self._stopping[name] = entry.ref
            self._forget_when_stopped(name, entry.ref)
        except pykka.ActorDeadError:
            pass
        self.passivations += 1
        log.info("passivated a character")

    def _released(self, name: str) -> None:
        """Tell :attr:`on_released` (it never blocks on a listing; see the attribute)."""
        if self.on_released is not None:
            self.on_released(name)

    # -- inspection --------------------------------------------------------------------
    def writing_names(self) -> set[str]:
        """The characters whose files this process may be changing now: active, stopping
        (flushing before they release their files) or held (an import, export, move or
        deletion running)."""
        with self._lock:
            return set(self._entries) | set(self._stopping) | set(self._held)

    def active_names(self) -> list[str]:
        with self._lock:
            return [name for name, entry in self._entries.items() if entry.ref.is_alive()]

    def is_active(self, name: str) -> bool:
        """Whether ``name``'s actors are alive now (no list of every active name is built)."""
        with self._lock:
            entry = self._entries.get(name)
        return entry is not None and entry.ref.is_alive()

    def active_count(self) -> int:
        return len(self.active_names())

    def stopping_count(self) -> int:
        """Instances told to stop that have not yet released their files."""
        with self._lock:
            return len(self._stopping)

    def mailbox_depths(self) -> tuple[int, int]:
        """(messages queued in the mailboxes of every active character's actors, the
        longest single mailbox), read at a /metrics scrape instead of counted per message."""
        with self._lock:
            entries = list(self._entries.values())
        total = longest = 0
        for entry in entries:
            for ref in (entry.ref, *list(entry.routes.children.values())):
                try:
                    depth = len(mailbox_of(ref))
                except TypeError:
                    continue  # not a dispatched actor (a test double)
                total += depth
                longest = max(longest, depth)
        return total, longest

    def describe(self, name: str, timeout: float = 5.0) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            return None
        reply = Reply()
        try:
            entry.ref.tell(Describe(reply=reply))
            described = reply.result(timeout)
        except (pykka.ActorDeadError, ActorFailure):
            return None
        return described if isinstance(described, dict) else None

    def flush(self, name: str, timeout: float | None = None) -> bool:
        """The flush barrier of one active character: returns once every child has handled
        what it had queued and written its views; False when the character is not active.
        Raises AskTimeout. Call from a plain thread, not the event loop."""
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            self._wait_stopped(name)  # a stopping instance has flushed once it is gone
            return False
        reply = Reply()
        try:
            entry.ref.tell(Flush(reply=reply))
        except pykka.ActorDeadError:
            return False
        reply.result(timeout or self.services.settings.server.ask_timeout_seconds, "the flush barrier")
        return True

    def quiesce(self, name: str, timeout: float | None = None) -> bool:
        """Flush barriers until character ``name`` is quiet: no model job in flight, no
        child with work already due, and no message handled between two barriers but the
        barrier's own. Returns False when the character is not active. Raises AskTimeout
        after ``timeout`` seconds in all (the wait is real time)."""
        timeout = timeout or self.services.settings.server.ask_timeout_seconds
        end = time.monotonic() + timeout  # real time: a manual clock does not move here
        last = -1
        while time.monotonic() < end:
            if not self.flush(name, max(0.1, end - time.monotonic())):
                return False
            handled = self._handled(name)
            settled = all(mailbox_of(ref).settled for ref in self._children_of(name))
            if handled == last and settled and self.services.pool.busy(name) == 0:
                return True
            if not settled:
                time.sleep(0.02)  # a retry timer is armed: let it fire
            last = handled + len(self._children_of(name))  # the next barrier's own Flushes
        raise AskTimeout("the character to become quiet", timeout)

    def _children_of(self, name: str) -> list[ActorRef[Any]]:
        with self._lock:
            entry = self._entries.get(name)
        return [] if entry is None else list(entry.routes.children.values())

    def _handled(self, name: str) -> int:
        return sum(mailbox_of(ref).handled for ref in self._children_of(name))

    def release(self, name: str) -> bool:
        """Stop ``name``'s actors now and wait until they have flushed and closed every
        file, so that the folder can be renamed or deleted. False when it was not active."""
        with self._lock:
            entry = self._entries.pop(name, None)
            if entry is not None:
                # Registered as stopping first, so that a request arriving meanwhile waits
                # for the old instance to close its files before a new one opens them.
                entry.ref.stop_later()
                self._stopping[name] = entry.ref
        if entry is not None:
            self._forget_when_stopped(name, entry.ref)
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
        # Every character stops at once (the pool runs their flushes); then wait for all,
        # and for instances that were already stopping.
        futures = [entry.ref.stop_later() for _name, entry in entries]
        with self._lock:
            stopping = list(self._stopping.values())
        deadline = time.monotonic() + timeout
        for future in futures:
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except (pykka.ActorDeadError, pykka.Timeout):
                pass
        for ref in stopping:
            done = threading.Event()
            mailbox_of(ref).when_terminated(done.set)
            done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            if self._sweep_timer is not None:
                self._sweep_timer.cancel()
                self._sweep_timer = None
