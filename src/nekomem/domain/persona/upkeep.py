"""Evidence, archive sweep and mentions of non-protected persona entries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    ResolvedSignal,
    Signal,
    SignalSource,
    apply_signal,
    archive_due,
    track_below_zero,
)
from nekomem.domain.persona.sections import (
    _replace_entry,
    copy_persona,
    find_entry,
)
from nekomem.domain.records import (
    Persona,
    PersonaEntry,
    to_iso,
)
from nekomem.domain.reflections import (
    is_mentioned,
    record_mention,
    refresh_suppression,
)


def apply_entry_signal(
    persona: Mapping[str, Sequence[PersonaEntry]],
    entry_id: str,
    signal: Signal,
    source: SignalSource,
    now: datetime,
    settings: LongTermSettings,
) -> tuple[Persona, bool]:
    """Apply one evidence signal to a non-protected entry. Returns (persona, changed);
    protected and unknown entries are left alone."""
    result = copy_persona(persona)
    found = find_entry(result, entry_id)
    if found is None or found[1].protected:
        return result, False
    entity, entry = found
    _replace_entry(result, entity, apply_signal(entry, signal, source, now, settings))
    return result, True


def apply_resolved_signals(
    persona: Mapping[str, Sequence[PersonaEntry]],
    signals: Iterable[ResolvedSignal],
    now: datetime,
    settings: LongTermSettings,
    source: SignalSource = "user_fact",
) -> tuple[Persona, list[str]]:
    """Apply the persona-targeted signals of a map_evidence (``user_fact``) or
    check_disputation (``user_keyword_rebut``) result. Returns (persona, ids changed)."""
    result = copy_persona(persona)
    changed: list[str] = []
    for sig in signals:
        if sig.target_kind != "persona":
            continue
        result, ok = apply_entry_signal(result, sig.target_id, sig.signal, source, now, settings)
        if ok:
            changed.append(sig.target_id)
    return result, changed


class PersonaSweep(msgspec.Struct, frozen=True):
    """Result of the persona archive sweep: the new persona, the archived (entity, entry)
    pairs (``archived_at`` set; the caller stamps the shard) and the ids counted today."""

    persona: Persona
    archived: list[tuple[str, PersonaEntry]]
    counted: list[str]


def persona_archive_sweep(persona: Mapping[str, Sequence[PersonaEntry]], now: datetime, settings: LongTermSettings) -> PersonaSweep:
    """Below-zero day counting for every non-protected entry (once per calendar day) and
    removal of those below zero on ``evidence_archive_days`` distinct days. Protected
    entries are never counted or archived."""
    result: Persona = {}
    archived: list[tuple[str, PersonaEntry]] = []
    counted: list[str] = []
    for entity, entries in persona.items():
        kept: list[PersonaEntry] = []
        for entry in entries:
            if not entry.protected:
                updated = track_below_zero(entry, now, settings)
                if updated is not entry:
                    counted.append(entry.id)
                if archive_due(updated, settings):
                    archived.append((entity, msgspec.structs.replace(updated, archived_at=to_iso(now))))
                    continue
                entry = updated
            kept.append(entry)
        result[entity] = kept
    return PersonaSweep(result, archived, counted)


def record_reply_mentions(
    persona: Mapping[str, Sequence[PersonaEntry]],
    reply: str,
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str] = (),
) -> tuple[Persona, list[str]]:
    """Record a mention on every non-protected entry the AI ``reply`` mentions (any keyword
    as a substring, stop names removed). Returns (persona, ids mentioned)."""
    names = list(stop_names)
    result: Persona = {}
    changed: list[str] = []
    for entity, entries in persona.items():
        new_entries = []
        for entry in entries:
            if not entry.protected and reply and is_mentioned(reply, entry.text, names):
                entry = record_mention(entry, now, settings)
                changed.append(entry.id)
            new_entries.append(entry)
        result[entity] = new_entries
    return result, changed


def refresh_suppressions(
    persona: Mapping[str, Sequence[PersonaEntry]], now: datetime, settings: LongTermSettings
) -> tuple[Persona, list[str]]:
    """Lift expired suppressions (run before each render). Returns (persona, ids changed)."""
    result: Persona = {}
    changed: list[str] = []
    for entity, entries in persona.items():
        new_entries = []
        for entry in entries:
            updated = refresh_suppression(entry, now, settings)
            if updated is not entry:
                changed.append(entry.id)
            new_entries.append(updated)
        result[entity] = new_entries
    return result, changed
