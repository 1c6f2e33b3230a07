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

When the vectors hold several models side by side (each one's unit vector scaled into its
own block of columns), a search can be restricted to some columns, ``columns=(start, stop)``:
only those columns of the matrix and of the query are multiplied, so each model's search
costs its own width rather than the full one. The matrix is kept as one array per column
block (``blocks``: the column cuts, given at construction), so a model's columns are read
contiguously; a search over all columns sums the blocks' products.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.recall.fusion import top_k

Allowed = Callable[[str], bool] | Collection[str] | None
Columns = tuple[int, int]


def _vector(vec: object, dim: int) -> np.ndarray:
    """``vec`` as a float32 vector of length ``dim`` (a ``(1, dim)`` row is accepted too).

    Raises ValueError for any other shape or for non-numeric input.
    """
    try:
        arr = np.asarray(vec, dtype=np.float32)
    except (TypeError, ValueError):
        raise ValueError("vector must be a sequence of numbers") from None
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise ValueError(f"expected a vector of {dim} numbers, got shape {arr.shape}")
    return arr


def _normalised(arr: np.ndarray) -> np.ndarray | None:
    """``arr`` divided by its norm; None if the norm is 0 or not finite."""
    norm = float(np.linalg.norm(arr.astype(np.float64)))
    if not np.isfinite(norm) or norm == 0.0:
        return None
    return (arr / np.float32(norm)).astype(np.float32, copy=False)


def units(rows: np.ndarray, chunk: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Each float32 row of ``rows`` normalised as :meth:`VectorIndex.upsert` normalises one
    (:func:`_normalised`), all at once, in place when every row has a norm; (the unit rows,
    a boolean mask of the rows that had a finite non-zero norm). Each norm is the row's dot
    product with itself in float64, batched as a matrix product ``chunk`` rows at a time:
    the same kernel as the one-row norm, so the same bits (a test holds this build to it)."""
    norms = np.empty(rows.shape[0], dtype=np.float64)
    for lo in range(0, rows.shape[0], chunk):
        wide = rows[lo : lo + chunk].astype(np.float64)
        norms[lo : lo + chunk] = np.sqrt((wide[:, None, :] @ wide[:, :, None])[:, 0, 0])
    ok = np.isfinite(norms) & (norms != 0.0)
    if not ok.all():
        rows, norms = rows[ok], norms[ok]
    np.divide(rows, norms.astype(np.float32)[:, None], out=rows)
    return rows, ok


def _unit(vec: object, dim: int) -> np.ndarray | None:
    """``vec`` as a float32 unit vector of length ``dim``; None if its norm is 0 or not finite.

    Raises ValueError as :func:`_vector` does.
    """
    return _normalised(_vector(vec, dim))


class VectorIndex:
    """Cosine top-k over ``doc_id -> vector`` of a fixed dimension."""

    def __init__(self, dim: int, settings: RecallSettings | None = None, blocks: Sequence[int] = ()) -> None:
        """``blocks``: column cuts (each strictly inside ``(0, dim)``); the columns between two
        cuts are stored as one contiguous array. Raises ValueError if ``dim`` is not
        positive or a cut is out of range."""
        if dim <= 0:
            raise ValueError("dim must be positive")
        cuts = sorted({int(c) for c in blocks})
        if any(not 0 < c < dim for c in cuts):
            raise ValueError(f"column cuts must lie strictly between 0 and {dim}, got {list(blocks)!r}")
        s = settings or RecallSettings()
        self.dim = dim
        capacity = s.recall_index_initial_capacity
        bounds = [0, *cuts, dim]
        self._spans: list[Columns] = list(zip(bounds[:-1], bounds[1:], strict=True))
        self._blocks = [np.zeros((capacity, stop - start), dtype=np.float32) for start, stop in self._spans]
        self._alive = np.zeros(capacity, dtype=bool)
        self._row_ids: list[str | None] = []  # one per used row (the high-water mark)
        self._id_row: dict[str, int] = {}
        self._free: list[int] = []
        self._sum = np.zeros(dim, dtype=np.float64)  # of the live rows, for centroid()
        # (columns, centroid) -> every used row's dot with that centroid over those columns
        self._hub_dots: dict[tuple[Columns, bytes], np.ndarray] = {}

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
            self._sum -= self._row(row)
        self._set_row(row, unit)
        self._sum += unit
        self._hub_dots.clear()

    def add_units(self, doc_ids: Sequence[str], units: np.ndarray) -> None:
        """Store ``units`` (one float32 unit row per id, already normalised as :meth:`upsert`
        normalises) for ``doc_ids``, none of which is stored yet, in one write per column
        block: the same rows, sum and centroid as an :meth:`upsert` of each in order, at a
        fraction of the cost for a wake's thousands of cached vectors.

        Raises ValueError when an id is empty, stored already or repeated, or when
        ``units`` is not ``(len(doc_ids), dim)``; nothing is stored then."""
        n = len(doc_ids)
        if units.shape != (n, self.dim):
            raise ValueError(f"expected {n} rows of {self.dim} numbers, got shape {units.shape}")
        if not all(doc_ids) or len(set(doc_ids)) != n or any(d in self._id_row for d in doc_ids):
            raise ValueError("ids must be non-empty, distinct and not stored yet")
        if n == 0:
            return
        self.reserve(n)
        if self._free:
            rows = [self._take_row() for _ in range(n)]
            at: slice | np.ndarray = np.asarray(rows, dtype=np.intp)
        else:
            # No free row: the next n rows, as n upserts would take them one by one.
            first = len(self._row_ids)
            rows = list(range(first, first + n))
            self._row_ids.extend([None] * n)
            at = slice(first, first + n)
        for (start, stop), block in zip(self._spans, self._blocks, strict=True):
            block[at] = units[:, start:stop]
        self._alive[at] = True
        for doc_id, row in zip(doc_ids, rows, strict=True):
            self._id_row[doc_id] = row
            self._row_ids[row] = doc_id
        # Summed row after row in float64 onto the running sum, as n upserts add them one by
        # one (a reduction along axis 0 adds the rows in order; chunks bound the float64 copy).
        if not self._sum.any():
            # From zero (a wake's first vectors): the rows' own sum, in the same order.
            self._sum = self._sum + np.add.reduce(units, axis=0, dtype=np.float64)
        else:
            total = self._sum
            for lo in range(0, n, 4096):
                total = np.add.reduce(np.concatenate([total[None, :], units[lo : lo + 4096].astype(np.float64)]), axis=0)
            self._sum = total
        self._hub_dots.clear()

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more vectors at once: one reallocation, to the size the
        doublings one insert at a time would reach."""
        needed = len(self._row_ids) + max(0, n - len(self._free))
        if needed > self.capacity:
            size = self.capacity
            while size < needed:
                size *= 2
            self._grow(size)

    def remove(self, doc_id: str) -> bool:
        """Drop the vector of ``doc_id``; False if there was none."""
        row = self._id_row.pop(doc_id, None)
        if row is None:
            return False
        self._alive[row] = False
        self._row_ids[row] = None
        self._sum -= self._row(row)
        for block in self._blocks:
            block[row] = 0.0
        self._hub_dots.clear()
        self._free.append(row)
        return True

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        return len(self._id_row)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._id_row

    @property
    def capacity(self) -> int:
        """Rows allocated (used, free and not yet used)."""
        return int(self._alive.shape[0])

    def ids(self) -> Iterator[str]:
        return iter(self._id_row)

    def centroid(self) -> np.ndarray:
        """The mean of the stored unit vectors (float32, not normalised; zeros when empty)."""
        n = len(self._id_row)
        return (self._sum / n if n else self._sum).astype(np.float32)

    def get(self, doc_id: str) -> np.ndarray | None:
        """A copy of the stored unit vector of ``doc_id``, or None."""
        row = self._id_row.get(doc_id)
        return None if row is None else self._row(row)

    def search(
        self,
        qvec: object,
        k: int,
        allowed: Allowed = None,
        *,
        min_score: float | None = None,
        hub: float = 0.0,
        centroid: np.ndarray | None = None,
        columns: Columns | None = None,
    ) -> list[tuple[str, float]]:
        """The ``k`` ids most cosine-similar to ``qvec``, best first (ties by id).

        ``allowed`` is a collection of ids or a predicate on the id; ``min_score`` drops
        hits below that cosine. With ``hub > 0`` the order is by the hubness-corrected
        score (see the module docstring) while the returned scores stay cosines;
        ``centroid`` replaces :meth:`centroid` there. ``columns=(start, stop)`` searches
        those columns only: the query's slice is normalised and dotted with each row's
        slice as stored (rows are not renormalised, so a row whose slice has norm ``w``
        scores ``w`` times the cosine, and ``min_score`` applies to that product); a
        ``centroid`` is then ``stop - start`` wide (default: the centroid's slice). A zero
        query vector (or query slice) gives ``[]``. Raises ValueError if ``qvec`` or
        ``centroid`` has the wrong length or ``columns`` is not a non-empty range inside
        ``[0, dim)``.
        """
        start, stop = self._columns(columns)
        unit = _normalised(_vector(qvec, self.dim)[start:stop])
        if unit is None or k <= 0 or not self._id_row:
            return []
        if centroid is not None and np.shape(centroid) != (stop - start,):
            raise ValueError(f"expected a centroid of {stop - start} numbers, got shape {np.shape(centroid)}")
        return self._rank(unit, k, allowed, min_score, exclude=None, hub=hub, centroid=centroid, columns=(start, stop))

    def _columns(self, columns: Columns | None) -> Columns:
        """``columns`` checked (None: all of them). Raises ValueError for a bad range."""
        if columns is None:
            return 0, self.dim
        start, stop = (int(c) for c in columns)
        if not 0 <= start < stop <= self.dim:
            raise ValueError(f"columns must be a non-empty range inside [0, {self.dim}), got {columns!r}")
        return start, stop

    def neighbours(self, doc_id: str, k: int, allowed: Allowed = None, *, min_score: float | None = None) -> list[tuple[str, float]]:
        """The ``k`` stored ids nearest to ``doc_id``'s own vector, itself excluded.

        Raises KeyError if ``doc_id`` has no vector.
        """
        row = self._id_row.get(doc_id)
        if row is None:
            raise KeyError(doc_id)
        if k <= 0:
            return []
        return self._rank(self._row(row), k, allowed, min_score, exclude=row)

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
        columns: Columns | None = None,
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
        start, stop = columns or (0, self.dim)
        # Most rows wanted: one product over the used rows beats copying the rows out.
        sims = self._dots(None, unit, start, stop)[rows] if 2 * rows.shape[0] > used else self._dots(rows, unit, start, stop)
        if hub > 0:
            return self._rank_hub(sims, k, rows, accept, min_score, hub, centroid, (start, stop))
        if min_score is not None:
            keep = sims >= min_score
            rows, sims = rows[keep], sims[keep]
        row_ids = self._row_ids
        return top_k(rows, sims, k, lambda r: row_ids[r], accept)  # type: ignore[arg-type,return-value]

    def _rank_hub(
        self,
        sims: np.ndarray,
        k: int,
        rows: np.ndarray,
        allowed: Callable[[str], bool] | None,
        min_score: float | None,
        hub: float,
        centroid: np.ndarray | None,
        columns: Columns,
    ) -> list[tuple[str, float]]:
        """The hubness-corrected ranking of ``rows`` (their cosines ``sims``): minus ``hub``
        times each row's dot with the centroid over ``columns``, which is cached per column
        range and centroid until the next write."""
        start, stop = columns
        mean = self.centroid()[start:stop] if centroid is None else np.asarray(centroid, dtype=np.float32)
        used = len(self._row_ids)
        key = (columns, mean.tobytes())
        dots = self._hub_dots.get(key)
        if dots is None or dots.shape[0] != used:
            dots = self._dots(None, mean, start, stop)
            if len(self._hub_dots) >= 4:  # a few centroids (one per column range searched)
                self._hub_dots.clear()
            self._hub_dots[key] = dots
        if min_score is not None:
            keep = sims >= min_score
            rows, sims = rows[keep], sims[keep]
        row_ids = self._row_ids
        ranked = top_k(rows, sims - hub * dots[rows], k, lambda r: row_ids[r], allowed)  # type: ignore[arg-type,return-value]
        id_row = self._id_row
        return [(doc_id, float(score + hub * dots[id_row[doc_id]])) for doc_id, score in ranked]

    def _dots(self, rows: np.ndarray | None, vec: np.ndarray, start: int, stop: int) -> np.ndarray:
        """Each row's (``rows``; None: every used row) dot with ``vec`` over the columns
        ``[start, stop)`` (``vec`` is that wide), as float64: the sum of the products of the
        column blocks the range overlaps."""
        used = len(self._row_ids)
        total: np.ndarray | None = None
        for (b0, b1), block in zip(self._spans, self._blocks, strict=True):
            lo, hi = max(start, b0), min(stop, b1)
            if lo >= hi:
                continue
            part = block[:used, lo - b0 : hi - b0] if rows is None else block[rows, lo - b0 : hi - b0]
            product = (part @ vec[lo - start : hi - start]).astype(np.float64)
            total = product if total is None else total + product
        assert total is not None  # the range is non-empty, so some block overlaps it
        return total

    def _row(self, row: int) -> np.ndarray:
        """A copy of the stored vector in ``row``."""
        return np.concatenate([block[row] for block in self._blocks])

    def _set_row(self, row: int, unit: np.ndarray) -> None:
        for (start, stop), block in zip(self._spans, self._blocks, strict=True):
            block[row] = unit[start:stop]

    def _take_row(self) -> int:
        if self._free:
            return self._free.pop()
        row = len(self._row_ids)
        if row >= self.capacity:
            self._grow(self.capacity * 2)
        self._row_ids.append(None)
        return row

    def _grow(self, size: int) -> None:
        """Reallocate the matrix (and the live flags) with room for ``size`` rows."""
        used = len(self._row_ids)
        grown = []
        for block in self._blocks:
            bigger = np.zeros((size, block.shape[1]), dtype=np.float32)
            bigger[:used] = block[:used]
            grown.append(bigger)
        alive = np.zeros(size, dtype=bool)
        alive[:used] = self._alive[:used]
        self._blocks, self._alive = grown, alive
