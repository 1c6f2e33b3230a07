"""FactActor: facts.json and facts_archive.json.

Post-turn work arrives from the outbox as RunOp. With powerful memory on, turns are
buffered and extracted in batches (``fact_extract_every_n_turns`` user turns, or
``fact_extract_interval_minutes`` since the last check, or idle); the outbox records stay
open until their turns were extracted, so a crash replays them. Off, each turn batch is
extracted on its own. Extracted facts are deduplicated (exact hash, lexical near-duplicate)
before they are journaled. This actor also picks the facts of each reflection synthesis.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import msgspec

from nekomem.actors.fact_state import fact_index_entry
from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    AbsorbFacts,
    BacklogMined,
    BrowseFacts,
    DeleteEntry,
    EditEntry,
    ImportFacts,
    IndexRemove,
    ListEntries,
    ModelDone,
    NewFacts,
    OpFinished,
    OpParked,
    RecallAnswer,
    ReflectNow,
    RunOp,
    SignalsProcessed,
    Synthesize,
    Tick,
)
from nekomem.actors.self_disclosure import SelfDisclosure
from nekomem.domain import facts as fl
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain import reflections as rl
from nekomem.domain.records import Fact, fact_hash, fact_id
from nekomem.domain.subjects import is_private
from nekomem.domain.turns import Turn, from_disk, parse_timestamp
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.fact_backlog import backlog_last_row

log = logging.getLogger(__name__)

_DECODE = msgspec.json.Decoder()


class FactActor(SelfDisclosure):
    child_name = "facts"
    owner = "facts"

    # -- post-turn work --------------------------------------------------------------
    @handles(RunOp)
    def on_RunOp(self, msg: RunOp) -> None:
        turns = msg.turns
        if turns is None:
            turns = [t for t in (from_disk(m) for m in msg.payload.get("messages", [])) if t is not None]
        backlog = backlog_last_row(msg.payload)
        if backlog is not None:
            # A batch of the fact backlog (announced when stored): recent hears when it is mined.
            self.backlog_ops[msg.op_id] = backlog
        elif msg.attempt == 1 and turns:
            self.announce_stored_turns(turns)
        user_turns = [t for t in turns if t.role == "human"]
        if not user_turns or not self.model_available("extract_facts"):
            # Nothing a fact can come from, or no summary tier: the step is skipped
            # (reported by /health) and the record is finished.
            self._op_done(msg.op_id)
            return
        if self.powerful() or msg.op_id in self.queue:
            self.queue.add(msg.op_id, turns, self.now(), backlog=msg.op_id in self.backlog_ops)
            # Held for a batch: free the outbox slot so the records behind it arrive.
            self.ctx.send("outbox", OpParked(op_id=msg.op_id))
            self._maybe_extract()
        else:
            self._extract("single", [(msg.op_id, turns)])

    def _op_done(self, op_id: str) -> None:
        """Finish a post-turn record; for a batch of the fact backlog, tell recent it is mined."""
        self.ctx.send("outbox", OpFinished(op_id=op_id, ok=True))
        self.queue.finished(op_id)
        row = self.backlog_ops.pop(op_id, None)
        if row is not None:
            self.ctx.send("recent", BacklogMined(row=row))

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
            "extract",
            "extract_facts",
            messages,
            context={"mode": mode, "ops": ops, "trigger": trigger},
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
            self._op_done(op_id)
        if added and self.powerful():
            self.ctx.send("reflections", NewFacts(facts=added))
        self.path_a_done([t for _op, ts in ops for t in ts], batch=ctx["mode"] == "batch")
        self._maybe_extract()

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
        disclose = self.disclosure_wait(now, mono)
        if disclose is not None:
            due.append(disclose)
        if self.dup_queue and not self.dup_inflight and self.model_available("judge_duplicates"):
            fresh = len(self.dup_queue) != getattr(self, "_dups_tried", (0, 0.0))[0]
            retry = mono if fresh else self._dups_tried[1] + self.s.longterm_idle_maintenance_interval_seconds
            due.append(max(retry, self.dup_gate.not_before))
        return min(due)

    def _extract_wait(self, now: datetime) -> float | None:
        """Seconds until a batch extraction is due and its gate is open (0: now); None
        when nothing waits, one is in flight, or no model can run it."""
        if self.extract_inflight is not None or not self.model_available("extract_facts"):
            return None
        return self.queue.wait_seconds(now, max(0.0, self.extract_gate.not_before - self.ctx.clock.monotonic()))

    def tick(self, msg: Tick) -> None:
        self._maybe_extract()
        self.maybe_disclose()
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
                self.index_upsert([fact_index_entry(self.archive[i], "fact_archive") for i in ids])

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
        self.index_upsert([fact_index_entry(updated, "fact")])
        msg.reply.ok(msgspec.to_builtins(_public(updated)))

    @handles(DeleteEntry)
    def on_DeleteEntry(self, msg: DeleteEntry) -> None:
        if msg.id not in self.facts and msg.id not in self.archive:
            raise ActorFailure("not_found", f"no fact {msg.id}", 404)
        fact = self.facts.get(msg.id) or self.archive[msg.id]
        self.record("fact.deleted", {"id": msg.id})
        self.dedup.remove(msg.id)
        self.ctx.send("recall", IndexRemove(ids=[msg.id]))
        self.erase([msg.id], [fact.text], None, msg.reply, {"deleted": msg.id})


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
