"""The fact layer: facts.json and facts_archive.json, what writes them and what reads them.

:class:`FactsLayer` is the object FactActor owns. It holds the parts, each one concern:
the store (:mod:`~nekomem.layers.facts.state`: facts, journal, views, dedup, recall feed),
path A (:mod:`~nekomem.layers.facts.extraction`: post-turn records), path B
(:mod:`~nekomem.layers.facts.self_disclosure`), subject-scoped facts
(:mod:`~nekomem.layers.facts.scoped`), duplicate judgments
(:mod:`~nekomem.layers.facts.duplicates`) and the pick of each reflection synthesis
(:mod:`~nekomem.layers.facts.synthesis`). The layer routes each message to its part, runs
the periodic work and answers the memory API (list, browse, import, edit, delete).
"""

from __future__ import annotations

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.journaled_views import edited_text
from nekomem.actors.messages import (
    AbsorbFacts,
    AddScopedFacts,
    BrowseFacts,
    CountEntries,
    DeleteEntry,
    EditEntry,
    EntryAnswer,
    EntryCounts,
    ExtractScoped,
    ImportFacts,
    IndexRemove,
    ListEntries,
    RankedIds,
    ReclaimParked,
    ReflectNow,
    Report,
    RequestIndex,
    RunOp,
    ScrubTexts,
    SignalsProcessed,
    Tick,
    VectorsComputed,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain import facts as fl
from nekomem.domain.browse import page_facts
from nekomem.domain.layers import FACTS, OUTBOX, RECALL
from nekomem.domain.records import Fact, fact_hash
from nekomem.layers.facts.duplicates import DuplicateJudge, DupsDone
from nekomem.layers.facts.extraction import ExtractDone, FactExtraction
from nekomem.layers.facts.scoped import ScopedDone, ScopedFacts
from nekomem.layers.facts.self_disclosure import DisclosureDone, SelfDisclosure
from nekomem.layers.facts.state import FactStore, fact_index_entry
from nekomem.layers.facts.synthesis import SynthesisPicker
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.wire.answers import DeleteAnswer, ImportAnswer, PageAnswer


def _public(fact: Fact) -> Fact:
    return msgspec.structs.replace(fact, embedding=None)


def _answer(reply: Reply | None, value: object) -> None:
    if reply is not None:
        reply.ok(value)


class FactsLayer:
    """The fact layer's state and handlers (see the module)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.store = FactStore(ports)
        self.extraction = FactExtraction(ports, self.store)
        self.disclosure = SelfDisclosure(ports, self.store, self.extraction)
        self.scoped = ScopedFacts(ports, self.store)
        self.duplicates = DuplicateJudge(ports, self.store)
        self.synthesis = SynthesisPicker(ports, self.store)

    # -- lifecycle (Layer) -----------------------------------------------------------
    def load(self) -> None:
        """Start afresh from disk: the passes forget their work in flight (the outbox
        replays the records, reclaimed here), the path-B cursor is read. The facts
        themselves are read by the first message that needs them (see
        :mod:`nekomem.layers.facts.state`; recall asks for them with RequestIndex when it
        has no current segment), except at once when the views are behind the journal (a
        crash before their rewrite: repaired at wake as always) or when this is a reload
        (a restart, a renewal, the retry after a storage fault: recall is fed again, and a
        request of recall's that met the fault is not lost). Raises OSError."""
        self.extraction.reset()
        self.duplicates.reset()
        self.synthesis.reset()
        self.disclosure.load()
        self.store.unload()
        # Records parked in a previous instance's batch were lost with it.
        self.ports.send(OUTBOX, ReclaimParked(child=FACTS))
        if not self.ports.first_load() or self.ports.journal.unapplied_for(FACTS):
            self.store.require()

    def flush(self) -> None:
        """Write the views if they are behind the journal. Raises OSError."""
        self.store.views.flush()

    def close(self) -> None:
        """Nothing to release: the views are written whole and no file stays open."""

    def due_at(self) -> float | None:
        """Synthesis, the fact archive move, batch extraction when its trigger comes, the
        self-disclosure pass and duplicate judgments (at once for new pairs, else per
        idle-maintenance interval)."""
        mono = self.ports.clock.monotonic()
        now = self.ports.now()
        due = [self.synthesis.next_at]
        archive = self.store.archive_due(mono, now)
        if archive is not None:
            due.append(archive)
        wait = self.extraction.wait(now)
        if wait is not None:
            due.append(mono + wait)
        disclose = self.disclosure.wait(now, mono)
        if disclose is not None:
            due.append(disclose)
        judge = self.duplicates.due(mono)
        if judge is not None:
            due.append(judge)
        return min(due)

    def real_due_at(self) -> float | None:
        """The next view rewrite, when changes wait."""
        return self.store.views.real_due_at()

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self.store.views.maybe_flush()
        self.extraction.maybe_extract()
        self.disclosure.maybe_disclose()
        self.duplicates.tick(msg.monotonic)
        self.synthesis.tick(msg.monotonic)
        self.store.maybe_archive(self.ports.now())

    # -- post-turn work and model results --------------------------------------------
    @handles(RunOp)
    def on_RunOp(self, msg: RunOp) -> None:
        self.extraction.run_op(msg)

    @handles(ExtractDone)
    def on_ExtractDone(self, msg: ExtractDone) -> None:
        if self.extraction.done(msg):
            self.disclosure.path_a_done(msg.turns(), batch=msg.mode == "batch")
            self.extraction.maybe_extract()

    @handles(DisclosureDone)
    def on_DisclosureDone(self, msg: DisclosureDone) -> None:
        self.disclosure.done(msg)

    @handles(DupsDone)
    def on_DupsDone(self, msg: DupsDone) -> None:
        self.duplicates.done(msg)

    @handles(ScopedDone)
    def on_ScopedDone(self, msg: ScopedDone) -> None:
        self.scoped.done(msg)

    @handles(ScrubTexts)
    def on_ScrubTexts(self, msg: ScrubTexts) -> None:
        """A turn erasure: its text leaves the extraction batch waiting here (a batch
        already with the model cannot be called back), then the next layer of the relay
        scrubs its copies (the outbox last, which answers)."""
        if self.extraction.drop_texts(msg.texts):
            self.ports.log.info("erasure: forgotten turns left the extraction queue")
        self.ports.send(msg.onward(FACTS), msg)

    # -- recall ----------------------------------------------------------------------
    @handles(RequestIndex)
    def on_RequestIndex(self, msg: RequestIndex) -> None:
        """Recall asks for the complete set: a restarted RecallActor lost its index, or a
        waking one has no current segment of the facts (``wake``). Reading the facts sends
        it; facts already read have sent it at their read, which a wake request needs no
        second time."""
        if self.store.require() or msg.wake:
            return
        self.store.send_index()

    @handles(VectorsComputed)
    def on_VectorsComputed(self, msg: VectorsComputed) -> None:
        self.store.cache_vectors(msg.vectors)
        self.duplicates.vectors_ready(msg.vectors)

    @handles(RankedIds)
    def on_RecallAnswer(self, msg: RankedIds) -> None:
        if msg.tag.startswith("dup-"):
            self.duplicates.candidates(msg.tag[4:], msg.ids)
            return
        self.synthesis.related(msg.tag, msg.ids)

    # -- reflections -----------------------------------------------------------------
    @handles(ReflectNow)
    def on_ReflectNow(self, msg: ReflectNow) -> None:
        self.synthesis.start(Report(), msg.reply)

    @handles(AbsorbFacts)
    def on_AbsorbFacts(self, msg: AbsorbFacts) -> None:
        facts = self.store.facts
        ids = [i for i in msg.ids if i in facts and not facts[i].absorbed]
        if ids:
            self.store.record("fact.absorbed", {"ids": ids, "reflection_id": msg.reflection_id})

    @handles(SignalsProcessed)
    def on_SignalsProcessed(self, msg: SignalsProcessed) -> None:
        facts = self.store.facts
        ids = [i for i in msg.fact_ids if i in facts and not facts[i].signal_processed]
        if ids:
            updated = fl.mark_signal_processed([facts[i] for i in ids], ids)
            self.store.record_many(("fact.updated", {"fact": msgspec.to_builtins(f)}) for f in updated)

    # -- scoped facts ----------------------------------------------------------------
    @handles(AddScopedFacts)
    def on_AddScopedFacts(self, msg: AddScopedFacts) -> None:
        self.scoped.add(msg.subject, msg.facts, msg.reply)

    @handles(ExtractScoped)
    def on_ExtractScoped(self, msg: ExtractScoped) -> None:
        self.scoped.extract(msg)

    # -- API -------------------------------------------------------------------------
    @handles(ImportFacts)
    def on_ImportFacts(self, msg: ImportFacts) -> None:
        now = self.ports.now()
        new: list[Fact] = []
        for index, item in enumerate(msg.facts):
            fact = fl.normalize_fact(item, now=now, source="user_observation", settings=self.s)
            if fact is None:
                raise ActorFailure("bad_fact", f"facts[{index}] has no usable text", 422)
            source = item.get("source") if isinstance(item, dict) else None
            if source is not None:
                fact = msgspec.structs.replace(fact, source_ref=source)
            new.append(fact)
        added, skipped = self.store.add_facts(new)
        _answer(msg.reply, ImportAnswer(added=[f.id for f in added], skipped_duplicates=skipped + (len(new) - len(added) - skipped)))

    @handles(ListEntries)
    def on_ListEntries(self, msg: ListEntries) -> None:
        facts, archive = self.store.facts, self.store.archive
        if msg.status in (None, "active"):
            pool = list(facts.values())
        elif msg.status == "archived":
            pool = list(archive.values())
        elif msg.status == "absorbed":
            pool = [f for f in facts.values() if f.absorbed]
        elif msg.status == "unabsorbed":
            pool = [f for f in facts.values() if not f.absorbed]
        elif msg.status == "all":
            pool = list(facts.values()) + list(archive.values())
        else:
            raise ActorFailure("bad_status", "status must be active, archived, absorbed, unabsorbed or all", 400)
        if msg.entity:
            pool = [f for f in pool if f.entity == msg.entity]
        page = pool[msg.offset : msg.offset + msg.limit]
        _answer(msg.reply, PageAnswer(total=len(pool), offset=msg.offset, items=[msgspec.to_builtins(_public(f)) for f in page]))

    @handles(CountEntries)
    def on_CountEntries(self, msg: CountEntries) -> None:
        _answer(msg.reply, EntryCounts({"facts": len(self.store.facts), "facts_archived": len(self.store.archive)}))

    @handles(BrowseFacts)
    def on_BrowseFacts(self, msg: BrowseFacts) -> None:
        total, page = page_facts(list(self.store.facts.values()), list(self.store.archive.values()), msg.filter, msg.offset, msg.limit)
        items = [{**msgspec.to_builtins(_public(f)), "archived": archived} for f, archived in page]
        _answer(msg.reply, PageAnswer(total=total, offset=msg.offset, items=items))

    @handles(EditEntry)
    def on_EditEntry(self, msg: EditEntry) -> None:
        fact = self.store.facts.get(msg.id)
        if fact is None:
            raise ActorFailure("not_found", f"no active fact {msg.id}", 404)
        changes: dict[str, object] = {}
        if "text" in msg.changes:
            text = edited_text(msg.changes)
            changes["text"] = text
            changes["hash"] = fact_hash(text)
            changes["embedding"] = None
            changes["embedding_text_sha256"] = None
        if "importance" in msg.changes:
            value = msg.changes["importance"]
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 10:
                raise ActorFailure("bad_importance", "importance must be an integer from 1 to 10", 422)
            changes["importance"] = value
        if "entity" in msg.changes:
            if msg.changes["entity"] not in ("master", "neko", "relationship"):
                raise ActorFailure("bad_entity", "entity must be master, neko or relationship", 422)
            changes["entity"] = msg.changes["entity"]
        unknown = set(msg.changes) - {"text", "importance", "entity"}
        if unknown:
            raise ActorFailure("bad_field", f"cannot edit {sorted(unknown)}", 422)
        updated = msgspec.structs.replace(fact, **changes)
        self.store.record("fact.updated", {"fact": msgspec.to_builtins(updated)})
        self.store.dedup.add(updated)
        self.ports.index_upsert([fact_index_entry(updated, "fact")])
        _answer(msg.reply, EntryAnswer(entry=msgspec.to_builtins(_public(updated))))

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        store = self.store
        if msg.id not in store.facts and msg.id not in store.archive:
            raise ActorFailure("not_found", f"no fact {msg.id}", 404)
        fact = store.facts.get(msg.id) or store.archive[msg.id]
        store.record("fact.deleted", {"id": msg.id})
        store.dedup.remove(msg.id)
        self.ports.send(RECALL, IndexRemove(ids=[msg.id]))
        store.views.erase([msg.id], [fact.text], None, msg.reply, DeleteAnswer(deleted=msg.id))
