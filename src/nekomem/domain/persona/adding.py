"""Adding persona entries: the contradiction check against existing entries, the
correction queue entry it produces, and manual entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    effective_disputation,
    effective_reinforcement,
)
from nekomem.domain.persona.sections import (
    copy_persona,
)
from nekomem.domain.records import (
    Correction,
    EvidenceFields,
    Persona,
    PersonaEntry,
    manual_entry_id,
    promoted_entry_id,
    to_iso,
)
from nekomem.domain.reflections import (
    mention_keywords,
)


def overlap_ratio(a: str, b: str, stop_names: Iterable[str] = ()) -> float:
    """Shared keywords / the smaller keyword set (0 when either has none)."""
    names = list(stop_names)
    ka, kb = mention_keywords(a, names), mention_keywords(b, names)
    if not ka or not kb:
        return 0.0
    return len(ka & kb) / min(len(ka), len(kb))


def conflicting_entries(
    entries: Iterable[PersonaEntry], text: str, settings: LongTermSettings, stop_names: Iterable[str] = ()
) -> list[PersonaEntry]:
    """Entries that 'may contradict' ``text``: keyword overlap ratio >= ``persona_contradiction_overlap_ratio``
    (strongest first; an entry with exactly the same text is a duplicate, not a conflict)."""
    names = list(stop_names)
    scored = []
    for entry in entries:
        if entry.text.strip() == text.strip():
            continue
        ratio = overlap_ratio(text, entry.text, names)
        if ratio >= settings.persona_contradiction_overlap_ratio:
            scored.append((ratio, entry))
    scored.sort(key=lambda pair: -pair[0])
    return [entry for _, entry in scored]


def enqueue_correction(queue: Sequence[Correction], item: Correction) -> tuple[list[Correction], bool]:
    """``queue`` plus ``item`` unless an item with the same old_text, new_text and entity is queued."""
    for existing in queue:
        if (existing.old_text, existing.new_text, existing.entity) == (item.old_text, item.new_text, item.entity):
            return list(queue), False
    return [*queue, item], True


AddKind = Literal["added", "duplicate", "card_conflict", "queued"]


class AddOutcome(msgspec.Struct, frozen=True):
    """Result of :func:`add_entry`: the new persona and queue, the entry added (``added``),
    or the entry in conflict (``card_conflict`` / ``queued``) or already present (``duplicate``)."""

    kind: AddKind
    persona: Persona
    corrections: list[Correction]
    entry_id: str | None


def _inherit_evidence(evidence: EvidenceFields | None, now: datetime, settings: LongTermSettings) -> dict[str, Any]:
    if evidence is None:
        return {}
    stamp = to_iso(now)
    return {
        "reinforcement": effective_reinforcement(evidence, now, settings),
        "disputation": effective_disputation(evidence, now, settings),
        "rein_last_signal_at": stamp,
        "disp_last_signal_at": stamp,
        "user_fact_reinforce_count": evidence.user_fact_reinforce_count,
    }


def add_entry(
    persona: Mapping[str, Sequence[PersonaEntry]],
    corrections: Sequence[Correction],
    entity: str,
    text: str,
    *,
    source: str,
    source_id: str | None,
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str] = (),
    evidence: EvidenceFields | None = None,
) -> AddOutcome:
    """Add ``text`` to ``entity``'s section after the contradiction check.

    The same text (or the same ``prom_<source_id>`` id) already present -> ``duplicate``.
    A conflict with a protected entry -> ``card_conflict`` (nothing written). A conflict with
    a non-protected entry -> ``queued``: a Correction (old = that entry, new = ``text``) joins
    the queue. Otherwise a new entry is appended (``prom_<source_id>`` for reflections,
    ``manual_...`` otherwise), carrying ``evidence`` decayed to now when given.
    """
    text = text.strip()
    result = copy_persona(persona)
    section = result.setdefault(entity, [])
    promoted = source.startswith("reflection") and source_id
    new_id = promoted_entry_id(source_id) if promoted else manual_entry_id(text, now)  # type: ignore[arg-type]
    for entry in section:
        if entry.text.strip() == text or entry.id == new_id:
            return AddOutcome("duplicate", result, list(corrections), entry.id)
    conflicts = conflicting_entries(section, text, settings, stop_names)
    protected = [e for e in conflicts if e.protected]
    if protected:
        return AddOutcome("card_conflict", result, list(corrections), protected[0].id)
    if conflicts:
        old = conflicts[0]
        item = Correction(old_text=old.text, new_text=text, entity=entity, created_at=to_iso(now), old_entry_id=old.id, source_id=source_id)
        queue, _ = enqueue_correction(corrections, item)
        return AddOutcome("queued", result, queue, old.id)
    entry = PersonaEntry(
        id=new_id, text=text, source=source, source_id=source_id, created_at=to_iso(now), **_inherit_evidence(evidence, now, settings)
    )
    section.append(entry)
    return AddOutcome("added", result, list(corrections), entry.id)


def new_manual_entry(entity: str, text: str, now: datetime) -> PersonaEntry:
    """A hand-written (memory browser) entry; add it with :func:`add_entry` to run the checks."""
    clean = text.strip()
    return PersonaEntry(id=manual_entry_id(clean, now), text=clean, source="manual", created_at=to_iso(now))
