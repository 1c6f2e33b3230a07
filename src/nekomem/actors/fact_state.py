"""The state half of FactActor: facts.json and facts_archive.json in memory, the
journaled changes to them, the recall index feed and the duplicate-judgment queue
(paraphrase pairs found once RecallActor has computed vectors, judged in batches by
``judge_duplicates`` behind a gate with backoff).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime
from typing import Any

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.journaled import JournaledActor
from nekomem.actors.messages import (
    IndexEntry,
    IndexRemove,
    ModelDone,
    ReclaimParked,
    RequestIndex,
    ScrubTexts,
    VectorsComputed,
)
from nekomem.actors.scoped_facts import ScopedFactsMixin
from nekomem.domain import fact_dedup as fd
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain.dedup_index import DedupIndex
from nekomem.domain.extraction import ExtractionQueue
from nekomem.domain.gates import task_gate
from nekomem.domain.opaque import clip_opaque
from nekomem.domain.records import Fact
from nekomem.domain.subjects import is_private, same_corpus
from nekomem.stores.atomic import atomic_write_json, read_records
from nekomem.stores.journal import Event

log = logging.getLogger(__name__)


def fact_from(obj: Any, max_depth: int = 8, max_bytes: int = 4096) -> Fact:
    """A Fact from its stored form. An opaque field over the bounds (a record poisoned
    before the bounds existed) is dropped, so one record cannot break every read."""
    fact = msgspec.convert(obj, Fact, strict=False)
    source_ref, clipped_source = clip_opaque(fact.source_ref, max_depth=max_depth, max_bytes=max_bytes)
    when_raw, clipped_when = clip_opaque(fact.event_when_raw, max_depth=max_depth, max_bytes=max_bytes)
    if clipped_source or clipped_when:
        log.warning("dropped an oversized opaque field of fact %s", fact.id)
        fact = msgspec.structs.replace(fact, source_ref=source_ref, event_when_raw=when_raw)
    return fact


def fact_index_entry(fact: Fact, tier: str) -> IndexEntry:
    return IndexEntry(
        id=fact.id,
        tier=tier,
        text=fact.text,
        entity=fact.entity,
        created_at=fact.created_at or None,
        event_start_at=fact.event_start_at,
        event_end_at=fact.event_end_at,
        importance=fact.importance,
        searchable=bool(fact.text.strip()),
        vector=fact.embedding if isinstance(fact.embedding, str) else None,
        vector_model=fact.embedding_model_id,
        text_sha256=fact.embedding_text_sha256,
        subject_kind=fact.subject_kind,
        subject_id=fact.subject_id,
        scope=fact.scope,
    )


class FactState(ScopedFactsMixin, JournaledActor):
    """Facts in memory, their journal, their recall entries and the duplicate judgments."""

    # -- state -----------------------------------------------------------------------
    def load_views(self) -> None:
        self.s = self.ctx.settings.longterm
        self.facts: dict[str, Fact] = {}
        self.archive: dict[str, Fact] = {}
        for path, target in ((self.ctx.paths.facts, self.facts), (self.ctx.paths.facts_archive, self.archive)):
            facts, rejected = read_records(path, self.fact_from, "facts", on_corrupt=self.note_corrupt)
            for fact in facts:
                target[fact.id] = fact
            self._dirty += rejected  # rewrite the view once, without what was kept aside
        self.dedup = DedupIndex(self.s.fact_near_dup_jaccard_threshold, self.s.fact_near_dup_max_candidates)
        self.queue = ExtractionQueue(self.s)  # records waiting for path A
        self.backlog_ops: dict[str, int] = {}  # op_id -> last row, of fact-backlog batches
        self.last_archive_at: datetime | None = None
        self.extract_inflight: int | None = None
        # A failed batch stays parked and is retried after a backoff (as the reference's
        # cursor stays put): a model outage delays extraction but never dead-letters turns.
        self.extract_gate = task_gate(self.s)
        self._synth_pending: dict[str, tuple[Any, Any, Any]] = {}
        self._paraphrase_todo: set[str] = set()
        self.dup_queue: list[Any] = []  # DedupPair awaiting judge_duplicates (a cache: rebuilt as facts arrive)
        self.dup_inflight = False
        self.dup_gate = task_gate(self.s, self.s.longterm_idle_maintenance_interval_seconds)
        self.next_synthesis = self.ctx.clock.monotonic() + self.s.reflection_synthesis_initial_delay_seconds

    def fact_from(self, obj: Any) -> Fact:
        server = self.ctx.settings.server
        return fact_from(obj, server.opaque_max_depth, server.opaque_max_bytes)

    def after_load(self) -> None:
        # Records parked in a previous instance's batch were lost with it.
        self.ctx.send("outbox", ReclaimParked(child=self.child_name))
        # Only the private corpus dedups private extraction: a group's fact must not hide
        # the owner's own (scoped facts dedup within their subject, see scoped_facts).
        for fact in list(self.facts.values()) + list(self.archive.values()):
            if is_private(fact):
                self.dedup.add(fact)
        self.send_index()

    @handles(ScrubTexts)
    def on_ScrubTexts(self, msg: ScrubTexts) -> None:
        """A turn erasure: its text leaves the extraction batch waiting here (a batch
        already with the model cannot be called back), then the outbox scrubs its copies
        and answers."""
        if self.queue.drop_texts(msg.texts):
            self.log.info("erasure: forgotten turns left the extraction queue")
        self.ctx.send("outbox", msg)

    @handles(RequestIndex)
    def on_RequestIndex(self, msg: RequestIndex) -> None:
        """A restarted RecallActor lost its index: send the complete set again."""
        self.send_index()

    def send_index(self) -> None:
        entries = [fact_index_entry(f, "fact") for f in self.facts.values()]
        entries += [fact_index_entry(f, "fact_archive") for f in self.archive.values()]
        self.index_upsert(entries, replace_tier="fact")

    def write_views(self) -> None:
        atomic_write_json(self.ctx.paths.facts, list(self.facts.values()))
        atomic_write_json(self.ctx.paths.facts_archive, list(self.archive.values()))

    def apply_event(self, event: Event) -> None:
        p = event.payload
        if event.type == "fact.added" or event.type == "fact.updated":
            fact = self.fact_from(p["fact"])
            if event.type == "fact.added" and fact.id in self.archive:
                return
            self.facts[fact.id] = fact
        elif event.type == "fact.absorbed":
            for fid in p.get("ids", []):
                fact = self.facts.get(fid)
                if fact is not None and not fact.absorbed:
                    self.facts[fid] = msgspec.structs.replace(fact, absorbed=True)
        elif event.type == "fact.archived":
            for fid in p.get("ids", []):
                fact = self.facts.pop(fid, None)
                if fact is not None:
                    self.archive[fid] = fact
        elif event.type == "fact.deleted":
            fid = p.get("id")
            self.facts.pop(fid, None)
            self.archive.pop(fid, None)

    # -- helpers ---------------------------------------------------------------------
    def add_facts(self, new: list[Fact]) -> tuple[list[Fact], int]:
        """Dedup ``new`` against the store and journal what is left; returns (added, skipped)."""
        outcome = self.dedup.dedup(new)
        items: list[tuple[str, dict[str, Any]]] = [("fact.added", {"fact": msgspec.to_builtins(f)}) for f in outcome.accepted]
        items += [("fact.updated", {"fact": msgspec.to_builtins(f)}) for f in outcome.upgraded]
        self.record_many(items)
        changed = outcome.accepted + outcome.upgraded
        embeddings = self.ctx.services.embeddings
        if embeddings is not None and getattr(embeddings, "state", "") != "disabled":
            # Checked for paraphrases once RecallActor has computed their vectors.
            self._paraphrase_todo.update(f.id for f in outcome.accepted)
        if changed:
            self.index_upsert([fact_index_entry(self.facts[f.id], "fact") for f in changed if f.id in self.facts])
        skipped = len(outcome.skipped_exact) + len(outcome.skipped_near)
        if outcome.accepted:
            self.log.info("stored %d new facts (%d duplicates skipped)", len(outcome.accepted), skipped)
        return outcome.accepted, skipped

    # -- duplicate judgments ---------------------------------------------------------
    @handles(VectorsComputed)
    def on_VectorsComputed(self, msg: VectorsComputed) -> None:
        # Vectors are a cache: stored on the entries at the next view write, not journaled.
        for fid, (vector, model, sha) in msg.vectors.items():
            for store in (self.facts, self.archive):
                fact = store.get(fid)
                if fact is not None and hashlib.sha256(fact.text.encode()).hexdigest() == sha:
                    store[fid] = msgspec.structs.replace(fact, embedding=vector, embedding_model_id=model, embedding_text_sha256=sha)
        self._dirty = max(self._dirty, 1) if msg.vectors else self._dirty
        from nekomem.actors.messages import RelatedFacts

        for fid in [f for f in msg.vectors if f in self._paraphrase_todo]:
            self._paraphrase_todo.discard(fid)
            fact = self.facts.get(fid)
            if fact is None or not self.powerful():
                continue
            self.ctx.send(
                "recall",
                RelatedFacts(
                    query_texts=[fact.text],
                    per_query_k=self.s.fact_dedup_pairs_per_new + 1,
                    cap=self.s.fact_dedup_pairs_per_new + 1,
                    reply_child="facts",
                    tag="dup-" + fid,
                    tiers=["fact"],
                    exclude_ids=[fid],
                ),
            )

    def _paraphrase_candidates(self, fid: str, neighbour_ids: list[str]) -> None:
        from nekomem.domain.vector_codec import try_decode

        fact = self.facts.get(fid)
        dim = getattr(self.ctx.services.embeddings, "dim", None)
        if fact is None or not isinstance(fact.embedding, str) or not dim:
            return
        mine = try_decode(fact.embedding, dim)
        if mine is None:
            return
        scored = []
        for nid in neighbour_ids:
            other = self.facts.get(nid)
            if (
                other is None
                or not same_corpus(other, fact)
                or not isinstance(other.embedding, str)
                or other.embedding_model_id != fact.embedding_model_id
            ):
                continue
            vec = try_decode(other.embedding, dim)
            if vec is not None and vec.shape == mine.shape:
                scored.append((other, float(mine @ vec)))
        pairs = fd.paraphrase_pairs(fact, scored, self.now(), self.s)
        if pairs:
            self.dup_queue = fd.enqueue_pairs(self.dup_queue, pairs)
            self.log.info("queued %d paraphrase pairs for judge_duplicates", len(pairs))

    def _judge_duplicates(self) -> None:
        if self.dup_inflight or not self.dup_queue or not self.powerful():
            return
        batch = fd.dedup_batch(self.dup_queue, self.s)
        if not batch or self.dup_gate.blocked(self.ctx.clock.monotonic()):
            return
        messages = prompts.judge_duplicates_messages(batch, **self.names())
        token = self.ask_model(
            "dups", "judge_duplicates", messages, context={"batch": batch}, timeout=self.s.longterm_dedup_timeout_seconds
        )
        self.dup_inflight = token is not None
        if token is not None:
            self.dup_gate.start()

    def done_dups(self, msg: ModelDone) -> None:
        self.dup_inflight = False
        batch = msg.context["batch"]
        if msg.error is not None:
            self.dup_queue, _dropped = fd.record_dedup_failure(self.dup_queue, batch, self.s)
            self.dup_gate.failed_at(self.ctx.clock.monotonic())
            return
        result = fd.apply_duplicate_decisions(list(self.facts.values()), self.dup_queue, batch, msg.output, self.s)
        self.dup_queue = list(result.queue)
        if result.decided:
            self.dup_gate.answered_at(self.ctx.clock.monotonic())
        else:  # no usable decision: counted as a failure of the batch
            self.dup_gate.failed_at(self.ctx.clock.monotonic())
        by_id = {f.id: f for f in result.facts}
        items: list[tuple[str, dict[str, Any]]] = [("fact.deleted", {"id": i}) for i in result.removed_ids]
        items += [("fact.updated", {"fact": msgspec.to_builtins(by_id[i])}) for i in result.changed_ids if i in by_id]
        self.record_many(items)
        for i in result.removed_ids:
            self.dedup.remove(i)
        if result.removed_ids:
            self.ctx.send("recall", IndexRemove(ids=list(result.removed_ids)))
        changed = [by_id[i] for i in result.changed_ids if i in by_id]
        for fact in changed:
            self.dedup.add(fact)
        if changed:
            self.index_upsert([fact_index_entry(f, "fact") for f in changed])
        self.log.info("judge_duplicates: %d removed, %d rewritten", len(result.removed_ids), len(result.changed_ids))
