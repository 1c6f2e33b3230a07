"""The persona's store: persona.json, persona_corrections.json and the persona_archive/
shards in memory, the journaled changes to them (through :class:`JournaledViews`), and
the archive sweep that moves long-disputed entries out to the shards.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

import msgspec

from nekomem.actors.journaled_views import JournaledViews
from nekomem.actors.ports import LayerPorts
from nekomem.domain import persona as pl
from nekomem.domain.layers import PERSONA, JournalEvent
from nekomem.domain.records import (
    Correction,
    Persona,
    PersonaEntry,
    assign_shards,
    new_shard_suffix,
    persona_from_disk,
    persona_to_disk,
)
from nekomem.domain.tokens import TokenCounter, get_counter
from nekomem.layers.persona.declaration import CorrectionsChanged, PersonaChange, PersonaEntryDeleted
from nekomem.stores.atomic import atomic_write_json, keep_rejected, read_json, read_records, shard_counts
from nekomem.stores.erasure import mentions


class ArchivedEntry(TypedDict):
    """One line of an archive shard: the entry as journaled and the entity it left."""

    entity: str
    entry: dict[str, object]


def entry_from(obj: object) -> PersonaEntry:
    return msgspec.convert(obj, PersonaEntry, strict=False)


class PersonaStore:
    """Persona entries and corrections in memory and their journal (the persona layer's
    :class:`~nekomem.actors.journaled_views.ViewState`). Every change goes through
    :meth:`commit` or :meth:`record`: journaled first, then applied."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.views = JournaledViews(ports, PERSONA, self)
        self.persona: Persona = {}
        self.corrections: list[Correction] = []
        self.archived_pending: dict[str, list[ArchivedEntry]] = {}

    # -- the views (ViewState) -------------------------------------------------------
    def load_views(self) -> None:
        """Read persona.json and persona_corrections.json; entries that cannot be read are
        kept aside (and the views rewritten once without them). Raises OSError, and
        ValueError for a tokenizer encoding nekomem does not know."""
        self.counter: TokenCounter = get_counter(self.ports.settings.recent.recent_tokenizer_encoding)
        raw = self.views.read_view(self.ports.paths.persona, default={})
        rejected: list[object] = []
        self.persona = pl.ensure_sections(persona_from_disk(raw, rejected))
        if rejected:
            keep_rejected(self.ports.paths.persona, rejected, "persona entries")
        self.corrections, rejected_corrections = read_records(
            self.ports.paths.persona_corrections, lambda item: msgspec.convert(item, Correction, strict=False), "corrections"
        )
        self.views.changed(len(rejected) + rejected_corrections)  # rewrite the views once, without what was kept aside
        self.archived_pending = {}

    def write_views(self) -> None:
        atomic_write_json(self.ports.paths.persona, persona_to_disk(self.persona))
        atomic_write_json(self.ports.paths.persona_corrections, self.corrections)
        for shard, entries in self.archived_pending.items():
            path = self.ports.paths.persona_archive_dir / shard
            existing, _ = read_json(path, default=[])
            existing = existing if isinstance(existing, list) else []
            known = {e.get("entry", {}).get("id") for e in existing if isinstance(e, dict)}
            existing.extend(e for e in entries if e["entry"]["id"] not in known)
            atomic_write_json(path, existing)
        self.archived_pending.clear()

    def apply_event(self, event: JournalEvent) -> None:
        """Apply one ``persona.*`` or ``correction.*`` event (idempotent)."""
        match event:
            case PersonaChange(entity=entity, entry=entry, archive_shard=shard, index=index):
                self._remove(entry.id)
                if shard:
                    self.archived_pending.setdefault(shard, []).append({"entity": entity, "entry": msgspec.to_builtins(entry)})
                    return
                section = list(self.persona.get(entity, []))
                if index is not None and 0 <= index <= len(section):
                    section.insert(index, entry)
                else:
                    section.append(entry)
                self.persona[entity] = section
            case PersonaEntryDeleted(id=deleted):
                self._remove(deleted)
            case CorrectionsChanged(corrections=corrections):
                self.corrections = list(corrections)

    def _remove(self, entry_id: str) -> None:
        for entity, entries in self.persona.items():
            if any(e.id == entry_id for e in entries):
                self.persona[entity] = [e for e in entries if e.id != entry_id]

    # -- changes ---------------------------------------------------------------------
    def commit(self, new: Persona, corrections: list[Correction] | None = None, type: str = "persona.entry_updated") -> list[str]:
        """Journal the difference between the current persona and ``new`` (and the
        corrections queue, when given and different) in one append; returns the changed
        entry ids. Raises OSError (nothing is applied then)."""
        old_entries = {e.id: (entity, e) for entity, entries in self.persona.items() for e in entries}
        items: list[tuple[str, dict[str, object]]] = []
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
        self.views.record_many(items)
        for entity in new:
            self.persona.setdefault(entity, [])
        return changed

    def forget_corrections_of(self, texts: list[str]) -> bool:
        """An erasure: queued corrections that hold one of ``texts`` go too (journaled);
        True when some went. Raises OSError."""
        kept = [c for c in self.corrections if not mentions(msgspec.to_builtins(c), texts)]
        if len(kept) == len(self.corrections):
            return False
        self.views.record("correction.queued", {"corrections": msgspec.to_builtins(kept)})
        return True

    def find(self, entry_id: str) -> tuple[str, PersonaEntry] | None:
        """(entity, entry) of the entry ``entry_id``, or None."""
        return pl.find_entry(self.persona, entry_id)

    # -- archive sweep ---------------------------------------------------------------
    def sweep(self, now: datetime) -> dict[str, int]:
        """Count below-zero days and move the entries whose days are up to an archive
        shard (journaled). Returns how many were archived and counted. Raises OSError."""
        result = pl.persona_archive_sweep(self.persona, now, self.s)
        if result.archived:
            counts = shard_counts(self.ports.paths.persona_archive_dir, self.archived_pending)
            shards = assign_shards(counts, len(result.archived), now.date(), new_shard_suffix, self.s.evidence_archive_shard_max_entries)
            items = [
                ("persona.entry_updated", {"entity": entity, "entry": msgspec.to_builtins(entry), "archive_shard": shard})
                for (entity, entry), shard in zip(result.archived, shards, strict=False)
            ]
            self.views.record_many(items)
        archived_ids = {entry.id for _e, entry in result.archived}
        remaining = {k: [e for e in v if e.id not in archived_ids] for k, v in result.persona.items()}
        self.commit(remaining, type="persona.evidence_updated")
        return {"archived": len(result.archived), "counted": len(result.counted)}
