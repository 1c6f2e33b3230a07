"""ReflectionActor: reflections.json, surfaced.json and reflection_archive/.

Reflections are synthesised from facts chosen by FactActor, gain and lose evidence
(feedback, Stage-2 signals, mentions), and are handed to PersonaActor for promotion.
Every transition is a journaled event carrying the reflection's full snapshot, so applying
it twice leaves the same state.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import msgspec

from nekomem.actors.journaled import JournaledActor
from nekomem.actors.messages import (
    AbsorbFacts,
    ApplySignals,
    CorrectionResolved,
    DeleteEntry,
    EditEntry,
    EvidencePass,
    Feedback,
    FollowupTopics,
    IndexEntry,
    IndexRemove,
    IndexUpsert,
    ListEntries,
    ModelDone,
    NewFacts,
    PostTurn,
    Promote,
    PromotionPass,
    PromotionResult,
    RecordSurfaced,
    RenderWithPersona,
    ReplyMentions,
    ResetConfirmedAt,
    Synthesize,
    Tick,
)
from nekomem.domain import evidence as ev
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain import refine as rf
from nekomem.domain import reflections as rl
from nekomem.domain.records import Reflection, SurfacedEntry, assign_shards
from nekomem.domain.render_longterm import render_longterm
from nekomem.domain.subjects import filter_visible
from nekomem.domain.tokens import get_counter
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.cursors import Cursors
from nekomem.stores.journal import Event

TERMINAL = ("denied", "archived", "merged", "promote_blocked")


def ref_from(obj: Any) -> Reflection:
    return msgspec.convert(obj, Reflection, strict=False)


class ReflectionActor(JournaledActor):
    child_name = "reflections"
    owner = "reflections"

    def load_views(self) -> None:
        self.s = self.ctx.settings.longterm
        self.counter = get_counter(self.ctx.settings.recent.recent_tokenizer_encoding)
        self.refs: dict[str, Reflection] = {}
        raw, _ = read_json(self.ctx.paths.reflections, default=[])
        for item in raw if isinstance(raw, list) else []:
            try:
                ref = ref_from(item)
            except msgspec.ValidationError:
                self.log.warning("skipped an unreadable reflection record")
                continue
            self.refs[ref.id] = ref
        raw, _ = read_json(self.ctx.paths.surfaced, default=[])
        self.surfaced: list[SurfacedEntry] = []
        for item in raw if isinstance(raw, list) else []:
            try:
                self.surfaced.append(msgspec.convert(item, SurfacedEntry, strict=False))
            except msgspec.ValidationError:
                continue
        self.archived_pending: dict[str, list[Reflection]] = {}  # shard -> entries not yet written
        self.backoff: dict[str, Any] = {}
        self._stage2_pending: dict[str, list[Any]] = {}
        self.rng = random.Random()
        mono = self.ctx.clock.monotonic()
        self.next_promote = mono + self.s.reflection_auto_promote_initial_delay_seconds
        self.next_sweep = mono + self.s.evidence_archive_sweep_initial_delay_seconds
        self.next_rebuttal = mono + self.s.reflection_rebuttal_initial_delay_seconds
        self.rebuttal_inflight = False
        self.rebuttal_failures = 0
        self.cursors = Cursors(self.ctx.paths.cursors)

    def after_load(self) -> None:
        self.send_index()

    def on_RequestIndex(self, msg: Any) -> None:
        """A restarted RecallActor lost its index: send the complete set again."""
        self.send_index()

    def send_index(self) -> None:
        entries = [self.index_entry(r) for r in self.refs.values()]
        self._searchable = {e.id: e.searchable for e in entries}
        self.ctx.send("recall", IndexUpsert(entries=entries, replace_tier="reflection"))

    def send_decayed(self) -> None:
        """Upsert only the reflections whose searchable verdict changed since it was last
        sent (decay can push a score below zero without any event)."""
        changed = []
        for ref in self.refs.values():
            entry = self.index_entry(ref)
            if self._searchable.get(ref.id) != entry.searchable:
                changed.append(entry)
                self._searchable[ref.id] = entry.searchable
        if changed:
            self.ctx.send("recall", IndexUpsert(entries=changed))

    def write_views(self) -> None:
        atomic_write_json(self.ctx.paths.reflections, list(self.refs.values()))
        atomic_write_json(self.ctx.paths.surfaced, self.surfaced)
        for shard, entries in self.archived_pending.items():
            path = self.ctx.paths.reflection_archive_dir / shard
            existing, _ = read_json(path, default=[])
            existing = existing if isinstance(existing, list) else []
            known = {e.get("id") for e in existing if isinstance(e, dict)}
            existing.extend(msgspec.to_builtins(e) for e in entries if e.id not in known)
            atomic_write_json(path, existing)
        self.archived_pending.clear()

    def apply_event(self, event: Event) -> None:
        p = event.payload
        if "reflection" in p:
            ref = ref_from(p["reflection"])
            if event.type == "reflection.synthesized" and ref.id in self.refs:
                return
            if ref.status == "archived" and p.get("archive_shard"):
                self.refs.pop(ref.id, None)
                self.archived_pending.setdefault(p["archive_shard"], []).append(ref)
            else:
                self.refs[ref.id] = ref
        if "surfaced" in p:
            self.surfaced = [msgspec.convert(x, SurfacedEntry, strict=False) for x in p["surfaced"]]
        if event.type == "reflection.deleted":
            self.refs.pop(p.get("id"), None)

    # -- helpers ---------------------------------------------------------------------
    def index_entry(self, ref: Reflection) -> IndexEntry:
        now = self.now()
        score = ev.net_score(ref, now, self.s)
        searchable = ref.status not in TERMINAL and not ref.suppress and score >= 0 and bool(ref.text.strip())
        return IndexEntry(
            id=ref.id,
            tier="reflection",
            text=ref.text,
            entity=ref.entity,
            created_at=ref.created_at or None,
            event_start_at=ref.event_start_at,
            event_end_at=ref.event_end_at,
            score=score,
            searchable=searchable,
            vector=ref.embedding if isinstance(ref.embedding, str) else None,
            vector_model=ref.embedding_model_id,
            text_sha256=ref.embedding_text_sha256,
            subject_kind=ref.subject_kind,
            subject_id=ref.subject_id,
            scope=ref.scope,
        )

    def on_VectorsComputed(self, msg: Any) -> None:
        # Vectors are a cache: kept on the entries at the next view write, not journaled.
        import hashlib

        for rid, (vector, model, sha) in msg.vectors.items():
            ref = self.refs.get(rid)
            if ref is not None and hashlib.sha256(ref.text.encode()).hexdigest() == sha:
                self.refs[rid] = msgspec.structs.replace(ref, embedding=vector, embedding_model_id=model, embedding_text_sha256=sha)
        if msg.vectors:
            self._dirty = max(self._dirty, 1)

    def save(self, refs: list[Reflection], type: str = "reflection.state_changed") -> None:
        if not refs:
            return
        self.record_many((type, {"reflection": msgspec.to_builtins(r)}) for r in refs)
        entries = [self.index_entry(self.refs[r.id]) for r in refs if r.id in self.refs]
        self._searchable.update((e.id, e.searchable) for e in entries)
        self.ctx.send("recall", IndexUpsert(entries=entries))

    def save_changed(self, new_list: list[Reflection], changed_ids: list[str], type: str = "reflection.state_changed") -> None:
        by_id = {r.id: r for r in new_list}
        self.save([by_id[i] for i in changed_ids if i in by_id], type)

    # -- synthesis -------------------------------------------------------------------
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
        messages = prompts.synthesize_reflection_messages(batch.facts, list(msg.related), now=now, settings=self.s, **self.names())
        token = self.ask_model(
            "synth", "synthesize_reflection", messages, context={"batch": batch, "report": report, "reply": msg.reply},
            timeout=self.s.longterm_synthesis_timeout_seconds,
        )
        if token is None:
            if report is not None:
                report["synthesis"] = {"status": "skipped", "reason": "no summary tier or model pool full"}
                self._promotion_pass(report, msg.reply)

    def done_synth(self, msg: ModelDone) -> None:
        batch = msg.context["batch"]
        report = msg.context["report"]
        now = self.now()
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
    def on_PromotionPass(self, msg: PromotionPass) -> None:
        self._promotion_pass(msg.report, msg.reply)

    def _promotion_pass(self, report: dict[str, Any] | None, reply: Any) -> None:
        now = self.now()
        refs = list(self.refs.values())
        if self.powerful():
            updated, confirmed = rl.evidence_confirmations(refs, now, self.s)
            self.save_changed(updated, confirmed)
            candidates = rl.promotable(list(self.refs.values()), now, self.s)
        else:
            updated, confirmed = rl.time_driven_confirmations(refs, now, self.s)
            self.save_changed(updated, confirmed)
            candidates = rl.time_driven_promotable(list(self.refs.values()), now, self.s)
        if report is not None:
            report["confirmed"] = confirmed
        if candidates:
            self.ctx.send("persona", Promote(candidates=candidates, report=report, reply=reply))
        elif report is not None:
            report.setdefault("promotion", [])
            reply.ok(report)

    def on_PromotionResult(self, msg: PromotionResult) -> None:
        ref = msg.reflection
        current = self.refs.get(ref.id)
        if current is None or msgspec.to_builtins(current) == msgspec.to_builtins(ref):
            return
        self.save([ref])

    def on_CorrectionResolved(self, msg: CorrectionResolved) -> None:
        from nekomem.domain import persona as pl

        ref = self.refs.get(msg.reflection_id)
        if ref is not None:
            self.save([pl.reflection_after_correction(ref, msg.kind, self.now())])

    # -- evidence --------------------------------------------------------------------
    def on_NewFacts(self, msg: NewFacts) -> None:
        """Stage 2 starts with a vector coarse rank of the candidate reflections against
        the new facts (RecallActor; evidence order without vectors)."""
        from nekomem.actors.recall import RankForStage2

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

    def on_RecallAnswer(self, msg: Any) -> None:
        facts = self._stage2_pending.pop(msg.tag, None)
        if facts is None:
            return
        observations = ev.observation_pool(self.refs.values(), {}, self.now(), self.s, ranked_ids=list(msg.ids))
        self.ctx.send("persona", EvidencePass(facts=facts, reflection_observations=observations))

    def on_ApplySignals(self, msg: ApplySignals) -> None:
        updated, changed = rl.apply_resolved_signals(list(self.refs.values()), msg.signals, self.now(), self.s, source=msg.source)
        self.save_changed(updated, changed, "reflection.evidence_updated")

    def on_Feedback(self, msg: Feedback) -> None:
        ref = self.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        if ref.status in TERMINAL or ref.status == "promoted":
            raise ActorFailure("conflict", f"reflection {msg.id} is {ref.status}; feedback no longer applies", 409)
        now = self.now()
        apply = {"confirmed": rl.confirm_by_user, "denied": rl.deny_by_user, "ignored": rl.ignore_by_user}[msg.feedback]
        updated = apply(ref, now, self.s)
        self.save([updated], "reflection.evidence_updated")
        if msg.feedback == "confirmed" and self.powerful():
            # A confirmation may make it promotable; the next pass promotes it.
            pass
        msg.reply.ok(self.public(updated))

    def public(self, ref: Reflection) -> dict[str, Any]:
        data = msgspec.to_builtins(msgspec.structs.replace(ref, embedding=None))
        data["evidence_score"] = ev.net_score(ref, self.now(), self.s)
        return data

    def on_PostTurn(self, msg: PostTurn) -> None:
        user = [t for t in msg.turns if t.role == "human"]
        if not user:
            return
        awaiting = rl.awaiting_feedback(self.surfaced)
        if awaiting and self.model_available("check_feedback"):
            items = [(e.reflection_id, e.text) for e in awaiting if e.reflection_id in self.refs]
            if items:
                messages = prompts.check_feedback_messages(items, user, context=msg.turns, **self.names())
                self.ask_model("feedback", "check_feedback", messages, context={"ids": [i for i, _ in items]},
                               timeout=self.s.longterm_feedback_timeout_seconds)
        if self.powerful() and rl.contains_negative_keyword([t.text for t in user], self.s) and self.model_available("check_disputation"):
            observations = ev.observation_pool(self.refs.values(), {}, self.now(), self.s)
            if observations:
                messages = prompts.check_disputation_messages(user, observations, count_tokens=self.counter.count, settings=self.s, **self.names())
                self.ask_model("disputation", "check_disputation", messages, context={"observations": observations},
                               timeout=self.s.longterm_disputation_timeout_seconds)

    def done_feedback(self, msg: ModelDone) -> None:
        if msg.error is not None:
            self.log.info("check_feedback failed")
            return
        now = self.now()
        changed: list[Reflection] = []
        for rid, fb in rl.interpret_feedback(msg.output, msg.context["ids"]):
            ref = self.refs.get(rid)
            if ref is None or ref.status in TERMINAL:
                continue
            changed.append(rl.apply_feedback(ref, fb, now, self.s))
            self.surfaced = rl.record_feedback(self.surfaced, rid, fb, now)
        if changed:
            self.record_many(
                [("reflection.evidence_updated", {"reflection": msgspec.to_builtins(r)}) for r in changed]
                + [("reflection.surfaced", {"surfaced": msgspec.to_builtins(self.surfaced)})]
            )
            self.ctx.send("recall", IndexUpsert(entries=[self.index_entry(self.refs[r.id]) for r in changed if r.id in self.refs]))

    def done_disputation(self, msg: ModelDone) -> None:
        if msg.error is not None:
            return
        signals = ev.resolve_disputed(msg.output, msg.context["observations"])
        ids = [s.target_id for s in signals if s.target_kind == "reflection"]
        updated, changed = rl.apply_disputed(list(self.refs.values()), ids, self.now(), self.s)
        self.save_changed(updated, changed, "reflection.rebutted")

    def on_ReplyMentions(self, msg: ReplyMentions) -> None:
        updated, changed = rl.record_reply_mentions(list(self.refs.values()), msg.text, self.now(), self.s, self.stop_names())
        self.save_changed(updated, changed, "reflection.evidence_updated")

    # -- surfacing -------------------------------------------------------------------
    def on_FollowupTopics(self, msg: FollowupTopics) -> None:
        picks = rl.followup_candidates(filter_visible(self.refs.values(), None), self.now(), self.s, self.rng)
        msg.reply.ok({"topics": [{"id": r.id, "text": r.text, "entity": r.entity} for r in picks]})

    def on_RecordSurfaced(self, msg: RecordSurfaced) -> None:
        known = [i for i in msg.ids if i in self.refs]
        refs, surfaced = rl.record_surfaced(list(self.refs.values()), self.surfaced, known, self.now(), self.s)
        by_id = {r.id: r for r in refs}
        self.record_many(
            [("reflection.surfaced", {"surfaced": msgspec.to_builtins(surfaced)})]
            + [("reflection.evidence_updated", {"reflection": msgspec.to_builtins(by_id[i])}) for i in known if i in by_id]
        )
        self.ctx.send("recall", IndexUpsert(entries=[self.index_entry(self.refs[i]) for i in known if i in self.refs]))
        msg.reply.ok({"ok": True, "recorded": len(known)})

    # -- rendering -------------------------------------------------------------------
    def on_RenderWithPersona(self, msg: RenderWithPersona) -> None:
        names = {**self.names(), **({"master_name": msg.master_name} if msg.master_name else {})}
        text = render_longterm(
            msg.persona, filter_visible(self.refs.values(), msg.subjects), now=self.now(), settings=self.s,
            count_tokens=self.counter.count, language=msg.language, **names,
        )
        msg.reply.ok(text)

    def on_ResetConfirmedAt(self, msg: ResetConfirmedAt) -> None:
        before = {r.id: r for r in self.refs.values()}
        updated, count = rl.reset_confirmed_at(list(self.refs.values()), self.now())
        changed = [r for r in updated if msgspec.to_builtins(r) != msgspec.to_builtins(before[r.id])]
        self.save(changed)
        msg.reply.ok(count)

    # -- periodic --------------------------------------------------------------------
    def tick(self, msg: Tick) -> None:
        if msg.monotonic >= self.next_promote:
            self.next_promote = msg.monotonic + self.s.reflection_auto_promote_interval_seconds
            self._promotion_pass(None, None)
            # Scores decay with time: tell recall of entries whose filter verdict changed.
            self.send_decayed()
        if msg.monotonic >= self.next_sweep:
            self.next_sweep = msg.monotonic + self.s.evidence_archive_sweep_interval_seconds
            self.sweep()
        self.refine_tick(msg.monotonic)
        self.rebuttal_tick(msg.monotonic)

    # -- periodic disputation scan -------------------------------------------------------
    REBUTTAL_CURSOR = "rebuttal_checked_until"

    def rebuttal_tick(self, monotonic: float) -> None:
        """Every ``reflection_rebuttal_interval_seconds``: read the user's messages since the
        cursor from the raw journal (read-only; RecentActor owns it) and ask the emotion tier
        whether they dispute a confirmed reflection. With powerful memory off, or nothing
        to check, the cursor moves to now so nothing is backfilled later."""
        if monotonic < self.next_rebuttal or self.rebuttal_inflight:
            return
        self.next_rebuttal = monotonic + self.s.reflection_rebuttal_interval_seconds
        now = self.now()
        now_iso = now.isoformat()
        targets = rl.rebuttal_targets(self.refs.values(), now, self.s)
        if not self.powerful() or not targets or not self.model_available("check_disputation"):
            self.cursors.set(self.REBUTTAL_CURSOR, now_iso)
            return
        cursor = self.cursors.get(self.REBUTTAL_CURSOR)
        cursor_dt = None
        if cursor is not None:
            from nekomem.domain.messages import parse_timestamp

            try:
                cursor_dt = parse_timestamp(cursor)
            except ValueError:
                cursor_dt = None
            if cursor_dt is not None and cursor_dt > now:
                cursor_dt = None  # the clock went back: start over from the lookback window
            elif cursor_dt is not None:
                cursor_dt += timedelta(microseconds=1)  # the cursor's own message was checked
        start = rl.rebuttal_window_start(cursor_dt, now, self.s)
        rows = self._journal_rows(start.isoformat(), now_iso)
        batch = rl.rebuttal_batch(rows, self.s)
        if not batch.messages:
            self.cursors.set(self.REBUTTAL_CURSOR, batch.advance_to or now_iso)
            return
        observations = ev.observation_pool(targets, {}, now, self.s)
        messages = prompts.check_disputation_messages(
            batch.messages, observations, count_tokens=self.counter.count, settings=self.s, **self.names()
        )
        token = self.ask_model(
            "rebuttal", "check_disputation", messages,
            context={"observations": observations, "advance_to": batch.advance_to or now_iso},
            timeout=self.s.longterm_rebuttal_timeout_seconds,
        )
        self.rebuttal_inflight = token is not None

    def _journal_rows(self, start_iso: str, end_iso: str) -> list[Any]:
        from nekomem.stores.timeindex import TimeIndex

        path = self.ctx.paths.time_index_db
        if not path.exists():
            return []
        index = TimeIndex(path)
        try:
            return index.between(start_iso, end_iso, limit=self.s.reflection_rebuttal_max_rows)
        finally:
            index.close()

    def done_rebuttal(self, msg: ModelDone) -> None:
        self.rebuttal_inflight = False
        if msg.error is not None:
            self.rebuttal_failures += 1
            if self.rebuttal_failures >= self.s.longterm_liveness_max_attempts:
                # Dead letter: do not retry the same window forever.
                self.rebuttal_failures = 0
                self.cursors.set(self.REBUTTAL_CURSOR, msg.context["advance_to"])
            return
        self.rebuttal_failures = 0
        signals = ev.resolve_disputed(msg.output, msg.context["observations"])
        ids = [s.target_id for s in signals if s.target_kind == "reflection"]
        updated, changed = rl.apply_disputed(list(self.refs.values()), ids, self.now(), self.s)
        self.save_changed(updated, changed, "reflection.rebutted")
        self.cursors.set(self.REBUTTAL_CURSOR, msg.context["advance_to"])
        if changed:
            self.log.info("disputation scan: %d reflections disputed", len(changed))

    def sweep(self) -> dict[str, int]:
        now = self.now()
        result = rl.archive_sweep(list(self.refs.values()), now, self.s)
        by_id = {r.id: r for r in result.kept}
        self.save([by_id[i] for i in result.counted if i in by_id], "reflection.evidence_updated")
        if result.archived:
            day = now.strftime("%Y-%m-%d")
            folder = self.ctx.paths.reflection_archive_dir
            counts: dict[str, int] = {}
            if folder.exists():
                for path in folder.glob("*.json"):
                    raw, _ = read_json(path, default=[])
                    counts[path.name] = len(raw) if isinstance(raw, list) else 0
            shards = assign_shards(counts, len(result.archived), day, lambda: __import__("uuid").uuid4().hex[:8], self.s.evidence_archive_shard_max_entries)
            archived = rl.with_shard_paths(result.archived, shards)
            self.record_many(
                ("reflection.state_changed", {"reflection": msgspec.to_builtins(r), "archive_shard": shard})
                for r, shard in zip(archived, shards)
            )
            self.ctx.send("recall", IndexRemove(ids=[r.id for r in archived]))
            self.flush()
        return {"archived": len(result.archived), "counted": len(result.counted)}

    # -- refinement ------------------------------------------------------------------
    _refine_next: float | None = None
    _refine_inflight: int = 0
    _refine_off_noted: bool = False

    def refine_tick(self, monotonic: float) -> None:
        """Start a refinement pass when one is due (after its initial delay, then every
        longterm_refine_interval_seconds) and the previous pass has finished."""
        if self._refine_next is None:
            self._refine_next = monotonic + self.s.longterm_refine_reflection_initial_delay_seconds
        if monotonic < self._refine_next or self._refine_inflight:
            return
        self._refine_next = monotonic + self.s.longterm_refine_interval_seconds
        self.refine_pass()

    def _refine_vectors(self) -> tuple[str, int] | None:
        """(model id, dim) of a ready embedding service; None (logged once at INFO when
        embeddings are absent or disabled) otherwise."""
        emb = self.ctx.services.embeddings
        if emb is not None and getattr(emb, "is_ready", False) and emb.model_id and emb.dim:
            return emb.model_id, int(emb.dim)
        if (emb is None or getattr(emb, "state", "") == "disabled") and not self._refine_off_noted:
            self._refine_off_noted = True
            self.log.info("reflection refinement is off: no embedding model")
        return None

    def refine_pass(self) -> int:
        """Send the clusters of near-duplicate active reflections (per entity, from the
        cached vectors) to refine_cluster; returns how many were sent. Does nothing with
        powerful memory off, without the correction tier or without embeddings."""
        if not self.powerful() or not self.model_available("refine_cluster"):
            return 0
        vectors = self._refine_vectors()
        if vectors is None:
            return 0
        model, dim = vectors
        now = self.now()
        groups: dict[str, list[Reflection]] = {}
        for ref in rl.active(self.refs.values()):
            groups.setdefault(ref.entity, []).append(ref)
        clusters = rf.plan_clusters(groups.values(), lambda r: rf.cached_vector(r, model, dim), now, self.s)
        return self.send_refine_clusters([({i: self.refs[i].text for i in ids}, {}) for ids in clusters], "reflection")

    def done_refine(self, msg: ModelDone) -> None:
        self._refine_inflight = max(0, self._refine_inflight - 1)
        members: dict[str, str] = msg.context["members"]
        current = [self.refs.get(i) for i in members]
        if any(r is None or r.status in TERMINAL or r.status == "promoted" or r.text != members[r.id] for r in current):
            # Changed while the model was thinking: its answer is about texts that are gone.
            self.log.info("reflection refinement answer dropped: the cluster changed meanwhile")
            return
        refs = [r for r in current if r is not None]
        now = self.now()
        ops = [] if msg.error is not None else rf.parse_actions(msg.output, list(members))
        if not ops:
            self.save(rf.record_failure(refs, now))
            self.log.info("reflection refinement failed for a cluster of %d (%s)", len(refs), "error" if msg.error else "no valid action")
            return
        result = rf.refine_reflections(refs, ops, now, self.s, taken_ids=self.refs.keys())
        self.save(result.records)
        self.log.info("reflection refinement applied: %s, %d new", result.outcome.counts, len(result.outcome.created))

    # -- API -------------------------------------------------------------------------
    def on_ListEntries(self, msg: ListEntries) -> None:
        pool = list(self.refs.values())
        if msg.status:
            pool = [r for r in pool if r.status == msg.status]
        if msg.entity:
            pool = [r for r in pool if r.entity == msg.entity]
        page = pool[msg.offset : msg.offset + msg.limit]
        msg.reply.ok({"total": len(pool), "offset": msg.offset, "items": [self.public(r) for r in page]})

    def on_EditEntry(self, msg: EditEntry) -> None:
        ref = self.refs.get(msg.id)
        if ref is None:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        unknown = set(msg.changes) - {"text", "entity"}
        if unknown:
            raise ActorFailure("bad_field", f"cannot edit {sorted(unknown)}", 422)
        changes: dict[str, Any] = {}
        if "text" in msg.changes:
            changes["text"] = self.edited_text(msg.changes)
            changes["embedding"] = None
            changes["embedding_text_sha256"] = None
        if "entity" in msg.changes:
            if not isinstance(msg.changes["entity"], str) or not msg.changes["entity"].strip():
                raise ActorFailure("bad_entity", "entity must be a non-empty string", 422)
            changes["entity"] = msg.changes["entity"].strip()
        updated = msgspec.structs.replace(ref, **changes)
        self.save([updated], "reflection.updated")
        msg.reply.ok(self.public(updated))

    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        if msg.id not in self.refs:
            raise ActorFailure("not_found", f"no reflection {msg.id}", 404)
        self.record("reflection.deleted", {"id": msg.id})
        self.ctx.send("recall", IndexRemove(ids=[msg.id]))
        msg.reply.ok({"deleted": msg.id})
