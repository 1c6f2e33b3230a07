"""Persona: protected card entries, promotion from reflections, the contradiction queue,
evidence decay/archive of non-protected entries and mention tracking.

The persona is ``entity -> list[PersonaEntry]`` (:data:`~nekomem.domain.records.Persona`).
Every function returns new objects; the PersonaActor owns persona.json,
persona_corrections.json and the archive shards, and makes the LLM calls.
Protected entries (from the character card) are never decayed, signal-targeted, archived
or rewritten by a contradiction. One module per concern; this package re-exports them.
"""

from __future__ import annotations

from nekomem.domain.persona.adding import (
    AddKind,
    AddOutcome,
    add_entry,
    conflicting_entries,
    enqueue_correction,
    new_manual_entry,
    overlap_ratio,
)
from nekomem.domain.persona.corrections import (
    CorrectionKind,
    CorrectionOutcome,
    apply_correction,
    correction_batch,
    record_correction_failure,
    reflection_after_correction,
)
from nekomem.domain.persona.promotion import (
    Gate,
    PromotionKind,
    PromotionOutcome,
    apply_promotion_decision,
    blocked,
    merge_into_entry,
    promotion_gate,
    promotion_pool,
    record_promotion_attempt,
    time_driven_promotion,
)
from nekomem.domain.persona.sections import CARD_SOURCE, card_entries, copy_persona, ensure_sections, find_entry, sync_card
from nekomem.domain.persona.upkeep import (
    PersonaSweep,
    apply_entry_signal,
    apply_resolved_signals,
    persona_archive_sweep,
    record_reply_mentions,
    refresh_suppressions,
)

__all__ = [
    "AddKind",
    "AddOutcome",
    "CARD_SOURCE",
    "CorrectionKind",
    "CorrectionOutcome",
    "Gate",
    "PersonaSweep",
    "PromotionKind",
    "PromotionOutcome",
    "add_entry",
    "apply_correction",
    "apply_entry_signal",
    "apply_promotion_decision",
    "apply_resolved_signals",
    "blocked",
    "card_entries",
    "conflicting_entries",
    "copy_persona",
    "correction_batch",
    "enqueue_correction",
    "ensure_sections",
    "find_entry",
    "merge_into_entry",
    "new_manual_entry",
    "overlap_ratio",
    "persona_archive_sweep",
    "promotion_gate",
    "promotion_pool",
    "record_correction_failure",
    "record_promotion_attempt",
    "record_reply_mentions",
    "reflection_after_correction",
    "refresh_suppressions",
    "sync_card",
    "time_driven_promotion",
]
