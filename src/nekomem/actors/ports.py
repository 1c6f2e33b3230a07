"""What a layer object may do outside itself: the ports its actor gives it.

A layer (the plain object an actor owns: its state and logic) never touches pykka nor the
runtime's :class:`~nekomem.runtime.services.CharacterContext`. It reaches the rest of its
character through one :class:`LayerPorts`, a protocol of what a layer may do: send a
message to a sibling by its :data:`~nekomem.domain.layers.Address`, post itself a message
later (on the injectable clock, or at a real-time deadline), feed the recall index, run a
model job whose outcome comes back as a typed message (:meth:`LayerPorts.run_job`, the one
way onto the model pool; :meth:`LayerPorts.ask_model` is an LLM task through it), journal,
report storage health, and read the character's clock, names, files and settings.

:class:`ActorPorts` is the implementation a :class:`~nekomem.actors.base.ChildActor` builds
over its context; a test builds its layer over ``tests/support/fake_ports.FakePorts``
instead, without a runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from nekomem.actors.messages import IndexUpsert, PostTurn, ReplyMentions
from nekomem.config import Settings
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import PERSONA, RECALL, REFLECTIONS, Address
from nekomem.domain.turns import Turn
from nekomem.recall.pending import PendingCounter, lacking_vectors
from nekomem.runtime.clock import Clock, iso
from nekomem.runtime.pool import PoolFull
from nekomem.runtime.protocol import Message
from nekomem.runtime.services import CharacterContext, OutboxTally
from nekomem.runtime.timers import TimerHandle
from nekomem.stores.applied import SharedJournal
from nekomem.stores.fact_backlog import BacklogTally
from nekomem.stores.faults import StorageHealth
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.neko_cards import CharacterCards

if TYPE_CHECKING:
    from nekomem.models.embeddings import EmbeddingService
    from nekomem.models.llm import LLMClient
    from nekomem.models.llm_rerank import LlmReranker
    from nekomem.models.rerank import Reranker

# (token, output, error) -> the typed message that brings an LLM task's outcome home.
ResultFactory = Callable[[int, object, str | None], Message]
# (result, error) -> the typed message that brings a model job's outcome home.
Wrap = Callable[[object, BaseException | None], Message]
# What a model service calls back with (result, error) when it finishes a job.
Done = Callable[[object, BaseException | None], None]


def model_task(
    llm: LLMClient,
    token: int,
    task: str,
    messages: Sequence[Mapping[str, object]],
    done: ResultFactory,
    timeout: float | None,
) -> tuple[Callable[[], object], Wrap]:
    """The pool job that runs LLM ``task`` on ``messages`` (copied now: the caller may go on
    changing its own), and the wrap that turns its outcome into ``done(token, output, error)``."""
    prompt = [dict(message) for message in messages]

    def job() -> object:
        return llm.run(task, prompt, timeout=timeout)

    def wrap(result: object, error: BaseException | None) -> Message:
        return done(token, result, None if error is None else repr(error))

    return job, wrap


class LayerPorts(Protocol):
    """What one child layer of one character may do outside itself.

    Attributes are read-only views of the character: ``character`` (its name), ``child``
    (this layer's address), ``log``, ``paths`` (its files), ``settings``, ``clock``,
    ``journal`` (the character's shared event journal), and the process services a layer
    may use (``storage``, ``embeddings``, ``llm``, ``reranker``, ``llm_reranker``, ``cards`` and the tallies
    it publishes to: ``pending``, ``backlog``, ``outbox_tally``).
    """

    @property
    def character(self) -> str: ...
    @property
    def child(self) -> str: ...
    @property
    def log(self) -> logging.Logger: ...
    @property
    def paths(self) -> CharacterPaths: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def journal(self) -> SharedJournal: ...
    @property
    def storage(self) -> StorageHealth | None: ...
    @property
    def embeddings(self) -> EmbeddingService | None: ...
    @property
    def llm(self) -> LLMClient | None: ...
    @property
    def reranker(self) -> Reranker | None: ...
    @property
    def llm_reranker(self) -> LlmReranker | None: ...
    @property
    def cards(self) -> CharacterCards | None: ...
    @property
    def pending(self) -> PendingCounter: ...
    @property
    def backlog(self) -> BacklogTally: ...
    @property
    def outbox_tally(self) -> OutboxTally: ...

    # -- messages --------------------------------------------------------------------
    def send(self, child: Address, message: object) -> None:
        """Deliver ``message`` to sibling ``child`` (never blocks)."""

    def tell_self(self, message: object) -> None:
        """Post ``message`` to this layer's own mailbox (handled after the current one)."""

    def schedule(self, delay: float, message: object, *, real: bool = False) -> TimerHandle:
        """Post ``message`` to this layer after ``delay`` seconds of the injectable clock (or
        real seconds when ``real``)."""

    def cancel(self, handle: TimerHandle) -> None:
        """Take back a timer :meth:`schedule` armed."""

    def deadline(self, delay: float, message: object) -> None:
        """Post ``message`` to this layer after ``delay`` real seconds, whatever the clock
        (a wait on a model on this machine); it cannot be taken back."""

    def first_load(self) -> bool:
        """Count a load of this layer; True when it is the first of this activation (a
        second load is a restart after a crash or a renewal)."""

    # -- recall feed -----------------------------------------------------------------
    def index_upsert(self, entries: list[IndexEntry], replace_tier: str | None = None, views: list[list[int] | None] | None = None) -> None:
        """Send ``entries`` to the recall layer, counting those still lacking a vector
        (``views``: the identities of the view files a complete feed was read from, which
        lets recall keep the rows of a persisted segment of the same files)."""

    def announce_stored_turns(self, turns: list[Turn]) -> None:
        """Tell the reflection and persona layers about stored turns."""

    # -- model jobs ------------------------------------------------------------------
    def model_available(self, task: str) -> bool:
        """Whether LLM ``task``'s tier has an endpoint."""

    def run_job(self, job: Callable[[], object], done: Wrap, *, lane: str = "") -> bool:
        """Run ``job`` on the model pool; its outcome comes back to this layer as the
        message ``done(result, error)``. False when the pool is full (retry later)."""

    def ask_model(
        self, task: str, messages: Sequence[Mapping[str, object]], done: ResultFactory, *, timeout: float | None = None
    ) -> int | None:
        """Run LLM ``task`` through :meth:`run_job`; the outcome comes back as
        ``done(token, output, error)``. The token, or None (no endpoint, pool full)."""

    def result_sender(self, done: Wrap) -> Done:
        """A callback for a model service that runs a job off the pool (a user's query
        embedding): it brings ``done(result, error)`` home as :meth:`run_job` does."""

    # -- the character ---------------------------------------------------------------
    def now(self) -> datetime: ...
    def now_iso(self) -> str: ...
    def powerful(self) -> bool:
        """The powerful-memory switch, re-read on every use."""

    def review_enabled(self) -> bool:
        """The recent-window review switch, re-read on every use."""

    def names(self) -> dict[str, str]:
        """Names for prompts: the user's and the character's."""

    def stop_names(self) -> list[str]:
        """Names removed before keyword matching."""


class ActorPorts:
    """The :class:`LayerPorts` of one child layer of one character, over its context.

    ``tell_self`` posts a message to the owning actor's mailbox (it must not raise when the
    actor is gone: a late timer or model result is then simply dropped).
    """

    def __init__(self, ctx: CharacterContext, child: Address, tell_self: Callable[[object], None]) -> None:
        self._ctx = ctx
        self._services = ctx.services
        self._child = child
        self._log = logging.getLogger(f"nekomem.actors.{child}")
        self._tell_self = tell_self
        self._timers: set[TimerHandle] = set()
        self._model_seq = 0

    # -- the character's parts ---------------------------------------------------------
    @property
    def character(self) -> str:
        return self._ctx.name

    @property
    def child(self) -> str:
        return self._child

    @property
    def log(self) -> logging.Logger:
        return self._log

    @property
    def paths(self) -> CharacterPaths:
        return self._ctx.paths

    @property
    def settings(self) -> Settings:
        return self._services.settings

    @property
    def clock(self) -> Clock:
        return self._services.clock

    @property
    def journal(self) -> SharedJournal:
        return self._ctx.journal

    @property
    def storage(self) -> StorageHealth | None:
        return self._services.storage

    @property
    def embeddings(self) -> EmbeddingService | None:
        return self._services.embeddings

    @property
    def llm(self) -> LLMClient | None:
        return self._services.llm

    @property
    def reranker(self) -> Reranker | None:
        return self._services.reranker

    @property
    def llm_reranker(self) -> LlmReranker | None:
        return self._services.llm_reranker

    @property
    def cards(self) -> CharacterCards | None:
        return self._services.cards

    @property
    def pending(self) -> PendingCounter:
        return self._services.pending

    @property
    def backlog(self) -> BacklogTally:
        return self._services.backlog

    @property
    def outbox_tally(self) -> OutboxTally:
        return self._services.outbox

    # -- messages --------------------------------------------------------------------
    def send(self, child: Address, message: object) -> None:
        """Deliver ``message`` to sibling ``child`` (never blocks; see CharacterContext.send)."""
        self._ctx.send(child, message)

    def tell_self(self, message: object) -> None:
        """Post ``message`` to this layer's own mailbox (handled after the current one)."""
        self._tell_self(message)

    def schedule(self, delay: float, message: object, *, real: bool = False) -> TimerHandle:
        """Post ``message`` to this layer after ``delay`` seconds (of the injectable clock,
        or real seconds when ``real``); :meth:`cancel` the handle to take it back."""
        box: list[TimerHandle] = []

        def fire() -> None:
            self._timers.discard(box[0])
            self._tell_self(message)

        handle = self._services.timers.call_later(delay, fire, real=real)
        box.append(handle)
        self._timers.add(handle)
        return handle

    def cancel(self, handle: TimerHandle) -> None:
        handle.cancel()
        self._timers.discard(handle)

    def cancel_all(self) -> None:
        """Take back every timer still armed (the actor stops or crashed)."""
        for handle in list(self._timers):
            handle.cancel()
        self._timers.clear()

    def deadline(self, delay: float, message: object) -> None:
        tell = self._tell_self
        self._services.deadlines.schedule(delay, lambda: tell(message))

    def first_load(self) -> bool:
        return self._ctx.loads.count(self._child) == 1

    # -- recall feed -----------------------------------------------------------------
    def index_upsert(self, entries: list[IndexEntry], replace_tier: str | None = None, views: list[list[int] | None] | None = None) -> None:
        """Send ``entries`` to RecallActor. Those still lacking a vector count as pending
        embeddings from now on (so /health never reports 0 between a write's
        acknowledgement and RecallActor reading it; see :mod:`nekomem.recall.pending`)."""
        emb = self._services.embeddings
        counted = 0
        if emb is not None and emb.state != "disabled" and self.settings.recall.recall_legs != "bm25":
            try:
                model: str | None = emb.model_id
            except Exception:  # noqa: BLE001 - a broken embedding component must not break the owner
                model = None
            counted = lacking_vectors(entries, model)
            self._services.pending.sent(self._ctx.name, counted)
        self.send(RECALL, IndexUpsert(entries=entries, replace_tier=replace_tier, counted=counted, views=views))

    def announce_stored_turns(self, turns: list[Turn]) -> None:
        announce_stored_turns(self, turns)

    # -- model jobs ------------------------------------------------------------------
    def model_available(self, task: str) -> bool:
        llm = self._services.llm
        return llm is not None and llm.available(llm.tier_for(task))

    def result_sender(self, done: Wrap) -> Done:
        ctx, child = self._ctx, self._child

        def home(result: object, error: BaseException | None) -> None:
            ctx.send(child, done(result, error))

        return home

    def run_job(self, job: Callable[[], object], done: Wrap, *, lane: str = "") -> bool:
        """Run ``job`` on the model pool under this character's key (``lane`` names a
        separate queue of the character, such as the re-ranker's); its outcome returns
        to this layer as ``done(result, error)``. False when the pool is full."""
        key = self._ctx.name if not lane else f"{self._ctx.name}\x00{lane}"
        try:
            self._services.pool.submit(key, job, self.result_sender(done))
        except PoolFull:
            return False
        return True

    def ask_model(
        self,
        task: str,
        messages: Sequence[Mapping[str, object]],
        done: ResultFactory,
        *,
        timeout: float | None = None,
    ) -> int | None:
        """Run LLM ``task`` on the model pool; its outcome returns to this layer as
        ``done(token, output, error)``, a message of the job's own type. Returns the token,
        or None when the task's tier has no endpoint or the pool is full (the caller
        retries later)."""
        llm = self._services.llm
        if llm is None or not llm.available(llm.tier_for(task)):
            return None
        self._model_seq += 1
        job, wrap = model_task(llm, self._model_seq, task, messages, done, timeout)
        return self._model_seq if self.run_job(job, wrap) else None

    # -- the character ---------------------------------------------------------------
    def now(self) -> datetime:
        return self._services.clock.now()

    def now_iso(self) -> str:
        return iso(self._services.clock.now())

    def powerful(self) -> bool:
        """The powerful-memory switch, re-read on every use."""
        switches = self._services.switches
        return switches.powerful_memory() if switches is not None else self.settings.longterm.powerful_memory_default

    def review_enabled(self) -> bool:
        switches = self._services.switches
        return switches.review_enabled() if switches else self.settings.recent.review_enabled

    def names(self) -> dict[str, str]:
        """Names for prompts: the user's and the character's."""
        return {"master_name": self.settings.recent.master_name, "ai_name": self._ctx.name}

    def stop_names(self) -> list[str]:
        """Names removed before keyword matching (they are in every entry)."""
        return [self.settings.recent.master_name, self._ctx.name]


def announce_stored_turns(ports: LayerPorts, turns: list[Turn]) -> None:
    """Tell the reflection actor about stored turns (one ``PostTurn``, with the last reply
    for mention tracking) and the persona actor about that reply."""
    ai = [t.text for t in turns if t.role == "ai"]
    reply = ai[-1] if ai else ""
    ports.send(REFLECTIONS, PostTurn(turns=turns, reply_text=reply))
    if reply:
        ports.send(PERSONA, ReplyMentions(text=reply))
