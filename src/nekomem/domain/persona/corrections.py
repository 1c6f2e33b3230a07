"""The contradiction queue: batches for resolve_correction and the outcome applied to
the persona and the reflection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.persona.sections import (
    _clear_caches,
    _push_version,
    _replace_entry,
    copy_persona,
)
from nekomem.domain.records import (
    Correction,
    Persona,
    PersonaEntry,
    Reflection,
    correction_entry_id,
    record_get,
    to_iso,
)
from nekomem.domain.reflections import (
    deny,
    mark_promoted,
)


def correction_batch(queue: Sequence[Correction], settings: LongTermSettings) -> list[Correction]:
    """The items of the next resolution pass (oldest first, ``persona_correction_batch_limit``)."""
    return list(queue[: settings.persona_correction_batch_limit])


def _without(queue: Sequence[Correction], item: Correction) -> list[Correction]:
    return [q for q in queue if not (q.created_at == item.created_at and q.old_text == item.old_text and q.new_text == item.new_text)]


CorrectionKind = Literal["kept_old", "replaced", "merged", "invalid"]


class CorrectionOutcome(msgspec.Struct, frozen=True):
    """Result of a resolve_correction decision. ``entry_id``: the entry now holding the
    knowledge. ``source_id``: the reflection that proposed the new text (the caller marks it
    promoted after replaced/merged, denied after kept_old). ``invalid`` leaves everything
    as it was (count it with :func:`record_correction_failure`)."""

    kind: CorrectionKind
    persona: Persona
    corrections: list[Correction]
    entry_id: str | None
    source_id: str | None


def apply_correction(
    persona: Mapping[str, Sequence[PersonaEntry]],
    queue: Sequence[Correction],
    item: Correction,
    output: object,
    now: datetime,
    settings: LongTermSettings,
) -> CorrectionOutcome:
    """Apply a resolve_correction output ``{action: keep_old|replace|merge, text}``.

    ``keep_old``: nothing changes. ``replace``: the old entry is replaced in place by a new
    ``corr_...`` entry holding ``text`` (else the queued new text), with the old text in its
    version history. ``merge``: the old entry keeps its id, evidence and mentions, takes
    ``text`` (required) and records the old text in ``version_history`` (at most
    ``persona_version_history_max``). A protected old entry always survives (as keep_old).
    When the old entry has gone, replace/merge add the text as a new entry. The item leaves
    the queue unless the outcome is ``invalid``.
    """
    result = copy_persona(persona)
    action = record_get(output, "action")
    text = record_get(output, "text")
    text = text.strip() if isinstance(text, str) and text.strip() else None
    if action not in ("keep_old", "replace", "merge") or (action == "merge" and text is None):
        return CorrectionOutcome("invalid", result, list(queue), None, item.source_id)
    remaining = _without(queue, item)
    section = result.setdefault(item.entity, [])
    old = None
    if item.old_entry_id:
        old = next((e for e in section if e.id == item.old_entry_id), None)
    if old is None:
        old = next((e for e in section if e.text == item.old_text), None)
    if action == "keep_old" or (old is not None and old.protected):
        return CorrectionOutcome("kept_old", result, remaining, old.id if old else None, item.source_id)
    new_text = text if text is not None else item.new_text.strip()
    if old is None:
        entry = PersonaEntry(
            id=correction_entry_id(new_text, now), text=new_text, source="correction", source_id=item.source_id, created_at=to_iso(now)
        )
        section.append(entry)
        return CorrectionOutcome("replaced" if action == "replace" else "merged", result, remaining, entry.id, item.source_id)
    history = _push_version(old, now, "correction_" + action, settings)
    if action == "merge":
        updated = _clear_caches(old, text=new_text, version_history=history)
        _replace_entry(result, item.entity, updated)
        return CorrectionOutcome("merged", result, remaining, old.id, item.source_id)
    entry = PersonaEntry(
        id=correction_entry_id(new_text, now),
        text=new_text,
        source="correction",
        source_id=item.source_id,
        created_at=to_iso(now),
        version_history=history,
    )
    result[item.entity] = [entry if e.id == old.id else e for e in section]
    return CorrectionOutcome("replaced", result, remaining, entry.id, item.source_id)


def reflection_after_correction(ref: Reflection, kind: CorrectionKind, now: datetime) -> Reflection:
    """Close the loop on the reflection that proposed a resolved correction: ``replaced`` or
    ``merged`` -> promoted (its knowledge is now in the persona), ``kept_old`` -> denied
    (``correction_kept_old``). Any other case, or a reflection no longer confirmed, is
    returned unchanged."""
    if ref.status != "confirmed":
        return ref
    if kind in ("replaced", "merged"):
        return mark_promoted(ref, now)
    if kind == "kept_old":
        return deny(ref, now, "correction_kept_old")
    return ref


def record_correction_failure(queue: Sequence[Correction], item: Correction, settings: LongTermSettings) -> tuple[list[Correction], bool]:
    """One more failed resolution of ``item``; it is dropped at ``persona_correction_max_attempts``.
    Returns (new queue, dropped)."""
    result: list[Correction] = []
    dropped = False
    for q in queue:
        if q.created_at == item.created_at and q.old_text == item.old_text and q.new_text == item.new_text:
            q = msgspec.structs.replace(q, resolve_attempts=q.resolve_attempts + 1)
            if q.resolve_attempts >= settings.persona_correction_max_attempts:
                dropped = True
                continue
        result.append(q)
    return result, dropped
