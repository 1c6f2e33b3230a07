"""How an owner (facts, reflections) describes one searchable entry to the recall index.

In the domain, beside the rules that build it (``domain.reflections.views``), because
recall, which indexes it (``recall.entry``), reads the domain and the domain never
imports recall.
"""

from __future__ import annotations

import msgspec


class IndexEntry(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """What the recall index needs of one searchable entry.

    ``tier`` is "fact", "reflection" or "fact_archive". ``searchable`` is False for entries
    the shared hard filter excludes (denied/archived/merged/promote_blocked reflections,
    suppressed, protected, negative evidence score, empty text); the index drops them.
    ``vector`` is a cached vector in nekomem.domain.vector_codec form with ``vector_model``
    and ``text_sha256`` so it is reused only when both still match.
    """

    id: str
    tier: str
    text: str
    entity: str = ""
    created_at: str | None = None
    event_start_at: str | None = None
    event_end_at: str | None = None
    importance: int = 0
    score: float = 0.0
    searchable: bool = True
    vector: str | None = None
    vector_model: str | None = None
    text_sha256: str | None = None
    subject_kind: str | None = None
    subject_id: str | None = None
    scope: str | None = None
    # A fact's source turns: the time span (ISO 8601) of the journal turns it was learnt
    # from, when its source_ref names one (recall_turn_keys: those turns are more keys of it).
    source_from: str | None = None
    source_to: str | None = None
