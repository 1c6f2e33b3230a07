"""PersonaActor: persona.json, persona_corrections.json and persona_archive/.

Persona entries are grouped by entity (master, neko, relationship, or any other). Entries
imported from a character card are protected: never decayed, never archived, never
replaced by a contradicting reflection. Promotion of reflections runs here: with powerful
memory on through the correction tier's ``judge_promotion``; off, by elapsed time alone.

The actor is a mailbox over a :class:`PersonaLayer`, which owns the store
(:mod:`~nekomem.layers.persona.state`) and the passes over it: promotion, evidence
mapping, the corrections queue and refinement, each in its own module.
"""

from __future__ import annotations

import hashlib
import math

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.journaled_views import edited_text
from nekomem.actors.messages import (
    CorrectionsAnswer,
    CountEntries,
    DeleteEntry,
    EditEntry,
    EntryAnswer,
    EntryCounts,
    EvidencePass,
    ImportCard,
    ListCorrections,
    ListEntries,
    Promote,
    RefineDone,
    RenderContext,
    RenderWithPersona,
    ReplyMentions,
    ScopedMentions,
    ScrubTexts,
    SetSuppressed,
    Tick,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain import evidence as ev
from nekomem.domain import persona as pl
from nekomem.domain.layers import PERSONA, REFLECTIONS
from nekomem.domain.records import Persona, PersonaEntry, card_entry_id, external_entry_id
from nekomem.domain.subjects import private_persona, scoped_persona
from nekomem.layers.persona.corrections import CorrectionDone, CorrectionQueue
from nekomem.layers.persona.evidence import EvidenceDone, EvidenceMapping
from nekomem.layers.persona.promotion import PromoteDone, Promotion
from nekomem.layers.persona.refine import PersonaRefinement, RefineVectorsDone
from nekomem.layers.persona.state import PersonaStore
from nekomem.runtime.protocol import Message
from nekomem.runtime.reply import ActorFailure
from nekomem.wire.answers import CardImportAnswer, DeleteAnswer, MentionsAnswer, PageAnswer, SuppressAnswer

ENTITY_MAX_CHARS = 50


class PersonaLayer:
    """The persona of one character: its store, the card sync, mentions, rendering, the
    API, and the periodic work (archive sweep, corrections, refinement)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.log = ports.log
        self.store = PersonaStore(ports)
        self.views = self.store.views
        self.s = self.store.s
        self.promotion = Promotion(ports, self.store)
        self.evidence = EvidenceMapping(ports, self.store)
        self.corrections = CorrectionQueue(ports, self.store)
        self.refinement = PersonaRefinement(ports, self.store)
        self.next_sweep = 0.0

    # -- lifecycle (the Layer protocol) ----------------------------------------------
    def load(self) -> None:
        """Read the views and replay the journal, then sync the card entries. Raises
        OSError (or the store's decode errors)."""
        mono = self.ports.clock.monotonic()
        self.corrections.reset(mono)
        self.next_sweep = mono + self.s.evidence_archive_sweep_initial_delay_seconds
        self.views.load()
        self.sync_card_file()

    def flush(self) -> None:
        self.views.flush()

    def close(self) -> None:
        """Nothing to release: the views are written whole and the journal is the character's."""

    def due_at(self) -> float | None:
        """The archive sweep, pending corrections, and the refinement pass."""
        refine = self.refinement.due_at()
        due = [self.next_sweep]
        corrections = self.corrections.due_at()
        if corrections is not None:
            due.append(corrections)
        if refine is not None:
            due.append(refine)
        return min(due)

    def real_due_at(self) -> float | None:
        return self.views.real_due_at()

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self.views.maybe_flush()
        if msg.monotonic >= self.next_sweep:
            self.next_sweep = msg.monotonic + self.s.evidence_archive_sweep_interval_seconds
            self.store.sweep(self.ports.now())
        self.corrections.tick(msg.monotonic)
        self.refinement.tick(msg.monotonic)

    # -- character card --------------------------------------------------------------
    def sync_card_file(self) -> None:
        """Sync the protected card entries with the chat server's characters.json, as the
        reference does on every persona load: the character's card and the master's
        profile, card fields at the head, changed texts rewritten, removed fields dropped.
        Nothing happens without a cards file, or when it cannot be read."""
        cards = self.ports.cards
        parts = cards.parts(self.ports.character) if cards is not None else None
        if not parts:
            return
        new = pl.sync_card(self.store.persona, parts, self.s, self.ports.now())
        changed = self.store.commit(new)
        if changed:
            self.log.info("character card synced: %d persona entries changed", len(changed))

    @handles(ImportCard)
    def on_ImportCard(self, msg: ImportCard) -> None:
        now = self.ports.now()
        new = pl.copy_persona(self.store.persona)
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
        self.store.commit(new)
        _answer(msg, CardImportAnswer(added=added, skipped_existing=len(msg.entries) - len(added)))

    # -- promotion, evidence, corrections, refinement --------------------------------
    @handles(Promote)
    def on_Promote(self, msg: Promote) -> None:
        self.promotion.promote(msg)

    @handles(PromoteDone)
    def on_PromoteDone(self, msg: PromoteDone) -> None:
        self.promotion.done(msg)

    @handles(EvidencePass)
    def on_EvidencePass(self, msg: EvidencePass) -> None:
        self.evidence.start(msg)

    @handles(EvidenceDone)
    def on_EvidenceDone(self, msg: EvidenceDone) -> None:
        self.evidence.done(msg)

    @handles(CorrectionDone)
    def on_CorrectionDone(self, msg: CorrectionDone) -> None:
        self.corrections.done(msg)

    @handles(RefineVectorsDone)
    def on_RefineVectorsDone(self, msg: RefineVectorsDone) -> None:
        self.refinement.vectors_done(msg)

    @handles(RefineDone)
    def on_RefineDone(self, msg: RefineDone) -> None:
        self.refinement.refine_done(msg)

    # -- mentions --------------------------------------------------------------------
    @handles(ReplyMentions)
    def on_ReplyMentions(self, msg: ReplyMentions) -> None:
        # A private reply counts only for private entries (a group's are counted by /scoped_mentions).
        self._record_mentions(private_persona(self.store.persona), msg.text)

    @handles(ScopedMentions)
    def on_ScopedMentions(self, msg: ScopedMentions) -> None:
        changed = self._record_mentions(scoped_persona(self.store.persona, msg.subjects), msg.text)
        _answer(msg, MentionsAnswer(status="recorded", mentioned=changed))

    def _record_mentions(self, part: Persona, text: str) -> int:
        """Record mentions in ``text`` of the entries of ``part`` (a view of the persona)."""
        updated, changed = pl.record_reply_mentions(part, text, self.ports.now(), self.s, self.ports.stop_names())
        if changed:
            ids = set(changed)
            by_id = {e.id: e for entries in updated.values() for e in entries if e.id in ids}
            persona = self.store.persona
            self.store.commit({k: [by_id.get(e.id, e) for e in v] for k, v in persona.items()}, type="persona.fact_mentioned")
        return len(changed)

    # -- rendering -------------------------------------------------------------------
    @handles(RenderContext)
    def on_RenderContext(self, msg: RenderContext) -> None:
        new, changed = pl.refresh_suppressions(self.store.persona, self.ports.now(), self.s)
        if changed:
            self.store.commit(new, type="persona.suppressed")
        persona = self.store.persona
        part = private_persona(persona) if msg.subjects is None else scoped_persona(persona, msg.subjects)
        self.ports.send(
            REFLECTIONS,
            RenderWithPersona(
                persona=pl.copy_persona(part),
                subjects=msg.subjects,
                language=msg.language,
                master_name=msg.master_name,
                reply=msg.reply,
            ),
        )

    # -- erasure ---------------------------------------------------------------------
    @handles(ScrubTexts)
    def on_ScrubTexts(self, msg: ScrubTexts) -> None:
        """Another layer's erasure: queued corrections quoting its text go (and their
        journal events), then the next layer of the relay scrubs its copies (the outbox
        last, which answers)."""
        if self.store.forget_corrections_of(msg.texts):
            self.views.erase([], msg.texts, None, msg.reply, msg.reply_value, relay=msg)
        else:
            self.ports.send(msg.onward(PERSONA), msg)

    # -- API -------------------------------------------------------------------------
    @handles(ListEntries)
    def on_ListEntries(self, msg: ListEntries) -> None:
        now = self.ports.now()
        rows: list[dict[str, object]] = []
        for entity, entries in self.store.persona.items():
            if msg.entity and entity != msg.entity:
                continue
            for entry in entries:
                if msg.status == "protected" and not entry.protected:
                    continue
                data: dict[str, object] = msgspec.to_builtins(msgspec.structs.replace(entry, embedding=None))
                data["entity"] = entity
                score = ev.net_score(entry, now, self.s)
                data["evidence_score"] = score if math.isfinite(score) else None  # protected: unbounded
                rows.append(data)
        page = rows[msg.offset : msg.offset + msg.limit]
        _answer(msg, PageAnswer(total=len(rows), offset=msg.offset, items=page))

    def _found(self, entry_id: str) -> tuple[str, PersonaEntry]:
        """(entity, entry) of ``entry_id``. Raises ActorFailure 404 when there is none."""
        found = self.store.find(entry_id)
        if found is None:
            raise ActorFailure("not_found", f"no persona entry {entry_id}", 404)
        return found

    @handles(EditEntry)
    def on_EditEntry(self, msg: EditEntry) -> None:
        entity, _entry = self._found(msg.id)
        unknown = set(msg.changes) - {"text"}
        if unknown:
            raise ActorFailure("bad_field", f"cannot edit {sorted(unknown)}", 422)
        text = edited_text(msg.changes)
        new = pl.copy_persona(self.store.persona)
        new[entity] = [msgspec.structs.replace(e, text=text, embedding=None) if e.id == msg.id else e for e in new[entity]]
        self.store.commit(new)
        _answer(msg, EntryAnswer(entry={"id": msg.id, "entity": entity, "text": text}))

    @handles(SetSuppressed)
    def on_SetSuppressed(self, msg: SetSuppressed) -> None:
        entity, entry = self._found(msg.id)
        if entry.protected and msg.suppress:
            raise ActorFailure("conflict", f"persona entry {msg.id} is protected (character card) and cannot be suppressed", 409)
        if msg.suppress:
            changed = msgspec.structs.replace(entry, suppress=True, suppressed_at=self.ports.now_iso())
        else:
            changed = msgspec.structs.replace(entry, suppress=False, suppressed_at=None, recent_mentions=[])
        new = pl.copy_persona(self.store.persona)
        new[entity] = [changed if e.id == msg.id else e for e in new[entity]]
        self.store.commit(new, type="persona.suppressed")
        _answer(msg, SuppressAnswer(id=msg.id, entity=entity, suppress=changed.suppress, suppressed_at=changed.suppressed_at))

    @handles(CountEntries)
    def on_CountEntries(self, msg: CountEntries) -> None:
        entries = sum(len(section) for section in self.store.persona.values())
        _answer(msg, EntryCounts({"persona": entries, "corrections": len(self.store.corrections)}))

    @handles(ListCorrections)
    def on_ListCorrections(self, msg: ListCorrections) -> None:
        corrections = self.store.corrections
        _answer(msg, CorrectionsAnswer(total=len(corrections), items=list(corrections), inflight=self.corrections.inflight))

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        _entity, entry = self._found(msg.id)
        self.views.record("persona.entry_deleted", {"id": msg.id})
        self.store.forget_corrections_of([entry.text])
        self.views.erase([msg.id], [entry.text], self.ports.paths.persona_archive_dir, msg.reply, DeleteAnswer(deleted=msg.id))


def _answer(msg: Message, value: object) -> None:
    """Answer ``msg``'s sender with ``value`` (the HTTP side always waits for these)."""
    if msg.reply is not None:
        msg.reply.ok(value)
