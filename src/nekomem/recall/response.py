"""The answer of a user recall (``/query_memory``), built from index hits.

A :class:`~nekomem.wire.answers.RecallAnswer`: ``results`` (rows), ``query``,
``candidates_total``, ``elapsed_ms``, plus ``time`` for a time-only recall and
``error_code`` ``hybrid_recall_failed`` when recall failed (then ``results`` is empty). A
row is the entry's id, text, tier, entity, score (None for a time-only recall),
created_at, event_start_at and event_end_at, and its subject. A row of a journal turn
(tier ``turn`` or ``journal``, :mod:`nekomem.recall.turn_leg`) also names the write
request that stored it, ``session_id``; its time is ``created_at``. Times are as stored
(UTC); the route gives them in the display time zone (``nekomem.http.recall``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from msgspec import UNSET

from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.subjects import LEGACY_PRIVATE_SCOPE
from nekomem.wire.answers import RecallAnswer, RecallResult

ERROR_CODE = "hybrid_recall_failed"


def hit_row(entry: IndexEntry, score: float | None, session: str | None = None) -> RecallResult:
    """One result row; ``session`` (not None for a journal turn) is its ``session_id``."""
    return RecallResult(
        id=entry.id,
        text=entry.text,
        tier=entry.tier,
        entity=entry.entity,
        score=score,
        created_at=entry.created_at,
        event_start_at=entry.event_start_at,
        event_end_at=entry.event_end_at,
        subject_kind=entry.subject_kind,
        subject_id=entry.subject_id,
        scope=entry.scope or LEGACY_PRIVATE_SCOPE,
        session_id=UNSET if session is None else session,
    )


def empty_response(query: str, *, error: bool = False) -> RecallAnswer:
    """No results; with ``error`` the answer carries the failure code. The one empty
    answer: the recall layer's and the route's (an unknown character, no query)."""
    return RecallAnswer(results=[], query=query, error_code=ERROR_CODE if error else UNSET)


def query_response(
    hits: Iterable[tuple[IndexEntry, float]],
    query: str,
    candidates_total: int,
    elapsed_ms: float,
    sessions: Mapping[str, str] | None = None,
) -> RecallAnswer:
    """The answer of a recall by query text; ``sessions`` maps the id of a journal turn's
    row to its session."""
    known = sessions or {}
    results = [hit_row(entry, score, known.get(entry.id)) for entry, score in hits]
    return RecallAnswer(results=results, query=query, candidates_total=candidates_total, elapsed_ms=elapsed_ms)


def time_response(entries: Iterable[IndexEntry], spec: str, candidates_total: int, elapsed_ms: float) -> RecallAnswer:
    """The answer of a recall by time alone (no scores)."""
    results = [hit_row(entry, None) for entry in entries]
    return RecallAnswer(results=results, query="", time=spec, candidates_total=candidates_total, elapsed_ms=elapsed_ms)
