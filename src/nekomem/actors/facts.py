"""FactActor: facts.json and facts_archive.json.

Post-turn work arrives from the outbox as RunOp. With powerful memory on, turns are
buffered and extracted in batches (``fact_extract_every_n_turns`` user turns, or
``fact_extract_interval_minutes`` since the last check, or idle); the outbox records stay
open until their turns were extracted, so a crash replays them. Off, each turn batch is
extracted on its own. Extracted facts are deduplicated (exact hash, lexical near-duplicate)
before they are journaled. This actor also picks the facts of each reflection synthesis.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, timedelta
from typing import Any

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.journaled import JournaledActor
from nekomem.actors.messages import (
    AbsorbFacts,
    BrowseFacts,
    DeleteEntry,
    EditEntry,
    ImportFacts,
    IndexEntry,
    IndexRemove,
    IndexUpsert,
    ListEntries,
    ModelDone,
    NewFacts,
    OpFinished,
    OpParked,
    PostTurn,
    RecallAnswer,
    ReclaimParked,
    ReflectNow,
    ReplyMentions,
    RequestIndex,
    RunOp,
    SignalsProcessed,
    Synthesize,
    Tick,
    VectorsComputed,
)
from nekomem.actors.scoped_facts import ScopedFactsMixin
from nekomem.domain import facts as fl
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain import reflections as rl
from nekomem.domain.dedup_index import DedupIndex
from nekomem.domain.extraction import ExtractionQueue
from nekomem.domain.gates import task_gate
from nekomem.domain.opaque import clip_opaque
from nekomem.domain.records import Fact, fact_hash, fact_id
from nekomem.domain.subjects import is_private, same_corpus
from nekomem.domain.turns import Turn, from_disk, parse_timestamp
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.atomic import atomic_write_json, read_records
from nekomem.stores.journal import Event

log = logging.getLogger(__name__)

_DECODE = msgspec.json.Decoder()


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


class FactActor(ScopedFactsMixin, JournaledActor):
    child_name = "facts"
    owner = "facts"

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
        self.last_archive_at: datetime | None = None
        self.passes_since_disclosure = 0
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

    @handles(RequestIndex)
    def on_RequestIndex(self, msg: RequestIndex) -> None:
        """A restarted RecallActor lost its index: send the complete set again."""
        self.send_index()

    def send_index(self) -> None:
        entries = [fact_index_entry(f, "fact") for f in self.facts.values()]
        entries += [fact_index_entry(f, "fact_archive") for f in self.archive.values()]
        self.ctx.send("recall", IndexUpsert(entries=entries, replace_tier="fact"))

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
            self.ctx.send("recall", IndexUpsert(entries=[fact_index_entry(self.facts[f.id], "fact") for f in changed if f.id in self.facts]))
        skipped = len(outcome.skipped_exact) + len(outcome.skipped_near)
        if outcome.accepted:
            self.log.info("stored %d new facts (%d duplicates skipped)", len(outcome.accepted), skipped)
        return outcome.accepted, skipped

    # -- post-turn work --------------------------------------------------------------
    @handles(RunOp)
    def on_RunOp(self, msg: RunOp) -> None:
        turns = [t for t in (from_disk(m) for m in msg.payload.get("messages", [])) if t is not None]
        if msg.attempt == 1 and turns:
            self.ctx.send("reflections", PostTurn(turns=turns))
            ai = [t.text for t in turns if t.role == "ai"]
            if ai:
                self.ctx.send("persona", ReplyMentions(text=ai[-1]))
                self.ctx.send("reflections", ReplyMentions(text=ai[-1]))
        user_turns = [t for t in turns if t.role == "human"]
        if not user_turns or not self.model_available("extract_facts"):
            # Nothing a fact can come from, or no summary tier: the step is skipped
            # (reported by /health) and the record is finished.
            self.ctx.send("outbox", OpFinished(op_id=msg.op_id, ok=True))
            return
        if self.powerful() or msg.op_id in self.queue:
            self.queue.add(msg.op_id, turns, self.now())
            # Held for a batch: free the outbox slot so the records behind it arrive.
            self.ctx.send("outbox", OpParked(op_id=msg.op_id))
            self._maybe_extract()
        else:
            self._extract("single", [(msg.op_id, turns)])

    def _maybe_extract(self) -> None:
        if self.extract_inflight is not None or self.extract_gate.blocked(self.ctx.clock.monotonic()):
            return
        trigger = self.queue.due(self.now())
        if trigger is not None:
            batch = self.queue.take(trigger)
            self.log.info("batch extraction (%s): %d records", trigger, len(batch))
            self._extract("batch", batch, trigger)

    def _extract(self, mode: str, ops: list[tuple[str, list[Turn]]], trigger: str = "") -> None:
        turns = [t for _op, ts in ops for t in ts]
        messages = prompts.extract_facts_messages(turns, now=self.now(), **self.names())
        token = self.ask_model(
            "extract", "extract_facts", messages, context={"mode": mode, "ops": ops, "trigger": trigger},
            timeout=self.s.longterm_extract_timeout_seconds,
        )
        if token is None:
            # Pool full: put the work back; the timer tries again after the retry floor.
            if mode == "batch":
                self.queue.put_back(ops, trigger)
            else:
                for op_id, _ in ops:
                    self.ctx.send("outbox", OpFinished(op_id=op_id, ok=False, error="model pool full"))
            return
        if mode == "batch":
            self.extract_inflight = token
            self.extract_gate.start()

    def done_extract(self, msg: ModelDone) -> None:
        ctx = msg.context
        ops: list[tuple[str, list[Turn]]] = ctx["ops"]
        if ctx["mode"] == "batch":
            self.extract_inflight = None
            mono = self.ctx.clock.monotonic()
            if msg.error is not None:
                delay = self.extract_gate.failed_at(mono)
                self.queue.put_back(ops, ctx["trigger"])
                self.log.warning("batch fact extraction failed (%d records kept); retried in %.0f s", len(ops), delay)
                return
            self.extract_gate.answered_at(mono)
        if msg.error is not None:
            self.log.warning("fact extraction failed; the outbox will retry (%d records)", len(ops))
            for op_id, _ in ops:
                self.ctx.send("outbox", OpFinished(op_id=op_id, ok=False, error=msg.error))
            return
        now = self.now()
        new = fl.normalize_extraction(msg.output, now=now, source="user_observation", settings=self.s)
        new = _with_turn_span(new, [t for _op, ts in ops for t in ts])
        added, _skipped = self.add_facts(new)
        if ctx["mode"] == "batch":
            self.queue.checked(now)
        for op_id, _ in ops:
            self.ctx.send("outbox", OpFinished(op_id=op_id, ok=True))
        if added and self.powerful():
            self.ctx.send("reflections", NewFacts(facts=added))
        if ctx["mode"] == "batch":
            self.passes_since_disclosure += 1
            if fl.self_disclosure_due(self.passes_since_disclosure, self.s):
                self.passes_since_disclosure = 0
                self._self_disclosure([t for _op, ts in ops for t in ts])
        self._maybe_extract()

    def _self_disclosure(self, turns: list[Turn]) -> None:
        if not any(t.role == "ai" for t in turns):
            return
        known = fl.known_pool(self.facts.values(), None, self.now(), self.s)
        messages = prompts.extract_self_disclosure_messages(turns, known, now=self.now(), **self.names())
        self.ask_model("disclosure", "extract_self_disclosure", messages, timeout=self.s.longterm_extract_timeout_seconds)

    def done_disclosure(self, msg: ModelDone) -> None:
        if msg.error is not None:
            self.log.info("self-disclosure pass failed")
            return
        new = fl.normalize_extraction(msg.output, now=self.now(), source="ai_disclosure", settings=self.s)
        self.add_facts(new)

    # -- synthesis -------------------------------------------------------------------
    def _start_synthesis(self, report: dict[str, Any] | None, reply: Any) -> None:
        """Pick the batch, ask RecallActor for related facts (cosine; empty without
        vectors), then hand both to ReflectionActor."""
        from nekomem.actors.messages import RelatedFacts

        batch = rl.synthesis_batch(self.facts.values(), self.s)
        if batch is None:
            if report is not None:
                self.ctx.send("reflections", Synthesize(batch=None, report=report, reply=reply))
            return
        self._synth_seq = getattr(self, "_synth_seq", 0) + 1
        tag = f"synth-{self._synth_seq}"
        self._synth_pending[tag] = (batch, report, reply)
        self.ctx.send(
            "recall",
            RelatedFacts(
                query_texts=[f.text for f in batch.facts],
                per_query_k=self.s.reflection_related_per_query_k,
                cap=self.s.reflection_related_total_cap,
                reply_child="facts",
                tag=tag,
                tiers=["fact", "fact_archive"],
                exclude_ids=list(batch.source_fact_ids),
            ),
        )

    @handles(RecallAnswer)
    def on_RecallAnswer(self, msg: RecallAnswer) -> None:
        if msg.tag.startswith("dup-"):
            self._paraphrase_candidates(msg.tag[4:], msg.ids)
            return
        pending = self._synth_pending.pop(msg.tag, None)
        if pending is None:
            return
        batch, report, reply = pending
        related = [self.facts.get(i) or self.archive.get(i) for i in msg.ids]
        related = [f for f in related if f is not None and is_private(f)]
        self.ctx.send("reflections", Synthesize(batch=batch, related=related, report=report, reply=reply))

    @handles(ReflectNow)
    def on_ReflectNow(self, msg: ReflectNow) -> None:
        self._start_synthesis({}, msg.reply)

    @handles(AbsorbFacts)
    def on_AbsorbFacts(self, msg: AbsorbFacts) -> None:
        ids = [i for i in msg.ids if i in self.facts and not self.facts[i].absorbed]
        if ids:
            self.record("fact.absorbed", {"ids": ids, "reflection_id": msg.reflection_id})

    @handles(SignalsProcessed)
    def on_SignalsProcessed(self, msg: SignalsProcessed) -> None:
        ids = [i for i in msg.fact_ids if i in self.facts and not self.facts[i].signal_processed]
        if ids:
            updated = fl.mark_signal_processed([self.facts[i] for i in ids], ids)
            self.record_many(("fact.updated", {"fact": msgspec.to_builtins(f)}) for f in updated)

    # -- periodic --------------------------------------------------------------------
    def due_at(self) -> float | None:
        """Synthesis, the fact archive move, batch extraction when its trigger comes, and
        duplicate judgments (at once for new pairs, else per idle-maintenance interval)."""
        mono = self.ctx.clock.monotonic()
        now = self.now()
        due = [self.next_synthesis]
        if self.last_archive_at is None:
            due.append(mono)
        else:
            due.append(mono + (self.last_archive_at + timedelta(hours=self.s.fact_archive_cooldown_hours) - now).total_seconds())
        wait = self._extract_wait(now)
        if wait is not None:
            due.append(mono + wait)
        if self.dup_queue and not self.dup_inflight and self.model_available("judge_duplicates"):
            fresh = len(self.dup_queue) != getattr(self, "_dups_tried", (0, 0.0))[0]
            retry = mono if fresh else self._dups_tried[1] + self.s.longterm_idle_maintenance_interval_seconds
            due.append(max(retry, self.dup_gate.not_before))
        return min(due)

    def _extract_wait(self, now: datetime) -> float | None:
        """Seconds until ``self.queue.due`` gives a trigger and the extraction gate is open
        (0: now); None when nothing waits, one is in flight, or no model can run it."""
        q, s = self.queue, self.s
        if self.extract_inflight is not None or not q.ops or not self.model_available("extract_facts"):
            return None
        pending = q.user_turns
        if pending <= 0:
            return None
        gate = max(0.0, self.extract_gate.not_before - self.ctx.clock.monotonic())
        if pending >= s.fact_extract_every_n_turns:
            return gate
        waits: list[float] = []
        if q.last_check_at is not None:
            waits.append((q.last_check_at + timedelta(minutes=s.fact_extract_interval_minutes) - now).total_seconds())
        if q.last_check_at is None or not s.fact_extract_idle_requires_first_run or q.burst_tail:
            idle_from = q.last_activity_at or now
            waits.append((idle_from + timedelta(seconds=s.fact_extract_idle_seconds) - now).total_seconds())
        return max(gate, min(waits)) if waits else None

    def tick(self, msg: Tick) -> None:
        self._maybe_extract()
        if self.dup_queue and not self.dup_inflight:
            self._dups_tried = (len(self.dup_queue), msg.monotonic)
        self._judge_duplicates()
        if msg.monotonic >= self.next_synthesis:
            self.next_synthesis = msg.monotonic + self.s.reflection_synthesis_interval_seconds
            self._start_synthesis(None, None)
        now = self.now()
        split = fl.archive_split(list(self.facts.values()), now, self.last_archive_at, self.s)
        if split is not None:
            self.last_archive_at = now
            _kept, archived = split
            if archived:
                ids = [f.id for f in archived]
                self.record("fact.archived", {"ids": ids})
                self.ctx.send("recall", IndexUpsert(entries=[fact_index_entry(self.archive[i], "fact_archive") for i in ids]))

    # -- API -------------------------------------------------------------------------
    @handles(ImportFacts)
    def on_ImportFacts(self, msg: ImportFacts) -> None:
        now = self.now()
        new: list[Fact] = []
        for index, item in enumerate(msg.facts):
            fact = fl.normalize_fact(item, now=now, source="user_observation", settings=self.s)
            if fact is None:
                raise ActorFailure("bad_fact", f"facts[{index}] has no usable text", 422)
            source = item.get("source") if isinstance(item, dict) else None
            if source is not None:
                fact = msgspec.structs.replace(fact, source_ref=source)
            new.append(fact)
        added, skipped = self.add_facts(new)
        msg.reply.ok({"added": [f.id for f in added], "skipped_duplicates": skipped + (len(new) - len(added) - skipped)})

    @handles(ListEntries)
    def on_ListEntries(self, msg: ListEntries) -> None:
        if msg.status in (None, "active"):
            pool = list(self.facts.values())
        elif msg.status == "archived":
            pool = list(self.archive.values())
        elif msg.status == "absorbed":
            pool = [f for f in self.facts.values() if f.absorbed]
        elif msg.status == "unabsorbed":
            pool = [f for f in self.facts.values() if not f.absorbed]
        elif msg.status == "all":
            pool = list(self.facts.values()) + list(self.archive.values())
        else:
            raise ActorFailure("bad_status", "status must be active, archived, absorbed, unabsorbed or all", 400)
        if msg.entity:
            pool = [f for f in pool if f.entity == msg.entity]
        page = pool[msg.offset : msg.offset + msg.limit]
        msg.reply.ok({"total": len(pool), "offset": msg.offset, "items": [msgspec.to_builtins(_public(f)) for f in page]})

    @handles(BrowseFacts)
    def on_BrowseFacts(self, msg: BrowseFacts) -> None:
        from nekomem.domain.browse import page_facts

        total, page = page_facts(list(self.facts.values()), list(self.archive.values()), msg.filter, msg.offset, msg.limit)
        items = [{**msgspec.to_builtins(_public(f)), "archived": archived} for f, archived in page]
        msg.reply.ok({"total": total, "offset": msg.offset, "items": items})

    @handles(EditEntry)
    def on_EditEntry(self, msg: EditEntry) -> None:
        fact = self.facts.get(msg.id)
        if fact is None:
            raise ActorFailure("not_found", f"no active fact {msg.id}", 404)
        changes: dict[str, Any] = {}
        if "text" in msg.changes:
            changes["text"] = self.edited_text(msg.changes)
            changes["hash"] = fact_hash(changes["text"])
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
        self.record("fact.updated", {"fact": msgspec.to_builtins(updated)})
        self.dedup.add(updated)
        self.ctx.send("recall", IndexUpsert(entries=[fact_index_entry(updated, "fact")]))
        msg.reply.ok(msgspec.to_builtins(_public(updated)))

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        if msg.id not in self.facts and msg.id not in self.archive:
            raise ActorFailure("not_found", f"no fact {msg.id}", 404)
        self.record("fact.deleted", {"id": msg.id})
        self.dedup.remove(msg.id)
        self.ctx.send("recall", IndexRemove(ids=[msg.id]))
        msg.reply.ok({"deleted": msg.id})

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
        from nekomem.recall.vector_codec import try_decode

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
            if other is None or not same_corpus(other, fact) or not isinstance(other.embedding, str) or other.embedding_model_id != fact.embedding_model_id:
                continue
            vec = try_decode(other.embedding, dim)
            if vec is not None and vec.shape == mine.shape:
                scored.append((other, float(mine @ vec)))
        pairs = fl.paraphrase_pairs(fact, scored, self.now(), self.s)
        if pairs:
            self.dup_queue = fl.enqueue_pairs(self.dup_queue, pairs)
            self.log.info("queued %d paraphrase pairs for judge_duplicates", len(pairs))

    def _judge_duplicates(self) -> None:
        if self.dup_inflight or not self.dup_queue or not self.powerful():
            return
        batch = fl.dedup_batch(self.dup_queue, self.s)
        if not batch or self.dup_gate.blocked(self.ctx.clock.monotonic()):
            return
        messages = prompts.judge_duplicates_messages(batch, **self.names())
        token = self.ask_model("dups", "judge_duplicates", messages, context={"batch": batch}, timeout=self.s.longterm_dedup_timeout_seconds)
        self.dup_inflight = token is not None
        if token is not None:
            self.dup_gate.start()

    def done_dups(self, msg: ModelDone) -> None:
        self.dup_inflight = False
        batch = msg.context["batch"]
        if msg.error is not None:
            self.dup_queue, _dropped = fl.record_dedup_failure(self.dup_queue, batch, self.s)
            self.dup_gate.failed_at(self.ctx.clock.monotonic())
            return
        result = fl.apply_duplicate_decisions(list(self.facts.values()), self.dup_queue, batch, msg.output, self.s)
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
            self.ctx.send("recall", IndexUpsert(entries=[fact_index_entry(f, "fact") for f in changed]))
        self.log.info("judge_duplicates: %d removed, %d rewritten", len(result.removed_ids), len(result.changed_ids))


def _with_turn_span(facts: list[Fact], turns: list[Turn]) -> list[Fact]:
    """Tag extracted facts with the time span of the turns they came from (the memory
    browser jumps from a fact to those turns in time_indexed.db)."""
    stamps = sorted(t.ts for t in turns if t.ts)
    if not stamps:
        return facts
    span = {"kind": "turns", "from": stamps[0], "to": stamps[-1]}
    return [f if f.source_ref is not None else msgspec.structs.replace(f, source_ref=span) for f in facts]


def _public(fact: Fact) -> Fact:
    return msgspec.structs.replace(fact, embedding=None)


__all__ = ["FactActor", "fact_index_entry", "fact_id", "parse_timestamp"]
