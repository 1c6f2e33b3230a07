"""Beyond the reference: recall over the raw journal for a character that has no long-term
entry yet (no model ever extracted a fact, or none was configured).

The reference's recall never reads the raw journal, so without a model ``/query_memory`` is
always empty although everything that was said is stored. This module ranks the newest
turns of the journal by BM25 (the same lexical analysis as the index) and returns them as
rows of tier ``journal``. Once the character has any long-term entry, only the turns no
memory covers stay candidates, beside the entries (tier ``turn``, :mod:`nekomem.recall.turn_leg`).
"""

from __future__ import annotations

from collections.abc import Sequence

from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.recall.query_text import LexicalAnalyzer
from nekomem.recall.turn_leg import JOURNAL_TIER, TurnCorpus
from nekomem.stores.timeindex_read import TimeIndexRow

__all__ = ["JOURNAL_TIER", "journal_hits"]


def journal_hits(
    rows: Sequence[TimeIndexRow], query: str, analyzer: LexicalAnalyzer, settings: RecallSettings
) -> tuple[list[tuple[IndexEntry, float]], dict[str, str]]:
    """The best ``recall_budget_total`` turns of ``rows`` for ``query`` as (entry, score),
    best first (empty when nothing matches), and the session of each row. Never raises on text."""
    corpus = TurnCorpus(rows, JOURNAL_TIER, analyzer, settings)
    hits = corpus.leg(query, settings.recall_budget_total)
    return [(corpus.entries[doc_id], score) for doc_id, score in hits], corpus.sessions
