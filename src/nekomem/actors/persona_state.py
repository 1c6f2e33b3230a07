"""The state half of PersonaActor: persona.json, persona_corrections.json and the
persona_archive/ shards in memory, the journaled changes to them, the archive sweep and
the queue of corrections (contradictions resolved one at a time by ``resolve_correction``
behind a gate with backoff).
"""

from __future__ import annotations

from typing import Any

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.journaled import JournaledActor
from nekomem.actors.messages import CorrectionResolved, ModelDone, ScrubTexts
from nekomem.domain import persona as pl
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain.gates import task_gate
from nekomem.domain.records import (
    Correction,
    Persona,
    PersonaEntry,
    assign_shards,
    new_shard_suffix,
    persona_from_disk,
    persona_to_disk,
)
from nekomem.domain.tokens import get_counter
from nekomem.stores.atomic import atomic_write_json, keep_rejected, read_json, read_records, shard_counts
from nekomem.stores.journal import Event


def entry_from(obj: Any) -> PersonaEntry:
    return msgspec.convert(obj, PersonaEntry, strict=False)


class PersonaState(JournaledActor):
    """Persona entries and corrections in memory, their journal, the sweep and the corrections queue."""

    def load_views(self) -> None:
        self.s = self.ctx.settings.longterm
        self.counter = get_counter(self.ctx.settings.recent.recent_tokenizer_encoding)
        raw = self.read_view(self.ctx.paths.persona, default={})
        rejected: list[Any] = []
        self.persona: Persona = pl.ensure_sections(persona_from_disk(raw, rejected))
        if rejected:
            keep_rejected(self.ctx.paths.persona, rejected, "persona entries")
        self.corrections, rejected_corrections = read_records(
            self.ctx.paths.persona_corrections, lambda item: msgspec.convert(item, Correction, strict=False), "corrections"
        )
        self._dirty += len(rejected) + rejected_corrections  # rewrite the views once, without what was kept aside
        self.archived_pending: dict[str, list[dict[str, Any]]] = {}
        self.correction_inflight = False
        self.correction_gate = task_gate(self.s, self.s.longterm_idle_maintenance_interval_seconds)
        mono = self.ctx.clock.monotonic()
        self.next_sweep = mono + self.s.evidence_archive_sweep_initial_delay_seconds
        self.next_corrections = mono + self.s.longterm_idle_maintenance_initial_delay_seconds

    def write_views(self) -> None:
        atomic_write_json(self.ctx.paths.persona, persona_to_disk(self.persona))
        atomic_write_json(self.ctx.paths.persona_corrections, self.corrections)
        for shard, entries in self.archived_pending.items():
            path = self.ctx.paths.persona_archive_dir / shard
            existing, _ = read_json(path, default=[])
            existing = existing if isinstance(existing, list) else []
            known = {e.get("entry", {}).get("id") for e in existing if isinstance(e, dict)}
            existing.extend(e for e in entries if e["entry"]["id"] not in known)
            atomic_write_json(path, existing)
        self.archived_pending.clear()

    def apply_event(self, event: Event) -> None:
        p = event.payload
        if event.type in (
            "persona.fact_added",
            "persona.entry_updated",
            "persona.evidence_updated",
            "persona.fact_mentioned",
            "persona.suppressed",
        ):
            entity = p["entity"]
            entry = entry_from(p["entry"])
            self._remove(entry.id)
            if p.get("archive_shard"):
                self.archived_pending.setdefault(p["archive_shard"], []).append({"entity": entity, "entry": p["entry"]})
                return
            section = list(self.persona.get(entity, []))
            index = p.get("index")
            if isinstance(index, int) and 0 <= index <= len(section):
                section.insert(index, entry)
            else:
                section.append(entry)
            self.persona[entity] = section
        elif event.type == "persona.entry_deleted":
            self._remove(p["id"])
        elif event.type in ("correction.queued", "correction.resolved"):
            self.corrections = [msgspec.convert(c, Correction, strict=False) for c in p["corrections"]]

    def _remove(self, entry_id: str) -> None:
        for entity, entries in self.persona.items():
            if any(e.id == entry_id for e in entries):
                self.persona[entity] = [e for e in entries if e.id != entry_id]

    # -- helpers ---------------------------------------------------------------------
    def commit(self, new: Persona, corrections: list[Correction] | None = None, type: str = "persona.entry_updated") -> list[str]:
        """Journal the difference between the current persona and ``new``; returns changed ids."""
        old_entries = {e.id: (entity, e) for entity, entries in self.persona.items() for e in entries}
        items: list[tuple[str, dict[str, Any]]] = []
        changed: list[str] = []
        seen: set[str] = set()
        for entity, entries in new.items():
            for index, entry in enumerate(entries):
                seen.add(entry.id)
                before = old_entries.get(entry.id)
                if before is None or before[0] != entity or msgspec.to_builtins(before[1]) != msgspec.to_builtins(entry):
                    kind = "persona.fact_added" if before is None else type
                    items.append((kind, {"entity": entity, "entry": msgspec.to_builtins(entry), "index": index}))
                    changed.append(entry.id)
        for entry_id in old_entries:
            if entry_id not in seen:
                items.append(("persona.entry_deleted", {"id": entry_id}))
                changed.append(entry_id)
        if corrections is not None and msgspec.to_builtins(corrections) != msgspec.to_builtins(self.corrections):
            items.append(("correction.queued", {"corrections": msgspec.to_builtins(corrections)}))
        self.record_many(items)
        for entity in new:
            self.persona.setdefault(entity, [])
        return changed

    def forget_corrections_of(self, texts: list[str]) -> bool:
        """An erasure: queued corrections that hold one of ``texts`` go too (journaled);
        True when some went."""
        from nekomem.stores.erasure import mentions

        kept = [c for c in self.corrections if not mentions(msgspec.to_builtins(c), texts)]
        if len(kept) == len(self.corrections):
            return False
        self.record("correction.queued", {"corrections": msgspec.to_builtins(kept)})
        return True

    @handles(ScrubTexts)
    def on_ScrubTexts(self, msg: ScrubTexts) -> None:
        """Another layer's erasure: queued corrections quoting its text go (and their
        journal events), then the outbox scrubs its copies and answers."""
        if self.forget_corrections_of(msg.texts):
            self.erase([], msg.texts, None, msg.reply, msg.reply_value)
        else:
            self.ctx.send("outbox", msg)

    def find(self, entry_id: str) -> tuple[str, PersonaEntry] | None:
        return pl.find_entry(self.persona, entry_id)

    # -- archive sweep and corrections ----------------------------------------------
    def sweep(self) -> dict[str, int]:
        now = self.now()
        result = pl.persona_archive_sweep(self.persona, now, self.s)
        if result.archived:
            counts = shard_counts(self.ctx.paths.persona_archive_dir, self.archived_pending)
            shards = assign_shards(counts, len(result.archived), now.date(), new_shard_suffix, self.s.evidence_archive_shard_max_entries)
            items = [
                ("persona.entry_updated", {"entity": entity, "entry": msgspec.to_builtins(entry), "archive_shard": shard})
                for (entity, entry), shard in zip(result.archived, shards, strict=False)
            ]
            self.record_many(items)
        archived_ids = {entry.id for _e, entry in result.archived}
        remaining = {k: [e for e in v if e.id not in archived_ids] for k, v in result.persona.items()}
        self.commit(remaining, type="persona.evidence_updated")
        return {"archived": len(result.archived), "counted": len(result.counted)}

    def _resolve_corrections(self) -> None:
        if self.correction_inflight or not self.corrections or not self.powerful():
            return
        if self.correction_gate.blocked(self.ctx.clock.monotonic()):
            return
        batch = pl.correction_batch(self.corrections, self.s)
        if not batch:
            return
        item = batch[0]
        messages = prompts.resolve_correction_messages(item, **self.names())
        token = self.ask_model(
            "correction", "resolve_correction", messages, context={"item": item}, timeout=self.s.longterm_correction_timeout_seconds
        )
        self.correction_inflight = token is not None
        if token is not None:
            self.correction_gate.start()

    def done_correction(self, msg: ModelDone) -> None:
        self.correction_inflight = False
        item = msg.context["item"]
        outcome = (
            None if msg.error is not None else pl.apply_correction(self.persona, self.corrections, item, msg.output, self.now(), self.s)
        )
        if outcome is None or outcome.kind == "invalid":
            self.correction_gate.failed_at(self.ctx.clock.monotonic())
            corrections, _dead = pl.record_correction_failure(self.corrections, item, self.s)
            self.commit(pl.copy_persona(self.persona), corrections)
            return
        self.correction_gate.answered_at(self.ctx.clock.monotonic())
        self.commit(outcome.persona, outcome.corrections)
        if outcome.source_id:
            self.ctx.send("reflections", CorrectionResolved(reflection_id=outcome.source_id, kind=outcome.kind))
