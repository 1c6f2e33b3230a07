"""The consensus leg of a query recall: the legs' pooled hits re-ranked by their scores.

Reciprocal Rank Fusion only sees ranks: a memory second in a leg by a hair and one second
by a wide margin count the same, and a memory every signal likes moderately but none puts
near its top is never seen. The consensus leg takes the union of every leg's best hits (a
pool of a few dozen), measures each signal on every pooled memory (the BM25 score, each
embedding model's hubness-corrected cosine), turns each signal into z-scores inside the
pool (so their scales meet), and ranks the pool by the weighted sum (CombSUM over z-scores).
The ranking joins the fusion as one more leg, so it can lift but not replace.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Signal = tuple[float, npt.NDArray[np.float64]]  # (weight, one value per pooled id)


def pool_of(rankings: Sequence[Sequence[str]], depth: int) -> list[str]:
    """The union of each ranking's first ``depth`` ids, in first-appearance order."""
    return list(dict.fromkeys(doc_id for ranking in rankings for doc_id in ranking[:depth] if doc_id))


def zscores(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``values`` centred and scaled to unit deviation; all zeros when they do not vary."""
    std = float(values.std())
    if not np.isfinite(std) or std < 1e-12:
        return np.zeros_like(values)
    return (values - float(values.mean())) / std


def consensus_ranking(pool: Sequence[str], signals: Sequence[Signal], limit: int) -> list[str]:
    """The first ``limit`` ids of ``pool`` by the weighted sum of each signal's z-scores
    (ties keep the pool's order). Raises ValueError when a signal's length is not the
    pool's."""
    if not pool or limit <= 0:
        return []
    total = np.zeros(len(pool), dtype=np.float64)
    for weight, values in signals:
        if values.shape != (len(pool),):
            raise ValueError(f"a signal has {values.shape} values for a pool of {len(pool)}")
        if weight:
            total += weight * zscores(values)
    order = np.argsort(-total, kind="stable")[:limit]
    return [pool[i] for i in order.tolist()]
