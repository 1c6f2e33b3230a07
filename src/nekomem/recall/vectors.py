"""An exact in-memory cosine index: ids to L2-normalised float32 rows of one growing matrix.

Rows of removed ids go to a free list and are reused by later inserts; the matrix doubles
when full. A search is one matrix-vector product over the used rows (or over the allowed
rows only, when the allowed set is small) and an argpartition top-k. Not thread-safe: one
owner (an actor) calls it.

The index keeps the running sum of its rows, so the centroid of every stored vector is
known at no cost. A search with ``hub > 0`` ranks by ``cos(q, d) - hub * (d . centroid)``
instead of the plain cosine: a memory that is close to every other memory (a generic
"Melanie values her family") is close to every query too, and this "hubness" correction
lets the specific memories through (each row's dot with the centroid is computed once
after a write and cached, so a search costs what a plain one does). Scores returned and
thresholds stay plain cosines.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.recall.fusion import top_k

Allowed = Callable[[str], bool] | Collection[str] | None


def _unit(vec: object, dim: int) -> np.ndarray | None:
    """``vec`` as a float32 unit vector of length ``dim``; None if its norm is 0 or not finite.

    A ``(1, dim)`` row is accepted too. Raises ValueError for any other shape or for
    non-numeric input.
    """
    try:
        arr = np.asarray(vec, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError("vector must be a sequence of numbers") from None
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise ValueError(f"expected a vector of {dim} numbers, got shape {arr.shape}")
    norm = float(np.linalg.norm(arr.astype(np.float64)))
    if not np.isfinite(norm) or norm == 0.0:
        return None
    return (arr / np.float32(norm)).astype(np.float32, copy=False)


class VectorIndex:
    """Cosine top-k over ``doc_id -> vector`` of a fixed dimension."""

    def __init__(self, dim: int, settings: RecallSettings | None = None) -> None:
        """Raises ValueError if ``dim`` is not positive."""
        if dim <= 0:
            raise ValueError("dim must be positive")
        s = settings or RecallSettings()
        self.dim = dim
        capacity = s.recall_index_initial_capacity
        self._matrix = np.zeros((capacity, dim), dtype=np.float32)
        self._alive = np.zeros(capacity, dtype=bool)
        self._row_ids: list[str | None] = []  # one per used row (the high-water mark)
        self._id_row: dict[str, int] = {}
        self._free: list[int] = []
        self._sum = np.zeros(dim, dtype=np.float64)  # of the live rows, for centroid()
        self._hub_dots: dict[bytes, np.ndarray] = {}  # centroid -> every used row's dot with it

    # ------------------------------------------------------------------ writes

    def upsert(self, doc_id: str, vec: object) -> None:
        """Store (or replace) the vector of ``doc_id``, L2-normalised.

        Raises ValueError if ``doc_id`` is empty, the vector has the wrong length, or its
        norm is zero or not finite (such a vector has no direction to compare).
        """
        if not doc_id:
            raise ValueError("doc_id must be a non-empty string")
        unit = _unit(vec, self.dim)
        if unit is None:
            raise ValueError(f"vector of {doc_id!r} has zero or non-finite norm")
        row = self._id_row.get(doc_id)
        if row is None:
            row = self._take_row()
            self._id_row[doc_id] = row
            self._row_ids[row] = doc_id
            self._alive[row] = True
        else:
            self._sum -= self._matrix[row]
        self._matrix[row] = unit
        self._sum += unit
        self._hub_dots.clear()

    def remove(self, doc_id: str) -> bool:
        """Drop the vector of ``doc_id``; False if there was none."""
        row = self._id_row.pop(doc_id, None)
        if row is None:
            return False
        self._alive[row] = False
        self._row_ids[row] = None
        self._sum -= self._matrix[row]
        self._matrix[row] = 0.0
        self._hub_dots.clear()
        self._free.append(row)
        return True

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        return len(self._id_row)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._id_row

    def ids(self) -> Iterator[str]:
        return iter(self._id_row)

    def centroid(self) -> np.ndarray:
        """The mean of the stored unit vectors (float32, not normalised; zeros when empty)."""
        n = len(self._id_row)
        return (self._sum / n if n else self._sum).astype(np.float32)

    def get(self, doc_id: str) -> np.ndarray | None:
        """A copy of the stored unit vector of ``doc_id``, or None."""
        row = self._id_row.get(doc_id)
        return None if row is None else self._matrix[row].copy()

    def search(
        self,
        qvec: object,
        k: int,
        allowed: Allowed = None,
        *,
        min_score: float | None = None,
        hub: float = 0.0,
        centroid: np.ndarray | None = None,
    ) -> list[tuple[str, float]]:
        """The ``k`` ids most cosine-similar to ``qvec``, best first (ties by id).

        ``allowed`` is a collection of ids or a predicate on the id; ``min_score`` drops
        hits below that cosine. With ``hub > 0`` the order is by the hubness-corrected
        score (see the module docstring) while the returned scores stay cosines;
        ``centroid`` replaces :meth:`centroid` there (a search over some columns only
        discounts the centroid of those columns). A zero query vector gives ``[]``. Raises
        ValueError if ``qvec`` or ``centroid`` has the wrong length.
        """
        unit = _unit(qvec, self.dim)
        if unit is None or k <= 0 or not self._id_row:
            return []
        if centroid is not None and np.shape(centroid) != (self.dim,):
            raise ValueError(f"expected a centroid of {self.dim} numbers, got shape {np.shape(centroid)}")
        return self._rank(unit, k, allowed, min_score, exclude=None, hub=hub, centroid=centroid)

    def neighbours(self, doc_id: str, k: int, allowed: Allowed = None, *, min_score: float | None = None) -> list[tuple[str, float]]:
        """The ``k`` stored ids nearest to ``doc_id``'s own vector, itself excluded.

        Raises KeyError if ``doc_id`` has no vector.
        """
        row = self._id_row.get(doc_id)
        if row is None:
            raise KeyError(doc_id)
        if k <= 0:
            return []
        return self._rank(self._matrix[row].copy(), k, allowed, min_score, exclude=row)

    # ------------------------------------------------------------------ internals

    def _rank(
        self,
        unit: np.ndarray,
        k: int,
        allowed: Allowed,
        min_score: float | None,
        exclude: int | None,
        hub: float = 0.0,
        centroid: np.ndarray | None = None,
    ) -> list[tuple[str, float]]:
        accept: Callable[[str], bool] | None = None
        used = len(self._row_ids)
        if allowed is not None and not callable(allowed):
            rows = np.array(sorted(self._id_row[i] for i in allowed if i in self._id_row), dtype=np.int64)
        else:
            rows = np.flatnonzero(self._alive[:used])
            accept = allowed
        if exclude is not None:
            rows = rows[rows != exclude]
        if rows.shape[0] == 0:
            return []
        if hub > 0:
            return self._rank_hub(unit, k, rows, accept, min_score, hub, centroid)
        if 2 * rows.shape[0] > used:
            # Most rows wanted: one product over the used block beats copying the rows out.
            sims = (self._matrix[:used] @ unit)[rows].astype(np.float64)
        else:
            sims = (self._matrix[rows] @ unit).astype(np.float64)
        if min_score is not None:
            keep = sims >= min_score
            rows, sims = rows[keep], sims[keep]
        row_ids = self._row_ids
        return top_k(rows, sims, k, lambda r: row_ids[r], accept)  # type: ignore[arg-type,return-value]

    def _rank_hub(
        self,
        unit: np.ndarray,
        k: int,
        rows: np.ndarray,
        allowed: Callable[[str], bool] | None,
        min_score: float | None,
        hub: float,
        centroid: np.ndarray | None,
    ) -> list[tuple[str, float]]:
        """The hubness-corrected ranking: the cosines (one product, as a plain search) minus
        ``hub`` times each row's dot with the centroid, which is cached until the next write."""
        mean = self.centroid() if centroid is None else np.asarray(centroid, dtype=np.float32)
        used = len(self._row_ids)
        key = mean.tobytes()
        dots = self._hub_dots.get(key)
        if dots is None or dots.shape[0] != used:
            dots = (self._matrix[:used] @ mean).astype(np.float64)
            if len(self._hub_dots) >= 4:  # a few centroids (one per column range searched)
                self._hub_dots.clear()
            self._hub_dots[key] = dots
        if 2 * rows.shape[0] > used:
            sims = (self._matrix[:used] @ unit)[rows].astype(np.float64)
        else:
            sims = (self._matrix[rows] @ unit).astype(np.float64)
        if min_score is not None:
            keep = sims >= min_score
            rows, sims = rows[keep], sims[keep]
        row_ids = self._row_ids
        ranked = top_k(rows, sims - hub * dots[rows], k, lambda r: row_ids[r], allowed)  # type: ignore[arg-type,return-value]
        id_row = self._id_row
        return [(doc_id, float(score + hub * dots[id_row[doc_id]])) for doc_id, score in ranked]

    def _take_row(self) -> int:
        if self._free:
            return self._free.pop()
        row = len(self._row_ids)
        if row >= self._matrix.shape[0]:
            size = self._matrix.shape[0] * 2
            matrix = np.zeros((size, self.dim), dtype=np.float32)
            matrix[:row] = self._matrix[:row]
            alive = np.zeros(size, dtype=bool)
            alive[:row] = self._alive[:row]
            self._matrix, self._alive = matrix, alive
        self._row_ids.append(None)
        return row
