"""Event types of the per-character journal (events.ndjson) and which actor applies each."""

from __future__ import annotations

EVENT_OWNERS: dict[str, str] = {
    "fact.added": "facts",
    "fact.absorbed": "facts",
    "fact.archived": "facts",
    "fact.updated": "facts",
    "fact.deleted": "facts",
    "reflection.synthesized": "reflections",
    "reflection.state_changed": "reflections",
    "reflection.surfaced": "reflections",
    "reflection.rebutted": "reflections",
    "reflection.evidence_updated": "reflections",
    "reflection.updated": "reflections",
    "reflection.deleted": "reflections",
    "persona.fact_added": "persona",
    "persona.fact_mentioned": "persona",
    "persona.suppressed": "persona",
    "persona.evidence_updated": "persona",
    "persona.entry_updated": "persona",
    "persona.entry_deleted": "persona",
    "correction.queued": "persona",
    "correction.resolved": "persona",
}

KNOWN_EVENT_TYPES = frozenset(EVENT_OWNERS)
