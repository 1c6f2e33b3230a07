"""The state of the reflections layer: reflections.json, surfaced.json and the archive
shards in memory, the journaled changes to them, the recall index feed and the promotion
pass the other parts of the layer start.

Every transition is a journaled event carrying the reflection's full snapshot, so applying
it twice leaves the same state.
"""

from __future__ import annotations

import hashlib
import random

import msgspec

from nekomem.actors.journaled_views import JournaledViews
from nekomem.actors.messages import Promote, Report, VectorsComputed
from nekomem.actors.ports import LayerPorts
from nekomem.domain import reflections as rl
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import PERSONA, REFLECTIONS, JournalEvent
from nekomem.domain.records import Reflection, SurfacedEntry
from nekomem.domain.reflections.views import index_entry, public_view
from nekomem.domain.tokens import get_counter
from nekomem.layers.reflections.declaration import ReflectionChange, ReflectionDeleted, ReflectionSynthesized
from nekomem.runtime.reply import Reply
from nekomem.stores.archive_shards import append_to_shard
from nekomem.stores.atomic import atomic_write_json, read_records


def ref_from(obj: object) -> Reflection:
    return msgspec.convert(obj, Reflection, strict=False)


def _id_of(item: object) -> object:
    return item.get("id") if isinstance(item, dict) else None


class ReflectionState:
    """Reflections in memory, their journal (:attr:`views`) and their recall entries.

    It is the :class:`~nekomem.actors.journaled_views.ViewState` of :attr:`views`: the
    views are read, written and replayed through this object.
    """

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.views = JournaledViews(ports, REFLECTIONS, self)
        self.s = self.ports.settings.longterm
        self.counter = get_counter(self.ports.settings.recent.recent_tokenizer_encoding)
        self.refs: dict[str, Reflection] = {}
        self.surfaced: list[SurfacedEntry] = []
        self.archived_pending: dict[str, list[Reflection]] = {}  # shard -> entries not yet written
        self.rng = random.Random()
        # Reflection id -> the searchable verdict last sent to recall (see send_decayed).
        self._searchable: dict[str, bool] = {}

    # -- the views (ViewState) -------------------------------------------------------
    def load_views(self) -> None:
        """Read reflections.json and surfaced.json (records that do not decode are kept
        aside and counted as a change, so the views are rewritten once without them)."""
        self.s = self.ports.settings.longterm
        self.counter = get_counter(self.ports.settings.recent.recent_tokenizer_encoding)
        self.refs = {}
        refs, rejected = read_records(self.ports.paths.reflections, ref_from, "reflections", on_corrupt=self.views.note_corrupt)
        self.refs.update((ref.id, ref) for ref in refs)
        self.surfaced, rejected_surfaced = read_records(
            self.ports.paths.surfaced, lambda item: msgspec.convert(item, SurfacedEntry, strict=False), "surfaced entries"
        )
        self.views.changed(rejected + rejected_surfaced)  # rewrite the views once, without what was kept aside
        self.archived_pending = {}
        self.rng = random.Random()

    def write_views(self) -> None:
        """Write both views and append the archived entries to their shards. Raises OSError."""
        atomic_write_json(self.ports.paths.reflections, list(self.refs.values()))
        atomic_write_json(self.ports.paths.surfaced, self.surfaced)
        for shard, entries in self.archived_pending.items():
            append_to_shard(self.ports.paths.reflection_archive_dir / shard, msgspec.to_builtins(entries), _id_of)
        self.archived_pending.clear()

    def apply_event(self, event: JournalEvent) -> None:
        """Apply one ``reflection.*`` event (idempotent)."""
        match event:
            case ReflectionDeleted(id=deleted):
                self.refs.pop(deleted, None)
            case ReflectionChange(reflection=ref, archive_shard=shard, surfaced=surfaced):
                if ref is not None:
                    if isinstance(event, ReflectionSynthesized) and ref.id in self.refs:
                        return
                    if shard:
                        self.refs.pop(ref.id, None)
                        self.archived_pending.setdefault(shard, []).append(ref)
                    else:
                        self.refs[ref.id] = ref
                if surfaced is not None:
                    self.surfaced = list(surfaced)

    # -- the recall feed -------------------------------------------------------------
    def index_entry(self, ref: Reflection) -> IndexEntry:
        return index_entry(ref, self.ports.now(), self.s)

    def send_index(self) -> None:
        """Send recall the complete set of reflections (after a load, or when a restarted
        RecallActor lost its index)."""
        entries = [self.index_entry(r) for r in self.refs.values()]
        self._searchable = {e.id: e.searchable for e in entries}
        self.ports.index_upsert(entries, replace_tier="reflection")

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
            self.ports.index_upsert(changed)

    def vectors_computed(self, msg: VectorsComputed) -> None:
        """Keep the vectors recall computed on the entries whose text they were computed
        from (a cache: written at the next view write, not journaled)."""
        for rid, (vector, model, sha) in msg.vectors.items():
            ref = self.refs.get(rid)
            if ref is not None and hashlib.sha256(ref.text.encode()).hexdigest() == sha:
                self.refs[rid] = msgspec.structs.replace(ref, embedding=vector, embedding_model_id=model, embedding_text_sha256=sha)
        if msg.vectors:
            self.views.dirty = max(self.views.dirty, 1)

    # -- changes ---------------------------------------------------------------------
    def save(self, refs: list[Reflection], type: str = "reflection.state_changed") -> None:
        """Journal each of ``refs`` as a ``type`` event (one append) and upsert them in
        recall. Raises OSError (nothing is applied then)."""
        if not refs:
            return
        self.views.record_many((type, {"reflection": msgspec.to_builtins(r)}) for r in refs)
        entries = [self.index_entry(self.refs[r.id]) for r in refs if r.id in self.refs]
        self._searchable.update((e.id, e.searchable) for e in entries)
        self.ports.index_upsert(entries)

    def save_changed(self, new_list: list[Reflection], changed_ids: list[str], type: str = "reflection.state_changed") -> None:
        """:meth:`save` the members of ``new_list`` whose id is in ``changed_ids``."""
        by_id = {r.id: r for r in new_list}
        self.save([by_id[i] for i in changed_ids if i in by_id], type)

    def promotion_pass(self, report: Report | None, reply: Reply | None) -> None:
        """Confirm the reflections whose evidence (or age, with powerful memory off) says so
        and hand the promotable ones to the persona layer, which finishes ``report`` and
        answers ``reply``; with none to promote, ``reply`` is answered here."""
        now = self.ports.now()
        refs = list(self.refs.values())
        if self.ports.powerful():
            updated, confirmed = rl.evidence_confirmations(refs, now, self.s)
            self.save_changed(updated, confirmed)
            candidates = rl.promotable(list(self.refs.values()), now, self.s)
        else:
            updated, confirmed = rl.time_driven_confirmations(refs, now, self.s)
            self.save_changed(updated, confirmed)
            candidates = rl.time_driven_promotable(list(self.refs.values()), now, self.s)
        if report is not None:
            report.confirmed = confirmed
        if candidates:
            self.ports.send(PERSONA, Promote(candidates=candidates, report=report, reply=reply))
        elif report is not None:
            if report.promotion is None:
                report.promotion = []
            if reply is not None:
                reply.ok(report)

    def public(self, ref: Reflection) -> dict[str, object]:
        return public_view(ref, self.ports.now(), self.s)
