"""Rank fusion and per-leg top-N selection.

``rrf`` fuses ranked id lists by Reciprocal Rank Fusion: every list adds ``1 / (k + rank)``
to each id it holds (ranks start at 1; an id repeated inside one list counts once, at its
best rank). ``leg_top`` turns one leg's scored hits into the ranked id list RRF wants
(threshold, then the best ``n``). ``top_k`` is the shared exact top-k selection of the
lexical and vector indexes (ties broken by id, optional acceptance predicate).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from nekomem.config.recall import RecallSettings


def rrf(rankings: Sequence[Sequence[str]], k: int, limit: int, weights: Sequence[float] | None = None) -> list[tuple[str, float]]:
    """Fuse ranked id lists; returns at most ``limit`` ``(id, score)`` pairs, best first.

    The score of an id is the sum over lists of ``weight / (k + rank)`` (``weights``: one per
    list, 1 when not given). Empty ids (``""`` or
    ``None``) are skipped. Equal scores keep the order of first appearance (list order,
    then rank), so the result is deterministic. Raises ValueError if ``k`` is negative.
    """
    if k < 0:
        raise ValueError("rrf k must be >= 0")
    if limit <= 0:
        return []
    scores: dict[str, float] = {}
    for position, ranking in enumerate(rankings):
        weight = 1.0 if weights is None or position >= len(weights) else float(weights[position])
        seen: set[str] = set()
        rank = 0
        for doc_id in ranking:
            if not doc_id or doc_id in seen:
                continue
            seen.add(doc_id)
            rank += 1
            scores[doc_id] = scores.get(doc_id, 0.0) + weight / (k + rank)
    # sorted() is stable, so ties keep first-appearance (dict insertion) order.
    return sorted(scores.items(), key=lambda item: -item[1])[:limit]


def same_time_leg(legs: Sequence[Sequence[str]], k: int, anchors: int, day_of: Callable[[str], Hashable | None]) -> list[str]:
    """The same-time leg of a query recall: ``legs`` fused by :func:`rrf`, kept to the ids
    whose ``day_of`` is the day of one of the first ``anchors`` fused ids (undated ids are
    never kept). Returns ``[]`` when no anchor is dated."""
    fused = [doc_id for doc_id, _ in rrf(legs, k, sum(len(leg) for leg in legs))]
    days = {day for day in (day_of(doc_id) for doc_id in fused[: max(anchors, 0)]) if day is not None}
    if not days:
        return []
    return [doc_id for doc_id in fused if day_of(doc_id) in days]


def leg_top(hits: Sequence[tuple[str, float]], n: int, threshold: float) -> list[str]:
    """The ids of the best ``n`` hits scoring at least ``threshold``, best first.

    ``hits`` may be in any order; equal scores are ordered by id.
    """
    kept = [(doc_id, score) for doc_id, score in hits if doc_id and score >= threshold]
    kept.sort(key=lambda item: (-item[1], item[0]))
    return [doc_id for doc_id, _ in kept[: max(n, 0)]]


def fuse_legs(
    lexical: Sequence[tuple[str, float]],
    vector: Sequence[tuple[str, float]] = (),
    settings: RecallSettings | None = None,
) -> list[tuple[str, float]]:
    """The query-recall fusion: each leg thresholded and cut to its budget, then RRF.

    Lexical hits use ``recall_bm25_threshold``, vector hits ``recall_cosine_threshold``;
    each leg keeps ``recall_budget_each``; RRF with ``recall_rrf_k``, cut at
    ``recall_budget_total``. An empty vector leg (no embeddings) gives BM25-only recall.
    """
    s = settings or RecallSettings()
    legs = [
        leg_top(lexical, s.recall_budget_each, s.recall_bm25_threshold),
        leg_top(vector, s.recall_budget_each, s.recall_cosine_threshold),
    ]
    return rrf(legs, s.recall_rrf_k, s.recall_budget_total)


def top_k(
    positions: np.ndarray,
    scores: np.ndarray,
    k: int,
    id_of: Callable[[int], str],
    accept: Callable[[str], bool] | None = None,
) -> list[tuple[str, float]]:
    """The ``k`` best ``(id, score)`` pairs among candidates, best first, ties by id.

    ``positions[i]`` is the internal row/slot of candidate ``i`` and ``scores[i]`` its
    score; ``id_of`` maps a position to its id. With ``accept``, candidates it rejects are
    skipped and the search widens (doubling) until ``k`` are accepted or none are left, so
    the cost stays near ``k`` predicate calls when most candidates pass.
    """
    n = int(scores.shape[0])
    if k <= 0 or n == 0:
        return []
    out: list[tuple[str, float]] = []
    consumed = 0
    take = k
    while True:
        take = min(take, n)
        if take < n:
            # Everything scoring at least the take-th best value: a prefix of the total
            # (-score, id) order, so earlier rounds' ranking is a prefix of this one.
            kth = np.partition(scores, n - take)[n - take]
            chosen = np.flatnonzero(scores >= kth)
        else:
            chosen = np.arange(n)
        ids = [id_of(int(p)) for p in positions[chosen]]
        vals = scores[chosen].tolist()
        ranked = sorted(range(len(ids)), key=lambda i: (-vals[i], ids[i]))
        for i in ranked[consumed:]:
            consumed += 1
            if accept is None or accept(ids[i]):
                out.append((ids[i], float(vals[i])))
                if len(out) == k:
                    return out
        if take >= n:
            return out
        take *= 2
