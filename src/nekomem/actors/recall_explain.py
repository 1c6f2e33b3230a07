"""The recall playground of the memory browser: one user recall, explained.

Runs inside RecallActor (its handler calls :func:`explain`) on the same indexes and the
same leg and fusion code as ``/query_memory``, so the fused list is what a client would
get for the same query vector. Around it, wider searches show what each filter removed:
the explicit time window, the per-leg score thresholds, the per-leg budget, and the shared
hard filter (entries the owners keep out of the index, scored lexically here).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from nekomem.actors.messages import ExplainQuery
from nekomem.recall.fusion import rrf
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.timewindow import TimeWindow, parse_time_window

if TYPE_CHECKING:
    from nekomem.actors.recall import RecallActor

# How many hits beyond a leg's budget are shown (with why they were removed).
WIDEN = 3


def _window(window: TimeWindow | None) -> dict[str, str] | None:
    return None if window is None else {"start": window.start.isoformat(), "end": window.end.isoformat()}


def _annotate(
    actor: RecallActor, hits: list[tuple[str, float]], visible: set[str] | None, allowed: set[str] | None, threshold: float, budget: int
) -> list[dict[str, Any]]:
    """Rows of a widened leg, each with ``removed``: None (kept), "subject_scope" (group
    memory, outside the private corpus a plain recall reads), "time_window",
    "below_threshold" or "over_budget", in the order the real leg applies them."""
    rows: list[dict[str, Any]] = []
    kept = 0
    for doc_id, score in hits:
        if doc_id not in actor.docs:
            continue
        removed: str | None = None
        if visible is not None and doc_id not in visible:
            removed = "subject_scope"
        elif allowed is not None and doc_id not in allowed:
            removed = "time_window"
        elif score < threshold:
            removed = "below_threshold"
        elif kept >= budget:
            removed = "over_budget"
        else:
            kept += 1
        rows.append({**actor._row(doc_id, round(float(score), 6)), "removed": removed})
    return rows


def _query_vector(actor: RecallActor, vector: list[float] | None) -> tuple[np.ndarray | None, str]:
    if actor.s.recall_legs == "bm25":
        return None, "vector leg disabled (recall_legs = bm25)"
    if actor.vectors is None:
        return None, "no embedding service"
    if vector is None:
        return None, "the query could not be embedded"
    qvec = np.asarray(vector, dtype=np.float32)
    if qvec.shape != (actor.vectors.dim,):
        return None, "query vector has the wrong size"
    return qvec, "used"


def _hard_filtered(actor: RecallActor, lexical_query: str, excluded: list[dict[str, str]], threshold: float) -> list[dict[str, Any]]:
    """Excluded entries that the lexical leg would have matched, best first."""
    if not excluded or not lexical_query.strip():
        return []
    index = LexicalIndex(actor.s)
    by_id: dict[str, dict[str, str]] = {}
    for item in excluded:
        if item.get("id") and item.get("text"):
            by_id[item["id"]] = item
            index.add(item["id"], actor._lexical_doc(item["text"]))
    hits = index.search(lexical_query, len(by_id))
    return [
        {"id": i, "text": by_id[i]["text"], "tier": by_id[i].get("tier", ""), "reason": by_id[i].get("reason", ""), "score": round(float(s), 6), "above_threshold": s >= threshold}
        for i, s in hits
    ]


def explain(actor: RecallActor, msg: ExplainQuery) -> dict[str, Any]:
    """The explained recall (see the module docstring); never raises for a bad query."""
    from nekomem.actors.recall import query_time_hint
    from nekomem.domain.subjects import restrict

    started = time.perf_counter()
    s = actor.s
    actor._sync_vectors()
    query = (msg.query or "").strip()[: s.recall_query_max_chars]
    spec = (msg.time or "").strip()
    now = msg.now or datetime.now(actor.tz)
    window = parse_time_window(spec, now) if spec else None
    visible = actor.subject_index.allowed(None)  # the private corpus, as /query_memory reads it
    search, hint, hinted = query, None, None
    if query and window is None and s.recall_query_time_hints:
        hint, rest = query_time_hint(query, now, s.recall_query_time_max_tokens, s.recall_query_time_max_attempts)
        if hint is not None:
            hinted = restrict(actor._in_window(hint), visible) or None
            search = rest or query
    allowed = restrict(actor._in_window(window) if window is not None else None, visible)
    qvec, vector_state = _query_vector(actor, msg.vector if query else None)
    lexical_query = actor._lexical_query(search) if query else ""
    body: dict[str, Any] = {
        "query": query,
        "search": search,
        "time": spec,
        "time_understood": window is not None if spec else None,
        "window": _window(window),
        "query_time_hint": _window(hint),
        "indexed": len(actor.docs),
        "in_window": None if window is None or allowed is None else len(allowed),
        "vector_state": vector_state,
        "thresholds": {"bm25": s.recall_bm25_threshold, "cosine": s.recall_cosine_threshold, "budget_each": s.recall_budget_each, "budget_total": s.recall_budget_total, "rrf_k": s.recall_rrf_k},
        "lexical": [],
        "vector": [],
        "fused": [],
        "hard_filtered": [],
    }
    if not query:
        if window is not None:
            body["fused"] = actor._time_only(window, spec, started, visible)["results"]
        body["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 1)
        return body
    wide = s.recall_budget_each * WIDEN
    if s.recall_legs != "vector":
        lex = actor.lexical.search(lexical_query, wide, None)
        body["lexical"] = _annotate(actor, lex, visible, allowed, s.recall_bm25_threshold, s.recall_budget_each)
    if qvec is not None and actor.vectors is not None:
        vec = actor.vectors.search(qvec, wide, None)
        body["vector"] = _annotate(actor, vec, visible, allowed, s.recall_cosine_threshold, s.recall_budget_each)
    legs = actor._legs(lexical_query, qvec, allowed)
    if hinted:
        legs += actor._legs(lexical_query, qvec, hinted)
    lex_rank = {i: n + 1 for n, i in enumerate(legs[0])}
    vec_rank = {i: n + 1 for n, i in enumerate(legs[1])}
    fused = rrf(legs, s.recall_rrf_k, s.recall_budget_total)
    body["fused"] = [
        {**actor._row(i, round(score, 6)), "lexical_rank": lex_rank.get(i), "vector_rank": vec_rank.get(i)} for i, score in fused if i in actor.docs
    ]
    body["hard_filtered"] = _hard_filtered(actor, lexical_query, msg.excluded, s.recall_bm25_threshold)
    body["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return body
