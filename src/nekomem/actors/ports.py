"""What a layer object may do outside itself: the ports its actor gives it.

A layer (the plain object an actor owns: its state and logic) never touches pykka. It
reaches the rest of its character through one :class:`LayerPorts`: send a message to a
sibling, post itself a message later, feed the recall index, run a model job whose
outcome comes back as a typed message, and read the character's clock and names. The
actor builds the ports with a function that posts to its own mailbox; a test builds them
with any callable and drives the layer by calling its handlers directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from nekomem.actors.messages import IndexUpsert, PostTurn, ReplyMentions
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import PERSONA, RECALL, REFLECTIONS, Address
from nekomem.domain.turns import Turn
from nekomem.recall.pending import lacking_vectors
from nekomem.runtime.clock import iso
from nekomem.runtime.pool import PoolFull
from nekomem.runtime.protocol import Message
from nekomem.runtime.services import CharacterContext
from nekomem.runtime.timers import TimerHandle

# (token, output, error) -> the typed message that brings a model job's outcome home.
ResultFactory = Callable[[int, object, str | None], Message]


class LayerPorts:
    """The ports of one child layer of one character.

    ``tell_self`` posts a message to the owning actor's mailbox (it must not raise when the
    actor is gone: a late timer or model result is then simply dropped).
    """

    def __init__(self, ctx: CharacterContext, child: str, tell_self: Callable[[object], None]) -> None:
        self.ctx = ctx
        self.child = child
        self.log = logging.getLogger(f"nekomem.actors.{child}")
        self._tell_self = tell_self
        self._timers: set[TimerHandle] = set()
        self._model_seq = 0

    # -- messages --------------------------------------------------------------------
    def send(self, child: Address, message: object) -> None:
        """Deliver ``message`` to sibling ``child`` (never blocks; see CharacterContext.send)."""
        self.ctx.send(child, message)

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

        handle = self.ctx.services.timers.call_later(delay, fire, real=real)
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

    # -- recall feed -----------------------------------------------------------------
    def index_upsert(self, entries: list[IndexEntry], replace_tier: str | None = None, views: list[list[int] | None] | None = None) -> None:
        """Send ``entries`` to RecallActor. Those still lacking a vector count as pending
        embeddings from now on (so /health never reports 0 between a write's
        acknowledgement and RecallActor reading it; see :mod:`nekomem.recall.pending`)."""
        emb = self.ctx.services.embeddings
        counted = 0
        if emb is not None and emb.state != "disabled" and self.ctx.settings.recall.recall_legs != "bm25":
            try:
                model: str | None = emb.model_id
            except Exception:  # noqa: BLE001 - a broken embedding component must not break the owner
                model = None
            counted = lacking_vectors(entries, model)
            self.ctx.services.pending.sent(self.ctx.name, counted)
        self.send(RECALL, IndexUpsert(entries=entries, replace_tier=replace_tier, counted=counted, views=views))

    def announce_stored_turns(self, turns: list[Turn]) -> None:
        """Tell the reflection actor about stored turns (one ``PostTurn``, with the last
        reply for mention tracking) and the persona actor about that reply."""
        ai = [t.text for t in turns if t.role == "ai"]
        reply = ai[-1] if ai else ""
        self.send(REFLECTIONS, PostTurn(turns=turns, reply_text=reply))
        if reply:
            self.send(PERSONA, ReplyMentions(text=reply))

    # -- model calls -----------------------------------------------------------------
    def model_available(self, task: str) -> bool:
        llm = self.ctx.services.llm
        return llm is not None and llm.available(llm.tier_for(task))

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
        llm = self.ctx.services.llm
        if llm is None or not llm.available(llm.tier_for(task)):
            return None
        self._model_seq += 1
        token = self._model_seq
        prompt = [dict(message) for message in messages]

        def job() -> object:
            return llm.run(task, prompt, timeout=timeout)

        def wrap(result: object, error: BaseException | None) -> object:
            return done(token, result, None if error is None else repr(error))

        try:
            self.ctx.submit_model_job(self.child, job, wrap)
        except PoolFull:
            return None
        return token

    # -- the character ---------------------------------------------------------------
    def now(self) -> datetime:
        return self.ctx.clock.now()

    def now_iso(self) -> str:
        return iso(self.ctx.clock.now())

    def powerful(self) -> bool:
        """The powerful-memory switch, re-read on every use."""
        switches = self.ctx.services.switches
        return switches.powerful_memory() if switches is not None else self.ctx.settings.longterm.powerful_memory_default

    def names(self) -> dict[str, str]:
        """Names for prompts: the user's and the character's."""
        return {"master_name": self.ctx.settings.recent.master_name, "ai_name": self.ctx.name}

    def stop_names(self) -> list[str]:
        """Names removed before keyword matching (they are in every entry)."""
        return [self.ctx.settings.recent.master_name, self.ctx.name]
