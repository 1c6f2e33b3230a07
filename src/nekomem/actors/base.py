"""The base of every per-character child actor.

A child owns one layer's files and is the only code that mutates them. It receives
msgspec message Structs (see :mod:`nekomem.actors.messages`); the handler for ``Foo`` is the
method ``on_Foo``. A handler that raises :class:`~nekomem.runtime.reply.ActorFailure`
answers its caller with that error and keeps running; any other exception answers 500,
then crashes the actor so that its supervisor restarts it from disk (in-memory state may
be half-changed, the disk state is not).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pykka

from nekomem.actors.handlers import handler_for
from nekomem.runtime.reply import ActorFailure, Reply

log = logging.getLogger("nekomem.actors")


class Counters:
    """Process-wide counters for /health (thread-safe)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


@dataclass
class Services:
    """Process-wide services shared by every character."""

    settings: Any  # nekomem.config.Settings
    clock: Any  # nekomem.runtime.clock.Clock
    pool: Any  # nekomem.runtime.pool.ModelPool
    memory_root: Path
    llm: Any = None  # nekomem.providers.llm.LLMClient | None
    embeddings: Any = None  # nekomem.recall.embeddings.EmbeddingService | None
    switches: Any = None  # nekomem.runtime.switches.Switches
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    counters: Counters = field(default_factory=Counters)


@dataclass
class CharacterContext:
    """What a child actor knows about its character and the world."""

    name: str
    paths: Any  # nekomem.stores.layout.CharacterPaths
    services: Services
    journal: Any  # nekomem.stores.journal.EventJournal (internally serialised)
    supervisor: pykka.ActorRef[Any]

    @property
    def settings(self) -> Any:
        return self.services.settings

    @property
    def clock(self) -> Any:
        return self.services.clock

    def send(self, child: str, message: Any) -> None:
        """Deliver ``message`` to sibling ``child`` through the supervisor (never blocks)."""
        from nekomem.actors.messages import Deliver

        try:
            self.supervisor.tell(Deliver(child=child, message=message))
        except pykka.ActorDeadError:
            fail_message(message, ActorFailure("character_stopped", "the character was stopped", 503))

    def submit_model_job(self, child: str, job: Callable[[], Any], wrap: Callable[[Any, BaseException | None], Any]) -> None:
        """Run ``job`` on the model pool; its outcome comes back to ``child`` as ``wrap(result, error)``.

        Raises nekomem.runtime.pool.PoolFull when the pool queue is at its limit.
        """
        self.services.pool.submit(self.name, job, lambda result, error: self.send(child, wrap(result, error)))


def fail_message(message: Any, error: BaseException) -> None:
    reply = getattr(message, "reply", None)
    if isinstance(reply, Reply):
        reply.fail(error)


class ChildActor(pykka.ThreadingActor):
    """Base class: dispatch by message type, error replies, crash hand-off."""

    child_name: ClassVar[str] = ""

    def __init__(self, ctx: CharacterContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.log = logging.getLogger(f"nekomem.actors.{self.child_name}")

    # -- lifecycle -------------------------------------------------------------------
    def on_start(self) -> None:
        self.load()

    def load(self) -> None:
        """Read this layer's state from disk. Called at start and after a restart."""

    def on_stop(self) -> None:
        self.flush()
        self.close()

    def flush(self) -> None:
        """Write any view that is behind its journal (called on stop and on Flush)."""

    def close(self) -> None:
        """Release files and connections."""

    # -- model calls -----------------------------------------------------------------
    def model_available(self, task: str) -> bool:
        llm = self.ctx.services.llm
        return llm is not None and llm.available(llm.tier_for(task))

    def ask_model(
        self,
        kind: str,
        task: str,
        messages: list[dict[str, Any]],
        *,
        context: Any = None,
        timeout: float | None = None,
    ) -> int | None:
        """Run LLM ``task`` on the model pool; the outcome returns to this actor as
        ``ModelDone(kind, token, output, error, context)``. Returns the token, or None when
        the task's tier has no endpoint or the pool is full (the caller retries later)."""
        from nekomem.actors.messages import ModelDone
        from nekomem.runtime.pool import PoolFull

        if not self.model_available(task):
            return None
        llm = self.ctx.services.llm
        self._model_seq = getattr(self, "_model_seq", 0) + 1
        token = self._model_seq

        def job() -> Any:
            return llm.run(task, messages, timeout=timeout)

        def wrap(result: Any, error: BaseException | None) -> Any:
            return ModelDone(kind=kind, token=token, output=result, error=None if error is None else repr(error), context=context)

        try:
            self.ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            return None
        return token

    def on_ModelDone(self, msg: Any) -> None:
        handler = getattr(self, "done_" + msg.kind, None)
        if handler is None:
            self.log.warning("no handler for model result %s", msg.kind)
            return
        handler(msg)

    # -- dispatch --------------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        handler = handler_for(self, message)
        if handler is None:
            fail_message(message, ActorFailure("unknown_message", f"{self.child_name} cannot handle {type(message).__name__}"))
            return None
        try:
            return handler(message)
        except ActorFailure as exc:
            fail_message(message, exc)
            return None
        except Exception as exc:
            self.log.exception("%s crashed on %s for a character", self.child_name, type(message).__name__)
            fail_message(message, ActorFailure("internal_error", f"{self.child_name} failed: {type(exc).__name__}", 500))
            raise

    def on_failure(self, exc_type: Any, exc_value: Any, tb: Any) -> None:
        # pykka has already stopped this actor. Hand the messages still queued to the
        # supervisor, which restarts a fresh instance from disk and redelivers them.
        pending: list[Any] = []
        while True:
            try:
                envelope = self.actor_inbox.get_nowait()
            except queue.Empty:
                break
            pending.append(envelope.message)
        try:
            self.close()
        except Exception:  # noqa: BLE001
            self.log.exception("close after crash failed")
        from nekomem.actors.messages import ChildCrashed

        try:
            self.ctx.supervisor.tell(ChildCrashed(child=self.child_name, error=repr(exc_value), pending=pending))
        except pykka.ActorDeadError:
            for message in pending:
                fail_message(message, ActorFailure("character_stopped", "the character was stopped", 503))
