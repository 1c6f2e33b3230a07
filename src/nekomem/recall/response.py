"""The JSON body of a user recall (``/query_memory``), built from index hits.

``{"results": [row...], "query": str, "candidates_total": int, "elapsed_ms": float}``, plus
``"time"`` for a time-only recall and ``"error_code": "hybrid_recall_failed"`` when recall
failed (then ``results`` is empty). A row is the entry's id, text, tier, entity, score
(None for a time-only recall), created_at, event_start_at and event_end_at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.subjects import row_fields

ERROR_CODE = "hybrid_recall_failed"

# A JSON object as the HTTP layer sends it.
RecallBody = dict[str, Any]


def hit_row(entry: IndexEntry, score: float | None) -> dict[str, object]:
    """One result row."""
    return {
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


def empty_response(query: str, *, error: bool = False) -> RecallBody:
    """No results; with ``error`` the body carries the failure code."""
    body: RecallBody = {"results": [], "query": query, "candidates_total": 0, "elapsed_ms": 0.0}
    if error:
        body["error_code"] = ERROR_CODE
    return body


def query_response(hits: Iterable[tuple[IndexEntry, float]], query: str, candidates_total: int, elapsed_ms: float) -> RecallBody:
    """The body of a recall by query text."""
    results = [hit_row(entry, score) for entry, score in hits]
    return {"results": results, "query": query, "candidates_total": candidates_total, "elapsed_ms": elapsed_ms}


def time_response(entries: Iterable[IndexEntry], spec: str, candidates_total: int, elapsed_ms: float) -> RecallBody:
    """The body of a recall by time alone (no scores)."""
    results = [hit_row(entry, None) for entry in entries]
    return {"results": results, "query": "", "time": spec, "candidates_total": candidates_total, "elapsed_ms": elapsed_ms}
