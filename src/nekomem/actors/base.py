"""The mailbox every per-character child actor is: a ChildActor owns one layer object.

The layer object (see :mod:`nekomem.actors.layer`) holds its layer's state, logic and
message handlers and is the only code that mutates its files; the actor hands it each
message, for type ``Foo`` its method marked ``@handles(Foo)`` (see
:mod:`nekomem.actors.handlers`). A handler that raises
:class:`~nekomem.runtime.reply.ActorFailure` answers its caller with that error and the
actor keeps running; a storage fault answers with the fault and reloads the layer from
disk; any other exception answers 500, then crashes the actor so that its supervisor
with that fault and reloads the layer from disk; any other exception answers that request
500 ``internal_error`` and renews the layer in place: a fresh layer object loaded from disk
(in-memory state may be half-changed, the disk state is not), without a crash, so no
restart is counted and the layer keeps serving (``handler_errors`` in /health counts
these). Only a layer that cannot load its files crashes: its supervisor restarts it, and
marks it failed once the restart budget is spent (its storage is what failed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pykka

from nekomem.actors.handlers import handler_for
from nekomem.actors.layer import DeferredLoadFailed, Layer
from nekomem.actors.ports import ActorPorts, LayerPorts
from nekomem.domain.layers import Address
from nekomem.runtime.dispatch import Completion, DispatchedActor, Dispatcher
from nekomem.runtime.protocol import ChildCrashed, Flush, Tick, fail_message
from nekomem.runtime.reply import ActorFailure
from nekomem.runtime.services import CharacterContext, Counters, Services
from nekomem.runtime.timers import Wakeup
from nekomem.stores import fence
from nekomem.stores.faults import StorageFault, classify

__all__ = ["CharacterContext", "ChildActor", "Counters", "Services", "fail_message"]

log = logging.getLogger("nekomem.actors")


class ChildActor(DispatchedActor):
    """Base class: dispatch by message type, error replies, crash hand-off, timers.

    Runs on the process dispatcher (no thread of its own). Periodic and delayed work is
    asked for through :meth:`due_at` (on the injectable clock) and :meth:`real_due_at`
    (real time, for I/O batching): after every message the base arms one timer at the
    earliest of the two, and the actor receives ``Tick`` only when that time has come.
    """

    child_name: ClassVar[Address] = Address("")  # the layer's address (its declaration's; tests/test_typed_seams.py)

    def __init__(self, ctx: CharacterContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.log = logging.getLogger(f"nekomem.actors.{self.child_name}")
        floor = ctx.settings.runtime.timer_retry_floor_seconds
        self._wake = Wakeup(ctx.services.timers, self._post_tick, real=False, floor=floor)
        self._wake_real = Wakeup(ctx.services.timers, self._post_tick, real=True, floor=floor)
        self._needs_reload = False
        self._fault_reported = False
        # Not loaded on a storage fault: when (time.monotonic()) the load is tried again by
        # itself, and the wait after that one (doubling, see _schedule_reload).
        self._reload_at: float | None = None
        self._reload_delay: float | None = None
        # Real time of the next look when the cluster fence refused this character's
        # periodic work (see on_receive); None when it was allowed.
        self._fenced_until: float | None = None
        # The message whose handling failed in the layer's deferred load: the instance
        # that restarts this one handles it (see nekomem.actors.layer).
        self._redeliver: list[object] = []
        # A layer renewed after a handler error gets new ports: timers and model results
        # of the old generation are dropped, never delivered to the fresh layer.
        self._generation = 0
        self.ports = ActorPorts(ctx, self.child_name, self._teller(self._generation))
        # The layer object this mailbox owns: its state and logic, and the handlers of its
        # messages (see nekomem.actors.layer).
        self.layer: Layer = self.make_layer(self.ports)

    def make_layer(self, ports: LayerPorts) -> Layer:
        """The layer object this actor owns (built once per actor instance). Every child
        actor implements it."""
        raise NotImplementedError(f"{type(self).__name__} declares no layer")

    def _teller(self, generation: int) -> Callable[[object], None]:
        """A ``tell_self`` for the layer of ``generation``: a message posted through it
        after the layer was renewed (a late timer or model result) is dropped."""

        def tell(message: object) -> None:
            if generation != self._generation:
                return
            try:
                self.actor_ref.tell(message)
            except pykka.ActorDeadError:
                pass  # a timer or a model result that outlived its actor: nobody is left to handle it

        return tell

    def dispatcher(self) -> Dispatcher:
        return self.ctx.services.dispatcher

    # -- lifecycle -------------------------------------------------------------------
    def on_start(self) -> None:
        self._needs_reload = False
        try:
            self.load()
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                # Files this layer cannot read (a folder in place of facts.json): it crashes
                # as on a message, so the supervisor restarts it at once within the budget
                # and then marks it failed, answering the queued requests (pykka's start-up
                # failure path alone would drop them unanswered until their ask timeout).
                self.log.error("%s could not load for a character: %s", self.child_name, type(exc).__name__)
                self.on_failure(type(exc), exc, exc.__traceback__)
                raise
            self._storage_trouble(fault, exc)
        self._rearm()

    # -- storage faults --------------------------------------------------------------
    # A full, read-only or failing disk is the environment's fault: the message is
    # answered with the fault, the actor drops whatever in-memory change did not reach
    # the disk by reloading from disk, and it is never crashed (so never marked failed).
    # Until a reload succeeds, every message first retries it: the layer recovers by
    # itself as soon as the disk does.
    def _storage_trouble(self, fault: StorageFault, exc: BaseException) -> None:
        self.log.warning(
            "%s: %s for a character (%s)", self.child_name, fault.code, type(exc).__name__, exc_info=self.log.isEnabledFor(logging.DEBUG)
        )
        storage = self.ctx.services.storage
        if storage is not None:
            storage.report(self.ctx.name, self.child_name, fault)
        self._fault_reported = True
        self._needs_reload = True
        if self._reload() is not None:
            self._schedule_reload()

    def _schedule_reload(self) -> None:
        """The next reload attempt of a layer left unloaded by a storage fault: after
        storage_reload_retry_seconds, doubling per failed attempt up to its maximum. Nothing
        on a fixed tick: a disk that stays full costs at most one load a minute
        (storage_reload_retry_max_seconds)."""
        rt = self.ctx.settings.runtime
        delay = self._reload_delay if self._reload_delay is not None else rt.storage_reload_retry_seconds
        self._reload_at = time.monotonic() + delay
        self._reload_delay = min(delay * 2, rt.storage_reload_retry_max_seconds)

    def _reload(self) -> StorageFault | None:
        """Reload this layer from disk; the fault that stopped it, or None on success."""
        try:
            self.close()
        except Exception:
            self.log.debug("close before reload failed", exc_info=True)
        try:
            self.load()
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                raise
            return fault
        self._needs_reload = False
        self._reload_at = self._reload_delay = None
        self.log.info("%s reloaded from disk after a storage fault", self.child_name)
        return None

    def load(self) -> None:
        """Read this layer's state from disk. Called at start and after a restart."""
        self.layer.load()

    def on_release(self) -> Completion | None:
        self._stop_timers()
        # A layer whose load failed on a storage fault holds no trustworthy state: writing
        # it out would replace the files on disk with a partial copy.
        if not self._needs_reload:
            try:
                self.flush()
            except Exception as exc:
                if classify(exc) is None:
                    raise
                self.log.warning("%s: views not flushed at stop (%s)", self.child_name, type(exc).__name__)
        self.close()
        return None

    def flush(self) -> None:
        """Write any view that is behind its journal (called on stop and on Flush)."""
        self.layer.flush()

    def close(self) -> None:
        """Release files and connections."""
        self.layer.close()

    # -- timers ----------------------------------------------------------------------
    def due_at(self) -> float | None:
        """When this actor next has periodic or delayed work, on the clock's monotonic
        scale; None when nothing is due. Read after every message."""
        return self.layer.due_at()

    def real_due_at(self) -> float | None:
        """Like :meth:`due_at` on ``time.monotonic()`` (work paced in real time)."""
        return self.layer.real_due_at()

    def is_settled(self) -> bool:
        return not (self._wake.retrying or self._wake_real.retrying)

    def _post_tick(self) -> None:
        try:
            self.actor_ref.tell(Tick(monotonic=self.ctx.clock.monotonic()))
        except pykka.ActorDeadError:
            pass

    def _rearm(self) -> None:
        if self._needs_reload:
            # Not loaded (a storage fault): nothing of the layer is due; the next message
            # retries the load, and so does a Tick when the backoff's time comes.
            self._wake.want(None)
            self._wake_real.want(self._reload_at)
            return
        if self._fenced_until is not None:
            # Fenced (see on_receive): one look when the retry is due, whatever is due before.
            self._wake.want(None)
            self._wake_real.want(self._fenced_until)
            return
        self._wake.want(self.due_at())
        self._wake_real.want(self.real_due_at())

    def _stop_timers(self) -> None:
        self._wake.close()
        self._wake_real.close()
        self.ports.cancel_all()

    # -- dispatch --------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        handler = handler_for(self.layer, message)
        if handler is None and isinstance(message, Flush):
            handler = self._on_flush
        if handler is None:
            fail_message(message, ActorFailure("unknown_message", f"{self.child_name} cannot handle {type(message).__name__}"))
            return None
        if isinstance(message, Tick):
            if not fence.permits(self.ctx.paths.folder):
                # Cluster mode, a character this node may not write now (a take-over being
                # prepared while the dead owner's lease runs out, a shard being let go): the
                # periodic work of every layer writes (views, upkeep, a model's result), so
                # it waits, and is looked at again after cluster_fenced_retry_seconds.
                self._fenced_until = time.monotonic() + self.ctx.settings.cluster.cluster_fenced_retry_seconds
                self._rearm()
                return None
            self._fenced_until = None
        if self._needs_reload:
            fault = self._reload()
            if fault is not None:
                self._schedule_reload()
                fail_message(message, ActorFailure(fault.code, fault.message, fault.status))
                return None
        try:
            result = handler(message)
            if self._fault_reported:
                # A message handled without a storage fault: this layer is healthy again.
                self._fault_reported = False
                storage = self.ctx.services.storage
                if storage is not None:
                    storage.clear(self.ctx.name, self.child_name)
            return result
        except ActorFailure as exc:
            fail_message(message, exc)
            return None
        except DeferredLoadFailed as exc:
            # The layer could not read its files on first use: a failed load, not a bad
            # request. The actor crashes as a failed start does, this message goes with
            # the queued ones to the instance that restarts it.
            self.log.error("%s could not load for a character: %s", self.child_name, type(exc.cause).__name__)
            self._redeliver = [message]
            raise
        except Exception as exc:
            fault = classify(exc)
            if fault is not None:
                fail_message(message, ActorFailure(fault.code, fault.message, fault.status))
                self._storage_trouble(fault, exc)
                return None
            # A bug or an input nothing refused on the way in: this request is answered
            # with the error (its class only, never memory text) and the layer goes on
            # serving from its files; crashing here would let one request poison a
            # character (a few of them spend the restart budget and mark it failed).
            self.log.exception("%s failed on %s for a character; renewing it from disk", self.child_name, type(message).__name__)
            fail_message(message, ActorFailure("internal_error", f"{self.child_name} failed: {type(exc).__name__}", 500))
            self.ctx.services.counters.add("handler_errors")
            self._renew()
            return None
        finally:
            if not self.actor_stopped.is_set():
                self._rearm()

    def _renew(self) -> None:
        """Replace the layer object with a fresh one loaded from disk (after a handler
        error). A storage fault while loading takes the storage-trouble path; any other
        load failure is re-raised, so the actor crashes and its supervisor restarts it
        (and marks it failed once the restart budget is spent)."""
        self.ports.cancel_all()
        try:
            self.layer.close()
        except Exception:
            self.log.debug("close before renewal failed", exc_info=True)
        self._generation += 1
        self.ports = ActorPorts(self.ctx, self.child_name, self._teller(self._generation))
        self.layer = self.make_layer(self.ports)
        try:
            self.layer.load()
        except Exception as exc:
            fault = classify(exc)
            if fault is None:
                self._stop_timers()
                raise
            self._storage_trouble(fault, exc)

    def _on_flush(self, msg: Flush) -> None:
        # Every layer answers the supervisor's flush barrier the same way: its views are
        # written, and every message queued before the Flush has been handled.
        self.layer.flush()
        if msg.reply is not None:
            msg.reply.ok(True)

    def on_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        # pykka has already stopped this actor. Hand the messages still queued to the
        # supervisor, which restarts a fresh instance from disk and redelivers them.
        self._stop_timers()
        pending: list[object] = self._redeliver + [envelope.message for envelope in self.actor_inbox.drain()]
        self._redeliver = []
        try:
            self.close()
        except Exception:
            self.log.exception("close after crash failed")
        try:
            self.ctx.supervisor.tell(ChildCrashed(child=self.child_name, error=repr(exc_value), pending=pending))
        except pykka.ActorDeadError:
            for message in pending:
                fail_message(message, ActorFailure("character_stopped", "the character was stopped", 503))
