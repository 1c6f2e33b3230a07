"""The recall playground of the memory browser: one user recall, explained.

Runs on the same :class:`~nekomem.recall.index.RecallIndex`, leg and fusion code as
``/query_memory`` (RecallActor's ExplainQuery handler calls :func:`explain`), so the fused
list is what a client would get for the same query vector. Around it, wider searches show
what each filter removed: the explicit time window, the per-leg score thresholds, the
per-leg budget, and the shared hard filter (entries the owners keep out of the index,
scored lexically here). With two embedding models in the vectors (``use+e5``) there is one
vector leg per model, each over its own columns with its own cosine threshold, as recall
ranks them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.models.embeddings import VectorLeg
from nekomem.recall.fusion import rrf
from nekomem.recall.index import RecallIndex, Vectors
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.query_plan import QueryPlan
from nekomem.recall.response import hit_row
from nekomem.recall.timewindow import TimeWindow

# How many hits beyond a leg's budget are shown (with why they were removed).
WIDEN = 3


def row_json(entry: IndexEntry, score: float | None) -> dict[str, object]:
    """A recall row as JSON (the rows here get more keys: the legs' ranks, why removed)."""
    row: dict[str, object] = msgspec.to_builtins(hit_row(entry, score))
    return row


def _window(window: TimeWindow | None) -> dict[str, str] | None:
    return None if window is None else {"start": window.start.isoformat(), "end": window.end.isoformat()}


def _annotate(
    index: RecallIndex, hits: list[tuple[str, float]], visible: set[str] | None, allowed: set[str] | None, threshold: float, budget: int
) -> list[dict[str, Any]]:
    """Rows of a widened leg, each with ``removed``: None (kept), "subject_scope" (group
    memory, outside the private corpus a plain recall reads), "time_window",
    "below_threshold" or "over_budget", in the order the real leg applies them."""
    rows: list[dict[str, Any]] = []
    kept = 0
    for doc_id, score in hits:
        doc = index.docs.get(doc_id)
        if doc is None:
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
        rows.append({**row_json(doc.entry, round(float(score), 6)), "removed": removed})
    return rows


def _query_vector(index: RecallIndex, settings: RecallSettings, vector: Vectors | None) -> tuple[Vectors | None, str]:
    if settings.recall_legs == "bm25":
        return None, "vector leg disabled (recall_legs = bm25)"
    if index.vectors is None:
        return None, "no embedding service"
    if vector is None:
        return None, "the query could not be embedded"
    qvec = np.asarray(vector, dtype=np.float32)
    if qvec.shape != (index.vectors.dim,):
        return None, "query vector has the wrong size"
    return qvec, "used"


def _vector_legs(index: RecallIndex, settings: RecallSettings) -> list[tuple[VectorLeg | None, dict[str, Any]]]:
    """The vector legs recall runs (one per model in the vectors; one over all columns when
    there is a single model), each with its description: model, columns, cosine threshold."""
    if index.vectors is None:
        return []
    out: list[tuple[VectorLeg | None, dict[str, Any]]] = []
    for leg in index.vector_legs or (None,):
        if leg is None:
            info = {"model": index.vector_model, "columns": [0, index.vectors.dim], "threshold": settings.recall_cosine_threshold}
        else:
            threshold = settings.recall_cosine_threshold if leg.recall_threshold is None else leg.recall_threshold
            info = {"model": leg.name, "columns": [leg.start, leg.stop], "threshold": threshold}
        out.append((leg, info))
    return out


def _hard_filtered(
    index: RecallIndex, settings: RecallSettings, lexical_query: str, excluded: Sequence[Mapping[str, str]]
) -> list[dict[str, Any]]:
    """Excluded entries that the lexical leg would have matched, best first."""
    if not excluded or not lexical_query.strip():
        return []
    lexical = LexicalIndex(settings)
    by_id: dict[str, Mapping[str, str]] = {}
    for item in excluded:
        if item.get("id") and item.get("text"):
            by_id[item["id"]] = item
            lexical.add(item["id"], index.analyzer.document(item["text"]))
    threshold = settings.recall_bm25_threshold
    return [
        {
            "id": i,
            "text": by_id[i]["text"],
            "tier": by_id[i].get("tier", ""),
            "reason": by_id[i].get("reason", ""),
            "score": round(float(s), 6),
            "above_threshold": s >= threshold,
        }
        for i, s in lexical.search(lexical_query, len(by_id))
    ]


def _legs_explained(
    index: RecallIndex,
    settings: RecallSettings,
    body: dict[str, Any],
    search: str,
    qvec: Vectors | None,
    visible: set[str] | None,
    allowed: set[str] | None,
    hinted: set[str] | None,
) -> None:
    """Fill the widened legs and the fused list of ``body``."""
    s = settings
    lexical_query = index.analyzer.query(search)
    wide = s.recall_budget_each * WIDEN
    if s.recall_legs != "vector":
        body["lexical"] = _annotate(
            index, index.lexical.search(lexical_query, wide, None), visible, allowed, s.recall_bm25_threshold, s.recall_budget_each
        )
    vector_legs = _vector_legs(index, s)
    if qvec is not None:
        for leg, info in vector_legs:
            # The leg's own search (its columns, hubness correction), wider and unthresholded.
            hits = index.vector_hits(qvec, None, leg, float("-inf"), k=wide)
            body["vector_legs"].append({**info, "hits": _annotate(index, hits, visible, allowed, info["threshold"], s.recall_budget_each)})
    legs = index.legs(lexical_query, qvec, allowed)
    if hinted:
        legs += index.legs(lexical_query, qvec, hinted)
    lex_rank = {i: n + 1 for n, i in enumerate(legs[0])}
    vec_ranks = [{i: n + 1 for n, i in enumerate(leg)} for leg in legs[1 : 1 + max(1, len(vector_legs))]]
    body["fused"] = [
        {
            **row_json(index.docs[i].entry, round(score, 6)),
            "lexical_rank": lex_rank.get(i),
            "vector_ranks": [ranks.get(i) for ranks in vec_ranks] if vector_legs else [],
        }
        for i, score in rrf(legs, s.recall_rrf_k, s.recall_budget_total)
        if i in index.docs
    ]
    body["lexical_query"] = lexical_query


def explain(
    index: RecallIndex,
    settings: RecallSettings,
    plan: QueryPlan,
    vector: Vectors | None,
    excluded: Sequence[Mapping[str, str]],
) -> dict[str, Any]:
    """The explained recall of ``plan`` (made by :func:`~nekomem.recall.query_plan.plan_query`
    over the private corpus, as /query_memory makes it) with the query vector ``vector``
    blended from its ``vector_texts`` (None: not embedded); see the module docstring.
    Never raises for a bad query."""
    started = time.perf_counter()
    s = settings
    query, spec, window, search, hint, hinted, allowed = (
        plan.query,
        plan.spec,
        plan.window,
        plan.search,
        plan.hint,
        plan.hinted,
        plan.allowed,
    )
    visible = index.visible(None)  # the private corpus, as /query_memory reads it
    qvec, vector_state = _query_vector(index, s, vector if query else None)
    body: dict[str, Any] = {
        "query": query,
        "search": search,
        "time": spec,
        "time_understood": window is not None if spec else None,
        "window": _window(window),
        "query_time_hint": _window(hint),
        "indexed": len(index.docs),
        "in_window": None if window is None or allowed is None else len(allowed),
        "vector_state": vector_state,
        "thresholds": {
            "bm25": s.recall_bm25_threshold,
            "cosine": s.recall_cosine_threshold,
            "budget_each": s.recall_budget_each,
            "budget_total": s.recall_budget_total,
            "rrf_k": s.recall_rrf_k,
            "vector_hub_weight": index.hub_weight(),
            "query_unnamed_weight": s.recall_query_unnamed_weight,
        },
        "lexical": [],
        "vector_legs": [],
        "fused": [],
        "hard_filtered": [],
    }
    if not query:
        if window is not None:
            body["fused"] = [row_json(e, None) for e in index.nearest_in_time(window, s.recall_time_budget, visible)[0]]
    else:
        _legs_explained(index, s, body, search, qvec, visible, allowed, hinted)
        body["hard_filtered"] = _hard_filtered(index, s, body.pop("lexical_query"), excluded)
    body["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return body
