"""PersonaActor: persona.json, persona_corrections.json and persona_archive/.

Persona entries are grouped by entity (master, neko, relationship, or any other). Entries
imported from a character card are protected: never decayed, never archived, never
replaced by a contradicting reflection. Promotion of reflections runs here: with powerful
memory on through the correction tier's ``judge_promotion``; off, by elapsed time alone.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    ApplySignals,
    DeleteEntry,
    EditEntry,
    EvidencePass,
    ImportCard,
    ListCorrections,
    ListEntries,
    ModelDone,
    Promote,
    PromotionResult,
    RenderContext,
    RenderWithPersona,
    ReplyMentions,
    ScopedMentions,
    SetSuppressed,
    SignalsProcessed,
    Tick,
)
from nekomem.actors.persona_state import PersonaState
from nekomem.domain import evidence as ev
from nekomem.domain import persona as pl
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain import refine as rf
from nekomem.domain.persona.refinement import cluster_changed, missing_vectors, persona_clusters, with_vectors
from nekomem.domain.records import (
    Persona,
    PersonaEntry,
    card_entry_id,
    external_entry_id,
)
from nekomem.domain.subjects import private_persona, scoped_persona
from nekomem.runtime.reply import ActorFailure

ENTITY_MAX_CHARS = 50


class PersonaActor(PersonaState):
    child_name = "persona"
    owner = "persona"

    # -- character card --------------------------------------------------------------
    def after_load(self) -> None:
        super().after_load()
        self.sync_card_file()

    def sync_card_file(self) -> None:
        """Sync the protected card entries with the chat server's characters.json, as the
        reference does on every persona load: the character's card and the master's
        profile, card fields at the head, changed texts rewritten, removed fields dropped.
        Nothing happens without a cards file, or when it cannot be read."""
        cards = self.ctx.services.cards
        parts = cards.parts(self.ctx.name) if cards is not None else None
        if not parts:
            return
        new = pl.sync_card(self.persona, parts, self.s, self.now())
        changed = self.commit(new)
        if changed:
            self.log.info("character card synced: %d persona entries changed", len(changed))

    @handles(ImportCard)
    def on_ImportCard(self, msg: ImportCard) -> None:
        now = self.now()
        new = pl.copy_persona(self.persona)
        added: list[str] = []
        for index, item in enumerate(msg.entries):
            entity = item.get("entity")
            text = item.get("text")
            if not isinstance(entity, str) or not entity.strip() or len(entity) > ENTITY_MAX_CHARS:
                raise ActorFailure("bad_entity", f"entries[{index}].entity must be a name of 1 to {ENTITY_MAX_CHARS} characters", 422)
            if not isinstance(text, str) or not text.strip():
                raise ActorFailure("bad_text", f"entries[{index}].text must be a non-empty string", 422)
            entity, text = entity.strip(), text.strip()
            if msg.protected:
                entry_id = card_entry_id(entity, hashlib.sha256(text.encode()).hexdigest()[:16])
            else:
                entry_id = external_entry_id(entity, text)
            if pl.find_entry(new, entry_id) is not None:
                continue
            entry = PersonaEntry(id=entry_id, text=text, source=msg.source, protected=msg.protected, created_at=now.isoformat())
            section = list(new.get(entity, []))
            protected = [e for e in section if e.protected]
            section.insert(len(protected) if msg.protected else len(section), entry)
            new[entity] = section
            added.append(entry_id)
        self.commit(new)
        msg.reply.ok({"added": added, "skipped_existing": len(msg.entries) - len(added)})

    # -- promotion -------------------------------------------------------------------
    @handles(Promote)
    def on_Promote(self, msg: Promote) -> None:
        now = self.now()
        state = {"left": 0, "report": msg.report, "reply": msg.reply}
        results: list[dict[str, Any]] = []
        if msg.report is not None:
            msg.report["promotion"] = results
        powerful = self.powerful()
        for ref in msg.candidates:
            if not powerful:
                outcome = pl.time_driven_promotion(ref, self.persona, self.corrections, now, self.s, self.stop_names())
                self._apply_outcome(outcome, results)
                continue
            gate = pl.promotion_gate(ref, now, self.s)
            if gate == "wait":
                results.append({"reflection_id": ref.id, "kind": "waiting"})
                continue
            if gate == "block":
                blocked = pl.blocked(ref, now)
                self.ctx.send("reflections", PromotionResult(reflection=blocked, kind="blocked"))
                results.append({"reflection_id": ref.id, "kind": "blocked"})
                continue
            attempted = pl.record_promotion_attempt(ref, now)
            self.ctx.send("reflections", PromotionResult(reflection=attempted, kind="attempt"))
            pool = pl.promotion_pool(attempted, self.persona, msg.candidates, now, self.s, self.counter.count)
            score = ev.net_score(attempted, now, self.s)
            messages = prompts.judge_promotion_messages(attempted, score, pool, **self.names())
            token = self.ask_model(
                "promote",
                "judge_promotion",
                messages,
                context={"ref": attempted, "state": state, "results": results},
                timeout=self.s.longterm_promotion_timeout_seconds,
            )
            if token is None:
                results.append({"reflection_id": ref.id, "kind": "skipped", "reason": "no correction tier or model pool full"})
            else:
                state["left"] += 1
        self._maybe_answer(state)

    def done_promote(self, msg: ModelDone) -> None:
        ctx = msg.context
        ref = ctx["ref"]
        if msg.error is not None:
            ctx["results"].append({"reflection_id": ref.id, "kind": "failed"})
            self.log.info("judge_promotion failed; it is retried after the backoff")
        else:
            outcome = pl.apply_promotion_decision(ref, msg.output, self.persona, self.corrections, self.now(), self.s, self.stop_names())
            self._apply_outcome(outcome, ctx["results"])
        ctx["state"]["left"] -= 1
        self._maybe_answer(ctx["state"])

    def _apply_outcome(self, outcome: Any, results: list[dict[str, Any]]) -> None:
        self.commit(outcome.persona, outcome.corrections)
        self.ctx.send("reflections", PromotionResult(reflection=outcome.reflection, kind=outcome.kind))
        results.append({"reflection_id": outcome.reflection.id, "kind": outcome.kind, "entry_id": outcome.entry_id})
        self.log.info("promotion outcome: %s", outcome.kind)

    def _maybe_answer(self, state: dict[str, Any]) -> None:
        if state["left"] == 0 and state["reply"] is not None and state["report"] is not None:
            state["reply"].ok(state["report"])
            state["reply"] = None

    # -- evidence --------------------------------------------------------------------
    @handles(EvidencePass)
    def on_EvidencePass(self, msg: EvidencePass) -> None:
        now = self.now()
        batch = msg.facts[: self.s.evidence_map_max_new_facts]
        own = ev.observation_pool([], self.persona, now, self.s)
        observations = (list(msg.reflection_observations) + own)[: self.s.evidence_map_max_observations]
        observations = prompts.cap_observations(observations, self.counter.count, self.s)
        fact_ids = [f.id for f in batch]
        if not observations:
            self.ctx.send("facts", SignalsProcessed(fact_ids=fact_ids))
            return
        messages = prompts.map_evidence_messages(batch, observations, count_tokens=self.counter.count, settings=self.s, **self.names())
        token = self.ask_model(
            "evidence",
            "map_evidence",
            messages,
            context={"fact_ids": fact_ids, "observations": observations},
            timeout=self.s.longterm_map_evidence_timeout_seconds,
        )
        if token is None:
            self.log.info("map_evidence skipped: no summary tier or model pool full")

    def done_evidence(self, msg: ModelDone) -> None:
        if msg.error is not None:
            self.log.info("map_evidence failed")
            return
        signals = ev.resolve_signals(msg.output, msg.context["fact_ids"], msg.context["observations"])
        mine = [s for s in signals if s.target_kind == "persona"]
        theirs = [s for s in signals if s.target_kind == "reflection"]
        if mine:
            new, _changed = pl.apply_resolved_signals(self.persona, mine, self.now(), self.s)
            self.commit(new, type="persona.evidence_updated")
        if theirs:
            self.ctx.send("reflections", ApplySignals(signals=theirs))
        self.ctx.send("facts", SignalsProcessed(fact_ids=msg.context["fact_ids"]))

    @handles(ReplyMentions)
    def on_ReplyMentions(self, msg: ReplyMentions) -> None:
        # A private reply counts only for private entries (a group's are counted by /scoped_mentions).
        self._record_mentions(private_persona(self.persona), msg.text)

    @handles(ScopedMentions)
    def on_ScopedMentions(self, msg: ScopedMentions) -> None:
        changed = self._record_mentions(scoped_persona(self.persona, msg.subjects), msg.text)
        msg.reply.ok({"status": "recorded", "mentioned": changed})

    def _record_mentions(self, part: Persona, text: str) -> int:
        """Record mentions in ``text`` of the entries of ``part`` (a view of the persona)."""
        updated, changed = pl.record_reply_mentions(part, text, self.now(), self.s, self.stop_names())
        if changed:
            ids = set(changed)
            by_id = {e.id: e for entries in updated.values() for e in entries if e.id in ids}
            self.commit({k: [by_id.get(e.id, e) for e in v] for k, v in self.persona.items()}, type="persona.fact_mentioned")
        return len(changed)

    # -- rendering -------------------------------------------------------------------
    @handles(RenderContext)
    def on_RenderContext(self, msg: RenderContext) -> None:
        new, changed = pl.refresh_suppressions(self.persona, self.now(), self.s)
        if changed:
            self.commit(new, type="persona.suppressed")
        persona = private_persona(self.persona) if msg.subjects is None else scoped_persona(self.persona, msg.subjects)
        self.ctx.send(
            "reflections",
            RenderWithPersona(
                persona=pl.copy_persona(persona),
                subjects=msg.subjects,
                language=msg.language,
                master_name=msg.master_name,
                reply=msg.reply,
            ),
        )

    # -- periodic --------------------------------------------------------------------
    def due_at(self) -> float | None:
        """The archive sweep, pending corrections, and the refinement pass."""
        if self._refine_next is None:
            self._refine_next = self.ctx.clock.monotonic() + self.s.longterm_refine_persona_initial_delay_seconds
        due = [self.next_sweep]
        if self.corrections and not self.correction_inflight:
            due.append(self.next_corrections)
        if not self._refine_inflight and not self._refine_embedding:
            due.append(self._refine_next)
        return min(due)

    def tick(self, msg: Tick) -> None:
        if msg.monotonic >= self.next_sweep:
            self.next_sweep = msg.monotonic + self.s.evidence_archive_sweep_interval_seconds
            self.sweep()
        if msg.monotonic >= self.next_corrections:
            self.next_corrections = msg.monotonic + self.s.longterm_idle_maintenance_interval_seconds
            self._resolve_corrections()
        self.refine_tick(msg.monotonic)

    # -- refinement ------------------------------------------------------------------
    _refine_next: float | None = None
    _refine_inflight: int = 0
    _refine_embedding: bool = False
    _refine_off_noted: bool = False

    def refine_tick(self, monotonic: float) -> None:
        """Start a refinement pass when one is due (after its initial delay, then every
        longterm_refine_interval_seconds) and the previous pass has finished."""
        if self._refine_next is None:
            self._refine_next = monotonic + self.s.longterm_refine_persona_initial_delay_seconds
        if monotonic < self._refine_next or self._refine_inflight or self._refine_embedding:
            return
        self._refine_next = monotonic + self.s.longterm_refine_interval_seconds
        self.refine_pass()

    def _refine_service(self) -> Any:
        """The embedding service when it is ready; None (logged once at INFO when it is
        absent or disabled) otherwise."""
        emb = self.ctx.services.embeddings
        if emb is not None and getattr(emb, "is_ready", False) and emb.model_id and emb.dim:
            return emb
        if (emb is None or getattr(emb, "state", "") == "disabled") and not self._refine_off_noted:
            self._refine_off_noted = True
            self.log.info("persona refinement is off: no embedding model")
        return None

    def refine_pass(self) -> int:
        """One persona refinement pass. Entries without a vector for the current model are
        embedded first on the model pool (the pass goes on when they arrive); then the
        clusters are sent to refine_cluster. Returns the clusters sent now."""
        if not self.powerful() or not self.model_available("refine_cluster"):
            return 0
        emb = self._refine_service()
        if emb is None:
            return 0
        model, dim = emb.model_id, int(emb.dim)
        missing = missing_vectors(self.persona, model, dim, self.now(), self.s)
        if not missing:
            return self._refine_send(model, dim)
        from nekomem.runtime.pool import PoolFull

        texts = [text for _id, text in missing]

        def job() -> Any:
            return emb.embed(texts, "passage")

        def wrap(result: Any, error: BaseException | None) -> Any:
            return ModelDone(
                kind="refine_vectors",
                token=0,
                output=result,
                error=None if error is None else repr(error),
                context={"items": missing, "model": model, "dim": dim},
            )

        try:
            self.ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            return 0
        self._refine_embedding = True
        return 0

    def done_refine_vectors(self, msg: ModelDone) -> None:
        # Vectors are a cache: kept on the entries at the next view write, not journaled.
        self._refine_embedding = False
        if msg.error is not None:
            self.log.info("persona refinement: embedding failed; retried at the next pass")
            return
        model = msg.context["model"]
        self.persona, changed = with_vectors(self.persona, msg.context["items"], list(msg.output), model)
        if changed:
            self._dirty = max(self._dirty, 1)
        if self.powerful() and self.model_available("refine_cluster"):
            self._refine_send(model, msg.context["dim"])

    def _refine_send(self, model: str, dim: int) -> int:
        clusters = persona_clusters(self.persona, model, dim, self.now(), self.s)
        return self.send_refine_clusters([(members, {"entity": entity}) for members, entity in clusters], "persona")

    def done_refine(self, msg: ModelDone) -> None:
        self._refine_inflight = max(0, self._refine_inflight - 1)
        entity: str = msg.context["entity"]
        members: dict[str, str] = msg.context["members"]
        if cluster_changed(self.persona, entity, members):
            self.log.info("persona refinement answer dropped: the cluster changed meanwhile")
            return
        now = self.now()
        ids = list(members)
        ops = [] if msg.error is not None else rf.parse_actions(msg.output, ids)
        if not ops:
            self.commit(rf.persona_failure(self.persona, entity, ids, now))
            self.log.info("persona refinement failed for a cluster of %d (%s)", len(ids), "error" if msg.error else "no valid action")
            return
        result = rf.refine_persona(self.persona, entity, ids, ops, now, self.s)
        self.commit(result.persona)
        self.log.info("persona refinement applied: %s, %d new", result.outcome.counts, len(result.outcome.created))

    # -- API -------------------------------------------------------------------------
    @handles(ListEntries)
    def on_ListEntries(self, msg: ListEntries) -> None:
        now = self.now()
        rows: list[dict[str, Any]] = []
        for entity, entries in self.persona.items():
            if msg.entity and entity != msg.entity:
                continue
            for entry in entries:
                if msg.status == "protected" and not entry.protected:
                    continue
                data = msgspec.to_builtins(msgspec.structs.replace(entry, embedding=None))
                data["entity"] = entity
                score = ev.net_score(entry, now, self.s)
                data["evidence_score"] = score if math.isfinite(score) else None  # protected: unbounded
                rows.append(data)
        page = rows[msg.offset : msg.offset + msg.limit]
        msg.reply.ok({"total": len(rows), "offset": msg.offset, "items": page})

    @handles(EditEntry)
    def on_EditEntry(self, msg: EditEntry) -> None:
        found = self.find(msg.id)
        if found is None:
            raise ActorFailure("not_found", f"no persona entry {msg.id}", 404)
        entity, entry = found
        unknown = set(msg.changes) - {"text"}
        if unknown:
            raise ActorFailure("bad_field", f"cannot edit {sorted(unknown)}", 422)
        text = self.edited_text(msg.changes)
        new = pl.copy_persona(self.persona)
        new[entity] = [msgspec.structs.replace(e, text=text, embedding=None) if e.id == msg.id else e for e in new[entity]]
        self.commit(new)
        msg.reply.ok({"id": msg.id, "entity": entity, "text": text})

    @handles(SetSuppressed)
    def on_SetSuppressed(self, msg: SetSuppressed) -> None:
        found = self.find(msg.id)
        if found is None:
            raise ActorFailure("not_found", f"no persona entry {msg.id}", 404)
        entity, entry = found
        if entry.protected and msg.suppress:
            raise ActorFailure("conflict", f"persona entry {msg.id} is protected (character card) and cannot be suppressed", 409)
        if msg.suppress:
            changed = msgspec.structs.replace(entry, suppress=True, suppressed_at=self.now_iso())
        else:
            changed = msgspec.structs.replace(entry, suppress=False, suppressed_at=None, recent_mentions=[])
        new = pl.copy_persona(self.persona)
        new[entity] = [changed if e.id == msg.id else e for e in new[entity]]
        self.commit(new, type="persona.suppressed")
        msg.reply.ok({"id": msg.id, "entity": entity, "suppress": changed.suppress, "suppressed_at": changed.suppressed_at})

    @handles(ListCorrections)
    def on_ListCorrections(self, msg: ListCorrections) -> None:
        msg.reply.ok({"total": len(self.corrections), "items": msgspec.to_builtins(self.corrections), "inflight": self.correction_inflight})

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        found = self.find(msg.id)
        if found is None:
            raise ActorFailure("not_found", f"no persona entry {msg.id}", 404)
        self.record("persona.entry_deleted", {"id": msg.id})
        self.forget_corrections_of([found[1].text])
        self.erase([msg.id], [found[1].text], self.ctx.paths.persona_archive_dir, msg.reply, {"deleted": msg.id})
