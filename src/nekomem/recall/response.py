"""The JSON body of a user recall (``/query_memory``), built from index hits.

``{"results": [row...], "query": str, "candidates_total": int, "elapsed_ms": float}``, plus
``"time"`` for a time-only recall and ``"error_code": "hybrid_recall_failed"`` when recall
failed (then ``results`` is empty). A row is the entry's id, text, tier, entity, score
(None for a time-only recall), created_at, event_start_at and event_end_at. A row of a
journal turn (tier ``turn`` or ``journal``, :mod:`nekomem.recall.turn_leg`) also names the
write request that stored it, ``session_id``; its time is ``created_at``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.subjects import row_fields

ERROR_CODE = "hybrid_recall_failed"

# A JSON object as the HTTP layer sends it.
RecallBody = dict[str, Any]


def hit_row(entry: IndexEntry, score: float | None, session: str | None = None) -> dict[str, object]:
    """One result row; ``session`` (not None for a journal turn) is added as ``session_id``."""
    row: dict[str, object] = {
        "id": entry.id,
        "text": entry.text,
        "tier": entry.tier,
        "entity": entry.entity,
        "score": score,
        "created_at": entry.created_at,
        "event_start_at": entry.event_start_at,
        "event_end_at": entry.event_end_at,
        **row_fields(entry),
    }
    if session is not None:
        row["session_id"] = session
    return row


def empty_response(query: str, *, error: bool = False) -> RecallBody:
    """No results; with ``error`` the body carries the failure code."""
    body: RecallBody = {"results": [], "query": query, "candidates_total": 0, "elapsed_ms": 0.0}
    if error:
        body["error_code"] = ERROR_CODE
    return body


def query_response(
    hits: Iterable[tuple[IndexEntry, float]],
    query: str,
    candidates_total: int,
    elapsed_ms: float,
    sessions: Mapping[str, str] | None = None,
) -> RecallBody:
    """The body of a recall by query text; ``sessions`` maps the id of a journal turn's row
    to its session."""
    known = sessions or {}
    results = [hit_row(entry, score, known.get(entry.id)) for entry, score in hits]
    return {"results": results, "query": query, "candidates_total": candidates_total, "elapsed_ms": elapsed_ms}


def time_response(entries: Iterable[IndexEntry], spec: str, candidates_total: int, elapsed_ms: float) -> RecallBody:
    """The body of a recall by time alone (no scores)."""
    results = [hit_row(entry, None) for entry in entries]
    return {"results": results, "query": "", "time": spec, "candidates_total": candidates_total, "elapsed_ms": elapsed_ms}
