"""The reflections layer: the object ReflectionActor owns (reflections.json, surfaced.json
and reflection_archive/).

Reflections are synthesised from facts chosen by FactActor, gain and lose evidence
(feedback, Stage-2 signals, mentions), and are handed to PersonaActor for promotion. The
layer answers the messages; its parts each own one concern: the state and its journal
(:class:`~nekomem.layers.reflections.state.ReflectionState`), synthesis
(:class:`~nekomem.layers.reflections.synthesis.ReflectionSynthesis`), evidence
(:class:`~nekomem.layers.reflections.evidence.ReflectionEvidence`) and the periodic passes
(:class:`~nekomem.layers.reflections.upkeep.ReflectionUpkeep`). The logic of every pass is
in :mod:`nekomem.domain.reflections`.
"""

from __future__ import annotations

import collections

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    ApplySignals,
    CorrectionResolved,
    CountEntries,
    DeleteEntry,
    EditEntry,
    EntryAnswer,
    EntryCounts,
    Feedback,
    FollowupTopics,
    GetEntry,
    IndexRemove,
    ListEntries,
    NewFacts,
    PostTurn,
    PromotionPass,
    PromotionResult,
    RankedIds,
    RecordSurfaced,
    RefineDone,
    RenderWithPersona,
    ReplyMentions,
    RequestIndex,
    ResetConfirmedAt,
    Synthesize,
    Tick,
    VectorsComputed,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain import persona as pl
from nekomem.domain import reflections as rl
from nekomem.domain.layers import RECALL
from nekomem.domain.reflections.views import TERMINAL, EditError, edit_changes
from nekomem.domain.render_longterm import render_longterm
from nekomem.domain.subjects import filter_visible
from nekomem.layers.reflections.declaration import STATUSES
from nekomem.layers.reflections.evidence import DisputationDone, FeedbackDone, ReflectionEvidence
from nekomem.layers.reflections.state import ReflectionState
from nekomem.layers.reflections.synthesis import ReflectionSynthesis, SynthDone
from nekomem.layers.reflections.upkeep import RebuttalDone, ReflectionUpkeep
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.view_counts import archived_items
from nekomem.wire.answers import DeleteAnswer, PageAnswer, SurfacedAnswer, Topic, TopicsAnswer


class ReflectionLayer:
    """The reflections layer (see the module)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.state = ReflectionState(ports)
        self.synthesis = ReflectionSynthesis(ports, self.state)
        self.evidence = ReflectionEvidence(ports, self.state)
        self.upkeep = ReflectionUpkeep(ports, self.state)

    # -- lifecycle (the Layer protocol) ----------------------------------------------
    def load(self) -> None:
        """Read the views and replay the journal after them, then send recall the complete
        index. Every pass starts again from its initial delay. Raises OSError."""
        self.synthesis.reset()
        self.evidence.reset()
        self.upkeep.reset()
        self.state.views.load()
        self.state.send_index()

    def flush(self) -> None:
        self.state.views.flush()

    def close(self) -> None:
        pass  # no file or connection stays open between messages

    def due_at(self) -> float | None:
        return self.upkeep.due_at()

    def real_due_at(self) -> float | None:
        return self.state.views.real_due_at()

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self.state.views.maybe_flush()
        self.upkeep.tick(msg.monotonic)

    @handles(RequestIndex)
    def on_RequestIndex(self, msg: RequestIndex) -> None:
        """A restarted RecallActor lost its index: send the complete set again."""
        self.state.send_index()

    @handles(VectorsComputed)
    def on_VectorsComputed(self, msg: VectorsComputed) -> None:
        self.state.vectors_computed(msg)

    # -- model results ---------------------------------------------------------------
    @handles(SynthDone)
    def on_SynthDone(self, msg: SynthDone) -> None:
        self.synthesis.synth_done(msg)

    @handles(FeedbackDone)
    def on_FeedbackDone(self, msg: FeedbackDone) -> None:
        self.evidence.feedback_done(msg)

    @handles(DisputationDone)
    def on_DisputationDone(self, msg: DisputationDone) -> None:
        self.evidence.disputation_done(msg)

    @handles(RebuttalDone)
    def on_RebuttalDone(self, msg: RebuttalDone) -> None:
        self.upkeep.rebuttal_done(msg)

    @handles(RefineDone)
    def on_RefineDone(self, msg: RefineDone) -> None:
        self.upkeep.refine_done(msg)

    # -- synthesis and promotion -----------------------------------------------------
    @handles(Synthesize)
    def on_Synthesize(self, msg: Synthesize) -> None:
        self.synthesis.synthesize(msg)

    @handles(PromotionPass)
    def on_PromotionPass(self, msg: PromotionPass) -> None:
        self.state.promotion_pass(msg.report, msg.reply)

    @handles(PromotionResult)
    def on_PromotionResult(self, msg: PromotionResult) -> None:
        ref = msg.reflection
        current = self.state.refs.get(ref.id)
        if current is None or msgspec.to_builtins(current) == msgspec.to_builtins(ref):
            return
        self.state.save([ref])

    @handles(CorrectionResolved)
    def on_CorrectionResolved(self, msg: CorrectionResolved) -> None:
        ref = self.state.refs.get(msg.reflection_id)
        if ref is not None:
            self.state.save([pl.reflection_after_correction(ref, msg.kind, self.ports.now())])

    # -- evidence --------------------------------------------------------------------
    @handles(NewFacts)
    def on_NewFacts(self, msg: NewFacts) -> None:
        self.evidence.new_facts(msg.facts)

    @handles(RankedIds)
    def on_RecallAnswer(self, msg: RankedIds) -> None:
        self.evidence.ranked(msg)

    @handles(ApplySignals)
    def on_ApplySignals(self, msg: ApplySignals) -> None:
        self.evidence.apply_signals(msg.signals, msg.source)

    @handles(PostTurn)
    def on_PostTurn(self, msg: PostTurn) -> None:
        self.evidence.check_turn(msg.turns)
        if msg.reply_text:
            self.evidence.record_mentions(msg.reply_text)

    @handles(ReplyMentions)
    def on_ReplyMentions(self, msg: ReplyMentions) -> None:
        self.evidence.record_mentions(msg.text)

    @handles(Feedback)
    def on_Feedback(self, msg: Feedback) -> None:
        state = self.state
        ref = state.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        if ref.status in TERMINAL or ref.status == "promoted":
            raise ActorFailure("conflict", f"reflection {msg.id} is {ref.status}; feedback no longer applies", 409)
        # A confirmation may make it promotable; the next promotion pass promotes it.
        updated = rl.user_feedback(ref, msg.feedback, self.ports.now(), state.s)
        state.save([updated], "reflection.evidence_updated")
        if msg.reply is not None:
            msg.reply.ok(EntryAnswer(entry=state.public(updated)))

    # -- surfacing -------------------------------------------------------------------
    @handles(FollowupTopics)
    def on_FollowupTopics(self, msg: FollowupTopics) -> None:
        state = self.state
        picks = rl.followup_candidates(filter_visible(state.refs.values(), None), self.ports.now(), state.s, state.rng)
        if msg.reply is not None:
            msg.reply.ok(TopicsAnswer(topics=[Topic(id=r.id, text=r.text, entity=r.entity) for r in picks]))

    @handles(RecordSurfaced)
    def on_RecordSurfaced(self, msg: RecordSurfaced) -> None:
        state = self.state
        known = [i for i in msg.ids if i in state.refs]
        refs, surfaced = rl.record_surfaced(list(state.refs.values()), state.surfaced, known, self.ports.now(), state.s)
        by_id = {r.id: r for r in refs}
        state.views.record_many(
            [("reflection.surfaced", {"surfaced": msgspec.to_builtins(surfaced)})]
            + [("reflection.evidence_updated", {"reflection": msgspec.to_builtins(by_id[i])}) for i in known if i in by_id]
        )
        self.ports.index_upsert([state.index_entry(state.refs[i]) for i in known if i in state.refs])
        if msg.reply is not None:
            msg.reply.ok(SurfacedAnswer(ok=True, recorded=len(known)))

    # -- rendering -------------------------------------------------------------------
    @handles(RenderWithPersona)
    def on_RenderWithPersona(self, msg: RenderWithPersona) -> None:
        state = self.state
        names = {**self.ports.names(), **({"master_name": msg.master_name} if msg.master_name else {})}
        text = render_longterm(
            msg.persona,
            filter_visible(state.refs.values(), msg.subjects),
            now=self.ports.now(),
            settings=state.s,
            count_tokens=state.counter.count,
            language=msg.language,
            **names,
        )
        if msg.reply is not None:
            msg.reply.ok(text)

    @handles(ResetConfirmedAt)
    def on_ResetConfirmedAt(self, msg: ResetConfirmedAt) -> None:
        state = self.state
        before = {r.id: r for r in state.refs.values()}
        updated, count = rl.reset_confirmed_at(list(state.refs.values()), self.ports.now())
        changed = [r for r in updated if msgspec.to_builtins(r) != msgspec.to_builtins(before[r.id])]
        state.save(changed)
        if msg.reply is not None:
            msg.reply.ok(count)

    # -- API -------------------------------------------------------------------------
    @handles(ListEntries)
    def on_ListEntries(self, msg: ListEntries) -> None:
        state = self.state
        pool = list(state.refs.values())
        if msg.status:
            pool = [r for r in pool if r.status == msg.status]
        if msg.entity:
            pool = [r for r in pool if r.entity == msg.entity]
        page = pool[msg.offset : msg.offset + msg.limit]
        if msg.reply is not None:
            msg.reply.ok(PageAnswer(total=len(pool), offset=msg.offset, items=[state.public(r) for r in page]))

    @handles(CountEntries)
    def on_CountEntries(self, msg: CountEntries) -> None:
        statuses = collections.Counter[str](r.status for r in self.state.refs.values())
        counts = {s: statuses[s] for s in STATUSES}
        counts["archived"] = len(archived_items(self.ports.paths.reflection_archive_dir))  # the shards on disk
        if msg.reply is not None:
            msg.reply.ok(EntryCounts({"reflections": counts}))

    @handles(GetEntry)
    def on_GetEntry(self, msg: GetEntry) -> None:
        ref = self.state.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        if msg.reply is not None:
            msg.reply.ok(EntryAnswer(entry=self.state.public(ref)))

    @handles(EditEntry)
    def on_EditEntry(self, msg: EditEntry) -> None:
        ref = self.state.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        try:
            changes = edit_changes(msg.changes)
        except EditError as exc:
            raise ActorFailure(exc.code, str(exc), 422) from None
        updated = msgspec.structs.replace(ref, **changes)
        self.state.save([updated], "reflection.updated")
        if msg.reply is not None:
            msg.reply.ok(EntryAnswer(entry=self.state.public(updated)))

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        state = self.state
        if msg.id not in state.refs:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        text = state.refs[msg.id].text
        state.views.record("reflection.deleted", {"id": msg.id})
        # Its surfacing records carry its text: they go with it (written by erase's flush).
        state.surfaced = [e for e in state.surfaced if e.reflection_id != msg.id]
        self.ports.send(RECALL, IndexRemove(ids=[msg.id]))
        state.views.erase([msg.id], [text], self.ports.paths.reflection_archive_dir, msg.reply, DeleteAnswer(deleted=msg.id))
