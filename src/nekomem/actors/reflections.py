"""ReflectionActor: reflections.json, surfaced.json and reflection_archive/.

Reflections are synthesised from facts chosen by FactActor, gain and lose evidence
(feedback, Stage-2 signals, mentions), and are handed to PersonaActor for promotion. The
state and its journal are :class:`~nekomem.actors.reflection_state.ReflectionState`, the
periodic passes :class:`~nekomem.actors.reflection_upkeep.ReflectionUpkeep`; this class
answers the layer's messages. The logic of every pass is in
:mod:`nekomem.domain.reflections`.
"""

from __future__ import annotations

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    AbsorbFacts,
    ApplySignals,
    CorrectionResolved,
    DeleteEntry,
    EditEntry,
    EvidencePass,
    Feedback,
    FollowupTopics,
    GetEntry,
    IndexRemove,
    ListEntries,
    ModelDone,
    NewFacts,
    PostTurn,
    PromotionPass,
    PromotionResult,
    RecallAnswer,
    RecordSurfaced,
    RenderWithPersona,
    ReplyMentions,
    ResetConfirmedAt,
    Synthesize,
)
from nekomem.actors.reflection_upkeep import ReflectionUpkeep
from nekomem.domain import evidence as ev
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain import reflections as rl
from nekomem.domain.records import Reflection
from nekomem.domain.reflections.views import (
    TERMINAL,
    EditError,
    edit_changes,
)
from nekomem.domain.render_longterm import render_longterm
from nekomem.domain.subjects import filter_visible
from nekomem.domain.turns import Turn
from nekomem.runtime.reply import ActorFailure


class ReflectionActor(ReflectionUpkeep):
    child_name = "reflections"
    owner = "reflections"

    # -- synthesis -------------------------------------------------------------------
    @handles(Synthesize)
    def on_Synthesize(self, msg: Synthesize) -> None:
        report = msg.report
        batch = msg.batch
        if batch is None:
            if report is not None:
                report["synthesis"] = {"status": "not_enough_facts"}
                self._promotion_pass(report, msg.reply)
            return
        existing = self.refs.get(batch.reflection_id)
        if existing is not None:
            # A retry of a batch that already produced its reflection (crash between the
            # answer and the absorb): finish the absorb, create nothing.
            self.ctx.send("facts", AbsorbFacts(ids=list(batch.source_fact_ids), reflection_id=existing.id))
            if report is not None:
                report["synthesis"] = {"status": "exists", "reflection_id": existing.id}
                self._promotion_pass(report, msg.reply)
            return
        now = self.now()
        if not rl.synthesis_allowed(self.backoff, batch.backoff_key, now, self.s):
            if report is not None:
                report["synthesis"] = {"status": "backoff"}
                self._promotion_pass(report, msg.reply)
            return
        background = report is None
        if background and self.synth_gate.blocked(self.ctx.clock.monotonic(), batch.backoff_key):
            return  # answered already for these very facts, in backoff, or in flight
        messages = prompts.synthesize_reflection_messages(batch.facts, list(msg.related), now=now, settings=self.s, **self.names())
        token = self.ask_model(
            "synth",
            "synthesize_reflection",
            messages,
            context={"batch": batch, "report": report, "reply": msg.reply},
            timeout=self.s.longterm_synthesis_timeout_seconds,
        )
        if token is None:
            if report is not None:
                report["synthesis"] = {"status": "skipped", "reason": "no summary tier or model pool full"}
                self._promotion_pass(report, msg.reply)
        elif background:
            self.synth_gate.start(batch.backoff_key)

    def done_synth(self, msg: ModelDone) -> None:
        batch = msg.context["batch"]
        report = msg.context["report"]
        now = self.now()
        if report is None:
            mono = self.ctx.clock.monotonic()
            # A null answer is an answer: the same facts are not offered again until they change.
            if msg.error is not None:
                self.synth_gate.failed_at(mono)
            else:
                self.synth_gate.answered_at(mono)
        ref = None
        if msg.error is None:
            ref = rl.build_reflection(msg.output, batch, now, self.s, self.counter.count)
        if ref is None:
            self.backoff = rl.record_synthesis_failure(self.backoff, batch.backoff_key, now)
            self.log.info("reflection synthesis produced nothing (%s)", "error" if msg.error else "null answer")
            if report is not None:
                report["synthesis"] = {"status": "failed" if msg.error else "none"}
        else:
            self.backoff = rl.clear_synthesis_backoff(self.backoff, batch.backoff_key)
            if ref.id not in self.refs:
                self.save([ref], "reflection.synthesized")
                self.log.info("synthesised a reflection from %d facts", len(batch.source_fact_ids))
            self.ctx.send("facts", AbsorbFacts(ids=list(batch.source_fact_ids), reflection_id=ref.id))
            if report is not None:
                report["synthesis"] = {"status": "created", "reflection_id": ref.id, "text": ref.text}
        if report is not None:
            self._promotion_pass(report, msg.context["reply"])

    # -- promotion -------------------------------------------------------------------
    @handles(PromotionPass)
    def on_PromotionPass(self, msg: PromotionPass) -> None:
        self._promotion_pass(msg.report, msg.reply)

    @handles(PromotionResult)
    def on_PromotionResult(self, msg: PromotionResult) -> None:
        ref = msg.reflection
        current = self.refs.get(ref.id)
        if current is None or msgspec.to_builtins(current) == msgspec.to_builtins(ref):
            return
        self.save([ref])

    @handles(CorrectionResolved)
    def on_CorrectionResolved(self, msg: CorrectionResolved) -> None:
        from nekomem.domain import persona as pl

        ref = self.refs.get(msg.reflection_id)
        if ref is not None:
            self.save([pl.reflection_after_correction(ref, msg.kind, self.now())])

    # -- evidence --------------------------------------------------------------------
    @handles(NewFacts)
    def on_NewFacts(self, msg: NewFacts) -> None:
        """Stage 2 starts with a vector coarse rank of the candidate reflections against
        the new facts (RecallActor; evidence order without vectors)."""
        from nekomem.actors.messages import RankForStage2

        if not self.s.evidence_signal_check_enabled or not self.powerful():
            return
        now = self.now()
        candidates = [o.id for o in ev.observation_pool(self.refs.values(), {}, now, self.s)]
        if not candidates:
            self.ctx.send("persona", EvidencePass(facts=msg.facts, reflection_observations=[]))
            return
        self._stage2_seq = getattr(self, "_stage2_seq", 0) + 1
        tag = f"stage2-{self._stage2_seq}"
        self._stage2_pending[tag] = msg.facts
        self.ctx.send(
            "recall",
            RankForStage2(
                query_texts=[f.text for f in msg.facts],
                candidate_ids=candidates,
                budget=self.s.evidence_map_max_observations,
                reply_child="reflections",
                tag=tag,
            ),
        )

    @handles(RecallAnswer)
    def on_RecallAnswer(self, msg: RecallAnswer) -> None:
        facts = self._stage2_pending.pop(msg.tag, None)
        if facts is None:
            return
        observations = ev.observation_pool(self.refs.values(), {}, self.now(), self.s, ranked_ids=list(msg.ids))
        self.ctx.send("persona", EvidencePass(facts=facts, reflection_observations=observations))

    @handles(ApplySignals)
    def on_ApplySignals(self, msg: ApplySignals) -> None:
        updated, changed = rl.apply_resolved_signals(list(self.refs.values()), msg.signals, self.now(), self.s, source=msg.source)
        self.save_changed(updated, changed, "reflection.evidence_updated")

    @handles(Feedback)
    def on_Feedback(self, msg: Feedback) -> None:
        ref = self.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        if ref.status in TERMINAL or ref.status == "promoted":
            raise ActorFailure("conflict", f"reflection {msg.id} is {ref.status}; feedback no longer applies", 409)
        # A confirmation may make it promotable; the next promotion pass promotes it.
        updated = rl.user_feedback(ref, msg.feedback, self.now(), self.s)
        self.save([updated], "reflection.evidence_updated")
        msg.reply.ok(self.public(updated))

    @handles(PostTurn)
    def on_PostTurn(self, msg: PostTurn) -> None:
        self._check_turn(msg.turns)
        if msg.reply_text:
            self._record_mentions(msg.reply_text)

    def _check_turn(self, turns: list[Turn]) -> None:
        """Ask the model whether the user's messages answer a surfaced reflection or
        dispute one (each only when its tier is configured)."""
        user = [t for t in turns if t.role == "human"]
        if not user:
            return
        awaiting = rl.awaiting_feedback(self.surfaced)
        if awaiting and self.model_available("check_feedback"):
            items = [(e.reflection_id, e.text) for e in awaiting if e.reflection_id in self.refs]
            if items:
                messages = prompts.check_feedback_messages(items, user, context=turns, **self.names())
                self.ask_model(
                    "feedback",
                    "check_feedback",
                    messages,
                    context={"ids": [i for i, _ in items]},
                    timeout=self.s.longterm_feedback_timeout_seconds,
                )
        # Cheapest test first: powerful() may stat core_config.json, the keyword scan
        # lowercases every user message.
        if self.model_available("check_disputation") and self.powerful() and rl.contains_negative_keyword([t.text for t in user], self.s):
            observations = ev.observation_pool(self.refs.values(), {}, self.now(), self.s)
            if observations:
                messages = prompts.check_disputation_messages(
                    user, observations, count_tokens=self.counter.count, settings=self.s, **self.names()
                )
                self.ask_model(
                    "disputation",
                    "check_disputation",
                    messages,
                    context={"observations": observations},
                    timeout=self.s.longterm_disputation_timeout_seconds,
                )

    def done_feedback(self, msg: ModelDone) -> None:
        if msg.error is not None:
            self.log.info("check_feedback failed")
            return
        now = self.now()
        changed: list[Reflection] = []
        # Calls overlap (one per user turn): the same answer about an entry counts once.
        recorded = {e.reflection_id: e.feedback for e in self.surfaced}
        for rid, fb in rl.interpret_feedback(msg.output, msg.context["ids"]):
            ref = self.refs.get(rid)
            if ref is None or ref.status in TERMINAL or recorded.get(rid) == fb:
                continue
            recorded[rid] = fb
            changed.append(rl.apply_feedback(ref, fb, now, self.s))
            self.surfaced = rl.record_feedback(self.surfaced, rid, fb, now)
        if changed:
            self.record_many(
                [("reflection.evidence_updated", {"reflection": msgspec.to_builtins(r)}) for r in changed]
                + [("reflection.surfaced", {"surfaced": msgspec.to_builtins(self.surfaced)})]
            )
            self.index_upsert([self.index_entry(self.refs[r.id]) for r in changed if r.id in self.refs])

    def done_disputation(self, msg: ModelDone) -> None:
        if msg.error is not None:
            return
        signals = ev.resolve_disputed(msg.output, msg.context["observations"])
        ids = [s.target_id for s in signals if s.target_kind == "reflection"]
        updated, changed = rl.apply_disputed(list(self.refs.values()), ids, self.now(), self.s)
        self.save_changed(updated, changed, "reflection.rebutted")

    @handles(ReplyMentions)
    def on_ReplyMentions(self, msg: ReplyMentions) -> None:
        self._record_mentions(msg.text)

    def _record_mentions(self, text: str) -> None:
        updated, changed = rl.record_reply_mentions(list(self.refs.values()), text, self.now(), self.s, self.stop_names())
        self.save_changed(updated, changed, "reflection.evidence_updated")

    # -- surfacing -------------------------------------------------------------------
    @handles(FollowupTopics)
    def on_FollowupTopics(self, msg: FollowupTopics) -> None:
        picks = rl.followup_candidates(filter_visible(self.refs.values(), None), self.now(), self.s, self.rng)
        msg.reply.ok({"topics": [{"id": r.id, "text": r.text, "entity": r.entity} for r in picks]})

    @handles(RecordSurfaced)
    def on_RecordSurfaced(self, msg: RecordSurfaced) -> None:
        known = [i for i in msg.ids if i in self.refs]
        refs, surfaced = rl.record_surfaced(list(self.refs.values()), self.surfaced, known, self.now(), self.s)
        by_id = {r.id: r for r in refs}
        self.record_many(
            [("reflection.surfaced", {"surfaced": msgspec.to_builtins(surfaced)})]
            + [("reflection.evidence_updated", {"reflection": msgspec.to_builtins(by_id[i])}) for i in known if i in by_id]
        )
        self.index_upsert([self.index_entry(self.refs[i]) for i in known if i in self.refs])
        msg.reply.ok({"ok": True, "recorded": len(known)})

    # -- rendering -------------------------------------------------------------------
    @handles(RenderWithPersona)
    def on_RenderWithPersona(self, msg: RenderWithPersona) -> None:
        names = {**self.names(), **({"master_name": msg.master_name} if msg.master_name else {})}
        text = render_longterm(
            msg.persona,
            filter_visible(self.refs.values(), msg.subjects),
            now=self.now(),
            settings=self.s,
            count_tokens=self.counter.count,
            language=msg.language,
            **names,
        )
        msg.reply.ok(text)

    @handles(ResetConfirmedAt)
    def on_ResetConfirmedAt(self, msg: ResetConfirmedAt) -> None:
        before = {r.id: r for r in self.refs.values()}
        updated, count = rl.reset_confirmed_at(list(self.refs.values()), self.now())
        changed = [r for r in updated if msgspec.to_builtins(r) != msgspec.to_builtins(before[r.id])]
        self.save(changed)
        msg.reply.ok(count)

    # -- API -------------------------------------------------------------------------
    @handles(ListEntries)
    def on_ListEntries(self, msg: ListEntries) -> None:
        pool = list(self.refs.values())
        if msg.status:
            pool = [r for r in pool if r.status == msg.status]
        if msg.entity:
            pool = [r for r in pool if r.entity == msg.entity]
        page = pool[msg.offset : msg.offset + msg.limit]
        msg.reply.ok({"total": len(pool), "offset": msg.offset, "items": [self.public(r) for r in page]})

    @handles(GetEntry)
    def on_GetEntry(self, msg: GetEntry) -> None:
        ref = self.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        msg.reply.ok(self.public(ref))

    @handles(EditEntry)
    def on_EditEntry(self, msg: EditEntry) -> None:
        ref = self.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        try:
            changes = edit_changes(msg.changes)
        except EditError as exc:
            raise ActorFailure(exc.code, str(exc), 422) from None
        updated = msgspec.structs.replace(ref, **changes)
        self.save([updated], "reflection.updated")
        msg.reply.ok(self.public(updated))

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        if msg.id not in self.refs:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        text = self.refs[msg.id].text
        self.record("reflection.deleted", {"id": msg.id})
        # Its surfacing records carry its text: they go with it (written by erase's flush).
        self.surfaced = [e for e in self.surfaced if e.reflection_id != msg.id]
        self.ctx.send("recall", IndexRemove(ids=[msg.id]))
        self.erase([msg.id], [text], self.ctx.paths.reflection_archive_dir, msg.reply, {"deleted": msg.id})
