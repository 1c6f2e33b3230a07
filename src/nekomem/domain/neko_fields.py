"""Reference fields a nekomem record does not have, kept by the importer under
``source_ref: {"neko": {...}}`` (nekomem.importer.neko.convert), and what nekomem makes of
them.

Interpreted: a fact row the reference retired is not recalled (``superseded_by``: another
fact replaced it; ``arbitration_archived_at``: it lost a contradiction arbitration;
``subject_archived_at``: its group subject was archived as stale), and ``speaker_id`` /
``speaker_entity_id`` tie a row to the person an identity forget erases
(nekomem.domain.speaker_identity). Every other kept field (``speaker_label``,
``speaker_trust``, ``speaker_provenance_mixed``, ``_speaker_trust_signal_events``,
``arbitration_reason``, ``restored_at``, ...) is kept as it came and not interpreted;
docs/NEKO-ROUTES.md lists them.
"""

from __future__ import annotations

from typing import Any

RETIRING_FIELDS = ("superseded_by", "arbitration_archived_at", "subject_archived_at")


def kept(record: dict[str, Any] | None, source_ref: Any, key: str) -> Any:
    """Field ``key`` of a record: at its top level (``record``, when given), else kept
    under ``source_ref.neko``; None when neither has it."""
    if record is not None and key in record:
        return record[key]
    holder = source_ref.get("neko") if isinstance(source_ref, dict) else None
    return holder.get(key) if isinstance(holder, dict) else None


def retired(source_ref: Any) -> bool:
    """Whether the reference retired the fact these kept fields belong to."""
    if not isinstance(source_ref, dict):
        return False  # nothing kept (most facts): answered without a lookup per field
    return any(kept(None, source_ref, key) for key in RETIRING_FIELDS)
