"""Beyond the reference: recall over the raw journal for a character that has no long-term
entry yet (no model ever extracted a fact, or none was configured).

The reference's recall never reads the raw journal, so without a model ``/query_memory`` is
always empty although everything that was said is stored. This module ranks the newest
turns of the journal by BM25 (the same lexical analysis as the index) and returns them as
rows of tier ``journal``; once the character has any long-term entry, recall is the
reference's again.
"""

from __future__ import annotations

from collections.abc import Sequence

from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.turns import Turn
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.query_text import LexicalAnalyzer

JOURNAL_TIER = "journal"


def journal_hits(turns: Sequence[Turn], query: str, analyzer: LexicalAnalyzer, settings: RecallSettings) -> list[tuple[IndexEntry, float]]:
    """The best ``recall_budget_total`` turns of ``turns`` for ``query`` as (entry, score),
    best first; empty when nothing matches. Never raises on text."""
    lexical = LexicalIndex(settings)
    entries: dict[str, IndexEntry] = {}
    for n, turn in enumerate(turns):
        if turn.role == "system" or not turn.text.strip():
            continue
        doc_id = f"journal_{n}"
        entries[doc_id] = IndexEntry(
            id=doc_id,
            tier=JOURNAL_TIER,
            text=turn.text,
            entity="master" if turn.role == "human" else "neko",
            created_at=turn.ts or None,
            event_start_at=turn.ts or None,
        )
        lexical.add(doc_id, analyzer.document(turn.text))
    hits = lexical.search(analyzer.query(query), settings.recall_budget_total, min_score=settings.recall_bm25_threshold)
    return [(entries[doc_id], score) for doc_id, score in hits]
