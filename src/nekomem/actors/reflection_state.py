"""The state half of ReflectionActor: reflections.json, surfaced.json and the archive
shards in memory, the journaled changes to them, the recall index feed and the promotion
pass the other halves start.

Every transition is a journaled event carrying the reflection's full snapshot, so applying
it twice leaves the same state.
"""

from __future__ import annotations

import random

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.journaled import JournaledActor
from nekomem.actors.messages import (
    IndexEntry,
    Promote,
    Report,
    RequestIndex,
    VectorsComputed,
)
from nekomem.domain import reflections as rl
from nekomem.domain.gates import task_gate
from nekomem.domain.records import Fact, Reflection, SurfacedEntry
from nekomem.domain.reflections.views import (
    index_entry,
    public_view,
)
from nekomem.domain.tokens import get_counter
from nekomem.runtime.reply import Reply
from nekomem.stores.archive_shards import append_to_shard
from nekomem.stores.atomic import atomic_write_json, read_records
from nekomem.stores.cursors import Cursors
from nekomem.stores.journal import Event


def ref_from(obj: object) -> Reflection:
    return msgspec.convert(obj, Reflection, strict=False)


def _id_of(item: object) -> object:
    return item.get("id") if isinstance(item, dict) else None


class ReflectionState(JournaledActor):
    """Reflections in memory, their journal and their recall entries."""

    def load_views(self) -> None:
        self.s = self.ctx.settings.longterm
        self.counter = get_counter(self.ctx.settings.recent.recent_tokenizer_encoding)
        self.refs: dict[str, Reflection] = {}
        refs, rejected = read_records(self.ctx.paths.reflections, ref_from, "reflections", on_corrupt=self.note_corrupt)
        self.refs.update((ref.id, ref) for ref in refs)
        self.surfaced, rejected_surfaced = read_records(
            self.ctx.paths.surfaced, lambda item: msgspec.convert(item, SurfacedEntry, strict=False), "surfaced entries"
        )
        self._dirty += rejected + rejected_surfaced  # rewrite the views once, without what was kept aside
        self.archived_pending: dict[str, list[Reflection]] = {}  # shard -> entries not yet written
        self.backoff: dict[str, rl.SynthBackoff] = {}
        self._stage2_pending: dict[str, list[Fact]] = {}
        self.rng = random.Random()
        mono = self.ctx.clock.monotonic()
        self.next_promote = mono + self.s.reflection_auto_promote_initial_delay_seconds
        self.next_sweep = mono + self.s.evidence_archive_sweep_initial_delay_seconds
        self.next_rebuttal = mono + self.s.reflection_rebuttal_initial_delay_seconds
        self.rebuttal_inflight = False
        self.rebuttal_failures = 0
        self.rebuttal_gate = task_gate(self.s)
        self.synth_gate = task_gate(self.s)  # background synthesis: not the same batch twice
        self.cursors = Cursors(self.ctx.paths.cursors)

    def after_load(self) -> None:
        self.send_index()

    @handles(RequestIndex)
    def on_RequestIndex(self, msg: RequestIndex) -> None:
        """A restarted RecallActor lost its index: send the complete set again."""
        self.send_index()

    def send_index(self) -> None:
        entries = [self.index_entry(r) for r in self.refs.values()]
        self._searchable = {e.id: e.searchable for e in entries}
        self.index_upsert(entries, replace_tier="reflection")

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
            self.index_upsert(changed)

    def write_views(self) -> None:
        atomic_write_json(self.ctx.paths.reflections, list(self.refs.values()))
        atomic_write_json(self.ctx.paths.surfaced, self.surfaced)
        for shard, entries in self.archived_pending.items():
            append_to_shard(self.ctx.paths.reflection_archive_dir / shard, msgspec.to_builtins(entries), _id_of)
        self.archived_pending.clear()

    def apply_event(self, event: Event) -> None:
        p = event.payload
        if "reflection" in p:
            ref = ref_from(p["reflection"])
            if event.type == "reflection.synthesized" and ref.id in self.refs:
                return
            if p.get("archive_shard"):
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
        return index_entry(ref, self.now(), self.s)

    @handles(VectorsComputed)
    def on_VectorsComputed(self, msg: VectorsComputed) -> None:
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
        self.index_upsert(entries)

    def save_changed(self, new_list: list[Reflection], changed_ids: list[str], type: str = "reflection.state_changed") -> None:
        by_id = {r.id: r for r in new_list}
        self.save([by_id[i] for i in changed_ids if i in by_id], type)

    def _promotion_pass(self, report: Report | None, reply: Reply | None) -> None:
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
            if reply is not None:
                reply.ok(report)

    def public(self, ref: Reflection) -> dict[str, object]:
        return public_view(ref, self.now(), self.s)
