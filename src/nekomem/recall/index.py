"""One character's recall index: BM25 over every searchable entry, vectors over facts and
reflections, and the searches recall runs over them. A plain object (no actor, no
threads): RecallActor owns one and feeds it; tests drive it directly.

Documents enter through :meth:`RecallIndex.upsert`. The lexical side is updated at once;
the vector side, while a model is attached (:meth:`attach_model`), reuses a vector cached
on the entry when its model id and text sha256 still match, and otherwise lists the entry
as needing one (:attr:`need`); the caller computes those in batches
(:meth:`take_backfill` / :meth:`store_backfill`).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, tzinfo

import numpy as np
import numpy.typing as npt

from nekomem.config.recall import RecallSettings
from nekomem.domain import vector_codec
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import Address, tier_family, tier_owners, vector_tiers
from nekomem.domain.subjects import Subject, SubjectIndex
from nekomem.models.embeddings import VectorLeg
from nekomem.recall.consensus import Signal, consensus_ranking, pool_of
from nekomem.recall.doc_table import DocTable
from nekomem.recall.entry import (
    IndexedDoc,
    event_interval,
    indexable,
)
from nekomem.recall.fusion import leg_top, rrf, same_time_leg
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.query_text import LexicalAnalyzer
from nekomem.recall.segment import LoadedBase
from nekomem.recall.timewindow import TimeWindow
from nekomem.recall.vectors import VectorIndex
from nekomem.recall.vectors import units as vector_units

Vectors = npt.NDArray[np.float32]
# owner child -> entry id -> (encoded vector, model id, text sha256)
ComputedVectors = dict[Address, dict[str, tuple[str, str, str]]]


# Rows of a vector block decoded and stored at a time at a wake (bounds the float32 copies).
_BLOCK_SLICE = 8192


class _CachedBatch:
    """The cached vectors of new documents met by one :meth:`RecallIndex.upsert`, in order,
    waiting to be decoded and stored together."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.vectors: list[object] = []
        self.shas: list[str] = []
        self.seen: set[str] = set()

    def add(self, doc_id: str, vector: object, sha: str) -> None:
        self.ids.append(doc_id)
        self.vectors.append(vector)
        self.shas.append(sha)
        self.seen.add(doc_id)

    def clear(self) -> None:
        self.ids, self.vectors, self.shas = [], [], []
        self.seen = set()


@dataclass(frozen=True)
class StoredVectors:
    """Cached vectors of facts kept apart from their entries: ``wire[i]`` (little-endian
    float16, the bytes a cached vector's base64 holds) is the vector of the fact ``ids[i]``
    under ``model``."""

    model: str
    ids: list[str]
    wire: np.ndarray


class RecallIndex:
    """The lexical and vector indexes of one character and the searches over them."""

    def __init__(self, settings: RecallSettings, tz: tzinfo, analyzer: LexicalAnalyzer) -> None:
        self.s = settings
        self.tz = tz
        self.analyzer = analyzer
        self.docs = DocTable()
        # Stop names are stripped by the analyzer, before stemming, so the index gets none.
        self.lexical = LexicalIndex(settings)
        self.vectors: VectorIndex | None = None
        self.vector_model: str | None = None
        # With two models in the vectors, recall searches each one's columns as a leg.
        self.vector_legs: tuple[VectorLeg, ...] = ()
        self.need: dict[str, str] = {}  # id -> sha of the text waiting for a vector
        self.subjects = SubjectIndex()  # which subject's corpus each entry belongs to
        self._time_cache: tuple[list[str], npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

    # -- feed ----------------------------------------------------------------------------
    def upsert(self, entries: Iterable[IndexEntry], replace_tier: str | None = None) -> None:
        """Add or update ``entries``; with ``replace_tier`` they are the complete set of that
        tier's family and every other entry of the family is dropped."""
        entries = list(entries)
        if replace_tier is not None:
            family = tier_family(replace_tier)
            keep = {e.id for e in entries}
            for doc_id in [i for i in self.docs.ids_in_tiers(family) if i not in keep]:
                self._drop(doc_id)
        # New documents' cached vectors are decoded and stored together (a wake's feed holds
        # tens of thousands), in runs that keep every row, sum and waiting entry as one by one.
        batch = _CachedBatch() if self.vectors is not None else None
        for entry in entries:
            self._put(entry, batch)
        self._adopt_batch(batch)
        self._time_cache = None

    def adopt(self, entries: Iterable[IndexEntry], replace_tier: str) -> None:
        """:meth:`upsert` of an owner's complete feed when it is known to describe exactly
        what the loaded base holds (the same view files): a base document takes its entry
        as it is (no text compared, nothing tokenised); any other entry is upserted."""
        entries = list(entries)
        rest: list[IndexEntry] = []
        for entry in entries:
            doc = self.docs.get(entry.id)
            if doc is not None and not doc.resolved and doc.tier == entry.tier and indexable(entry):
                doc.resolve(entry)
                # The same record of the same view: a vector the document already holds
                # (taken from the segment's vector block) is the one this entry caches.
                self._put_vector(entry, doc, True)
            else:
                rest.append(entry)
        keep = {e.id for e in entries}
        family = tier_family(replace_tier)
        for doc_id in [i for i in self.docs.ids_in_tiers(family) if i not in keep]:
            self._drop(doc_id)
        for entry in rest:
            self._put(entry)
        self._time_cache = None

    def load_base(self, base: LoadedBase) -> None:
        """Take the rows of a persisted segment as documents (see :class:`LoadedBase`): the
        lexical postings as they are, each entry decoded on first use. Raises ValueError
        when the index is not empty or the base does not hold together."""
        if self.docs:
            raise ValueError("a base is loaded into an empty index only")
        id_row = dict(zip(base.ids, range(len(base.ids)), strict=True))
        if len(id_row) != len(base.ids):
            raise ValueError("segment ids are not unique")
        self.lexical.load_base(base.ids, base.lexical, id_row.copy())
        self.docs.load_base(base, id_row)
        private = base.private.astype(bool)
        self.subjects.put_private(base.ids if private.all() else [base.ids[row] for row in np.flatnonzero(private).tolist()])
        for row in np.flatnonzero(~private).tolist():
            self.subjects.put(base.ids[row], self.docs[base.ids[row]].entry)
        self._time_cache = None

    def unresolved(self) -> list[str]:
        """Ids of base documents whose entry was neither decoded nor handed over."""
        return self.docs.unresolved()

    def family_rows(self, owner_tiers: Collection[str]) -> tuple[list[str], list[IndexedDoc]]:
        """The ids and documents of ``owner_tiers``, in index order (a segment's rows)."""
        ids = [i for i, d in self.docs.items() if d.tier in owner_tiers]
        return ids, [self.docs[i] for i in ids]

    def remove(self, ids: Iterable[str]) -> None:
        """Drop the entries ``ids`` (unknown ids are ignored)."""
        for doc_id in ids:
            self._drop(doc_id)
        self._time_cache = None

    def _put(self, entry: IndexEntry, batch: _CachedBatch | None = None) -> None:
        if not entry.id:
            return
        if not indexable(entry):
            self._adopt_batch(batch)
            self._drop(entry.id)
            return
        old = self.docs.get(entry.id)
        same_text = old is not None and old.entry.text == entry.text
        start, end = event_interval(entry, self.tz)
        doc = self.docs[entry.id] = IndexedDoc(entry, start, end, sha=old.sha if same_text and old is not None else None)
        self.subjects.put(entry.id, entry)
        if not same_text:
            if old is not None:
                self.lexical.remove(entry.id)
            self.lexical.add(entry.id, self.analyzer.document(entry.text))
        self._put_vector(entry, doc, same_text, batch)

    def _put_vector(self, entry: IndexEntry, doc: IndexedDoc, same_text: bool, batch: _CachedBatch | None = None) -> None:
        if self.vectors is None:
            return
        if batch is not None and entry.id in batch.seen:
            self._adopt_batch(batch)  # the same id again: the first one is stored first
        if entry.tier not in vector_tiers():
            self._adopt_batch(batch)
            self.vectors.remove(entry.id)
            self.need.pop(entry.id, None)
            return
        if same_text and entry.id in self.vectors:
            return
        if (
            batch is not None
            and entry.id not in self.vectors
            and entry.vector is not None
            and entry.vector_model == self.vector_model
            and entry.text_sha256 == doc.sha
        ):
            batch.add(entry.id, entry.vector, doc.sha)
            return
        # Anything else changes the rows or the waiting list: the batch goes first.
        self._adopt_batch(batch)
        if not self._adopt_cached(entry, doc.sha):
            self.vectors.remove(entry.id)
            self.need[entry.id] = doc.sha

    def _adopt_batch(self, batch: _CachedBatch | None) -> None:
        """Store the batch's cached vectors (those that decode and have a direction) and
        list the others as waiting, in the batch's order; empty it."""
        if batch is None or not batch.ids or self.vectors is None:
            return
        rows, decoded = vector_codec.try_decode_many(batch.vectors, self.vectors.dim)
        unit, kept = vector_units(rows)
        stored = np.zeros(len(batch.ids), dtype=bool)
        stored[np.flatnonzero(decoded)[kept]] = True
        self.vectors.add_units([batch.ids[i] for i in np.flatnonzero(stored).tolist()], unit)
        for doc_id, sha, ok in zip(batch.ids, batch.shas, stored.tolist(), strict=True):
            if not ok:
                self.need[doc_id] = sha
        batch.clear()

    def _drop(self, doc_id: str) -> None:
        if self.docs.pop(doc_id, None) is None:
            return
        self.subjects.remove(doc_id)
        self.lexical.remove(doc_id)
        self.need.pop(doc_id, None)
        if self.vectors is not None:
            self.vectors.remove(doc_id)

    def visible(self, subjects: Sequence[Subject] | None) -> set[str] | None:
        """The ids a recall for ``subjects`` may see (None: the private corpus, see
        :mod:`nekomem.domain.subjects`); None means no filter is needed."""
        return self.subjects.allowed(subjects)

    # -- vectors -------------------------------------------------------------------------
    def attach_model(self, model: str, dim: int, legs: Sequence[VectorLeg] = (), stored: StoredVectors | None = None) -> bool:
        """Use vectors of ``model`` (``dim`` wide; ``legs``: the models inside them, when
        more than one). A new model empties the vector side and lists every vector-tier
        entry without a matching cached vector in :attr:`need`. Returns True when the
        vector side was rebuilt.

        ``stored``: the cached vectors of some documents read from elsewhere than their
        entries (a persisted block, :mod:`nekomem.layers.recall.persist`), taken for
        those documents in place of their entries' (whose entries are then not read);
        ignored unless it is of ``model`` and ``dim``."""
        self.vector_legs = tuple(legs) if len(legs) > 1 else ()
        if self.vector_model == model and self.vectors is not None:
            return False
        self.vectors = VectorIndex(dim, self.s, blocks=[leg.start for leg in self.vector_legs[1:]])
        self.vector_model = model
        self.need.clear()
        # The cached vectors are decoded and stored all at once (a long memory wakes with
        # tens of thousands): the same rows as _adopt_cached one by one, in the same order.
        tiers = vector_tiers()
        docs = self.docs
        given: dict[str, int] = {}
        if stored is not None and stored.model == model and stored.wire.shape[1:] == (dim,):
            facts = set(tier_family("fact")) & set(tiers)  # a block holds the facts' vectors only
            given = {doc_id: row for row, doc_id in enumerate(stored.ids) if docs.tier_of(doc_id) in facts}
        # Every document with a vector to adopt, in index order (the matrix's rows follow it,
        # as adopting them one by one did), and where its vector comes from.
        order: list[str] = []
        from_block: list[int] = []  # positions in ``order`` taken from ``stored``
        from_entry: list[int] = []  # positions in ``order`` taken from the entry's cache
        cached: list[object] = []
        for doc_id in list(docs):
            if doc_id in given:
                from_block.append(len(order))
                order.append(doc_id)
                continue
            if docs.tier_of(doc_id) not in tiers:
                continue
            doc = docs[doc_id]
            entry = doc.entry
            if entry.vector is not None and entry.vector_model == model and entry.text_sha256 == doc.sha:
                from_entry.append(len(order))
                order.append(doc_id)
                cached.append(entry.vector)
        picked = np.empty(0, dtype=np.intp)
        in_order = False
        if from_block:
            assert stored is not None
            picked = np.fromiter((given[order[i]] for i in from_block), dtype=np.intp, count=len(from_block))
            # The block's rows in index order: usually all of them, already in that order.
            in_order = len(picked) == stored.wire.shape[0] and bool((picked == np.arange(len(picked))).all())
        if in_order and not from_entry:
            assert stored is not None
            # The whole block in index order (a wake from a current block): decoded and
            # stored a slice at a time, so a long memory's float32 rows are never held
            # twice (the same rows and sum: appended in order).
            self.vectors.reserve(len(order))
            buffer = np.empty((min(_BLOCK_SLICE, len(order)), dim), dtype=np.float32)
            for lo in range(0, len(order), _BLOCK_SLICE):
                wire_rows, wire_ok = vector_codec.decode_wire_rows(stored.wire[lo : lo + _BLOCK_SLICE], out=buffer)
                unit, kept = vector_units(wire_rows[wire_ok] if not wire_ok.all() else wire_rows)
                ids = [order[lo + i] for i in np.flatnonzero(wire_ok)[kept].tolist()]
                self.vectors.add_units(ids, unit)
            self._list_waiting(tiers)
            return True
        entry_rows, decoded = vector_codec.try_decode_many(cached, dim)
        if from_block:
            assert stored is not None
            block_rows, finite = vector_codec.decode_wire_rows(stored.wire if in_order else stored.wire[picked])
            if not from_entry:
                rows, ok = block_rows, finite
            else:
                rows = np.zeros((len(order), dim), dtype=np.float32)
                ok = np.zeros(len(order), dtype=bool)
                rows[from_block], ok[from_block] = block_rows, finite
                taken = np.asarray(from_entry, dtype=np.intp)[decoded]
                rows[taken], ok[taken] = entry_rows, True
            rows = rows[ok] if not ok.all() else rows
        else:
            rows, ok = entry_rows, np.zeros(len(order), dtype=bool)
            ok[np.asarray(from_entry, dtype=np.intp)[decoded]] = True
        unit, kept = vector_units(rows)
        self.vectors.add_units([order[i] for i in np.flatnonzero(ok)[kept].tolist()], unit)
        self._list_waiting(tiers)
        return True

    def _list_waiting(self, tiers: Collection[str]) -> None:
        """List every document of ``tiers`` without a vector in :attr:`need`, in index order."""
        vectors = self.vectors
        assert vectors is not None
        docs = self.docs
        for doc_id in list(docs):
            if doc_id not in vectors and docs.tier_of(doc_id) in tiers:
                self.need[doc_id] = docs[doc_id].sha

    def detach_model(self) -> None:
        """Forget the vector side (the embedding service was disabled)."""
        self.vectors, self.vector_model = None, None
        self.need.clear()

    def vector_count(self) -> int:
        return 0 if self.vectors is None else len(self.vectors)

    def _adopt_cached(self, entry: IndexEntry, sha: str) -> bool:
        if self.vectors is None or entry.vector is None or entry.vector_model != self.vector_model or entry.text_sha256 != sha:
            return False
        vec = vector_codec.try_decode(entry.vector, self.vectors.dim)
        if vec is None:
            return False
        try:
            self.vectors.upsert(entry.id, vec)
        except ValueError:
            return False
        return True

    def take_backfill(self, batch_size: int) -> tuple[list[tuple[str, str]], list[str]]:
        """The next ``batch_size`` entries needing a vector as ``(id, sha)`` items and their
        texts; they leave :attr:`need` only when :meth:`commit_backfill` is called."""
        items = [(doc_id, self.need[doc_id]) for doc_id in itertools.islice(self.need, batch_size)]
        return items, [self.docs[doc_id].entry.text for doc_id, _ in items]

    def commit_backfill(self, items: Sequence[tuple[str, str]]) -> None:
        """The batch ``items`` was handed to the model: they no longer wait."""
        for doc_id, _ in items:
            del self.need[doc_id]

    def restore_backfill(self, items: Sequence[tuple[str, str]]) -> None:
        """A batch failed: list again the entries still present and unchanged."""
        for doc_id, sha in items:
            doc = self.docs.get(doc_id)
            if doc is not None and doc.sha == sha and doc.tier in vector_tiers():
                self.need.setdefault(doc_id, sha)

    def store_backfill(self, items: Sequence[tuple[str, str]], vectors: Vectors) -> ComputedVectors:
        """Store the computed ``vectors`` (one row per item, in order) for the entries still
        present with the same text; returns them encoded, per owner, to be cached on the
        entries. Raises AssertionError when no model is attached."""
        assert self.vectors is not None and self.vector_model is not None
        computed: ComputedVectors = {}
        for (doc_id, sha), row in zip(items, np.asarray(vectors), strict=False):
            doc = self.docs.get(doc_id)
            if doc is None or doc.sha != sha or doc.tier not in vector_tiers():
                continue  # removed or rewritten meanwhile; a newer request is queued if needed
            try:
                self.vectors.upsert(doc_id, row)
                encoded = vector_codec.encode(row)
            except (ValueError, vector_codec.VectorCodecError):
                continue
            computed.setdefault(tier_owners()[doc.tier], {})[doc_id] = (encoded, self.vector_model, sha)
        return computed

    # -- user recall ---------------------------------------------------------------------
    def hub_weight(self) -> float:
        """The hubness correction of the vector leg (0 below the minimum vector count)."""
        s = self.s
        return s.recall_vector_hub_weight if self.vector_count() >= s.recall_vector_hub_min_vectors else 0.0

    def legs(self, lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None) -> list[list[str]]:
        """The lexical and the vector leg (ids, best first) over ``allowed`` (None: all);
        one vector leg per model when the vectors hold two (:attr:`vector_legs`); then the
        consensus leg (recall_consensus_leg, :mod:`nekomem.recall.consensus`) and the
        same-time leg (recall_same_time_anchors, :func:`same_time_leg`) when they apply."""
        s = self.s
        consensus = s.recall_consensus_leg and qvec is not None and self.vector_count() > 0
        depth = max(s.recall_budget_each, s.recall_consensus_pool) if consensus else s.recall_budget_each
        lex_hits: list[tuple[str, float]] = []
        if (allowed is None or allowed) and s.recall_legs != "vector":
            lex_hits = self.lexical.search(lexical_query, depth, allowed, min_score=s.recall_bm25_threshold)
        deep = [leg_top(lex_hits, depth, s.recall_bm25_threshold)]
        for leg in self.vector_legs or (None,):
            threshold = s.recall_cosine_threshold if leg is None or leg.recall_threshold is None else leg.recall_threshold
            # The vector search has thresholded, cut and ordered its hits (hubness-corrected).
            deep.append([doc_id for doc_id, _ in self.vector_hits(qvec, allowed, leg, threshold, depth)])
        legs = [ranking[: s.recall_budget_each] for ranking in deep]
        if consensus and qvec is not None:
            legs.append(self._consensus_leg(deep, lexical_query, qvec))
        if s.recall_same_time_anchors > 0:
            same_time = same_time_leg(legs, s.recall_rrf_k, s.recall_same_time_anchors, self._event_day)
            if same_time:
                legs.append(same_time)
        return legs

    def _event_day(self, doc_id: str) -> date | None:
        """The calendar day (in the display time zone) an entry's event starts; None if undated."""
        doc = self.docs.get(doc_id)
        if doc is None or doc.start is None:
            return None
        try:
            return datetime.fromtimestamp(doc.start, self.tz).date()
        except (OverflowError, OSError, ValueError):
            return None

    def _consensus_leg(self, deep: list[list[str]], lexical_query: str, qvec: Vectors) -> list[str]:
        """The consensus leg (:mod:`nekomem.recall.consensus`) over the pool of ``deep``, the
        legs searched to recall_consensus_pool hits each."""
        s = self.s
        pool = pool_of(deep, s.recall_consensus_pool)
        if len(pool) < 2 or self.vectors is None:
            return []
        bm25 = dict(self.lexical.search(lexical_query, len(pool), pool))
        signals: list[Signal] = [(s.recall_consensus_bm25_weight, np.array([bm25.get(i, 0.0) for i in pool], dtype=np.float64))]
        rows = [self.vectors.get(i) for i in pool]
        query = np.asarray(qvec, dtype=np.float64).reshape(-1)
        centroid = self.vectors.centroid().astype(np.float64)
        hub = self.hub_weight()
        for leg in self.vector_legs or (None,):
            cut = slice(None) if leg is None else slice(leg.start, leg.stop)
            part = query[cut]
            norm = float(np.linalg.norm(part))
            if norm == 0.0 or not np.isfinite(norm):
                continue
            scale = 1.0 if leg is None else leg.weight  # a leg's columns hold its unit vector times this
            values = [
                None if row is None else float(row[cut] @ part) / (norm * scale) - hub * float(row[cut] @ centroid[cut]) / scale**2
                for row in rows
            ]
            known = [v for v in values if v is not None]
            floor = min(known) if known else 0.0  # a memory still waiting for its vector counts as the pool's worst
            signals.append((1.0, np.array([floor if v is None else v for v in values], dtype=np.float64)))
        return consensus_ranking(pool, signals, s.recall_budget_each)

    def vector_hits(
        self, qvec: Vectors | None, allowed: Collection[str] | None, leg: VectorLeg | None, threshold: float, k: int | None = None
    ) -> list[tuple[str, float]]:
        """The vector search of one leg, ``k`` hits at most (None: recall_budget_each): all
        columns, or only ``leg``'s columns (the matrix and the query sliced; scores rescaled
        to that model's own cosine: its columns hold its unit vector times ``leg.weight``).
        The hubness correction discounts the centroid of the same columns, divided by
        ``leg.weight`` so that it weighs against that model's own cosine. The recall
        playground calls it too, widened (:mod:`nekomem.recall.explain`)."""
        s = self.s
        if qvec is None or self.vectors is None or s.recall_legs == "bm25" or not (allowed is None or allowed):
            return []
        k = s.recall_budget_each if k is None else k
        try:
            hub = self.hub_weight()
            if leg is None:
                return self.vectors.search(qvec, k, allowed, min_score=threshold, hub=hub)
            columns = (leg.start, leg.stop)
            centroid = self.vectors.centroid()[leg.start : leg.stop] / leg.weight
            hits = self.vectors.search(qvec, k, allowed, min_score=threshold * leg.weight, hub=hub, centroid=centroid, columns=columns)
        except ValueError:
            return []
        return [(doc_id, score / leg.weight) for doc_id, score in hits]

    def search(
        self, text: str, qvec: Vectors | None, allowed: set[str] | None, hinted: set[str] | None
    ) -> tuple[list[tuple[IndexEntry, float]], list[list[str]]]:
        """Hybrid search of ``text`` (and its vector ``qvec`` when there is one) inside
        ``allowed`` (None: everything); the entries of ``hinted`` get a pair of legs of
        their own. Returns the fused hits best first and the legs."""
        lexical_query = self.analyzer.query(text)
        legs = self.legs(lexical_query, qvec, allowed)
        if hinted:
            # The query named a time: the same search inside that window adds two legs, so
            # entries of that time rank first without hiding the rest.
            legs += self.legs(lexical_query, qvec, hinted)
        fused = rrf(legs, self.s.recall_rrf_k, self.s.recall_budget_total)
        return [(self.docs[i].entry, round(score, 6)) for i, score in fused if i in self.docs], legs

    def _time_arrays(self) -> tuple[list[str], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        if self._time_cache is None:
            ids = [i for i, d in self.docs.items() if d.start is not None]
            starts = np.fromiter((self.docs[i].start for i in ids), dtype=np.float64, count=len(ids))
            ends = np.fromiter((self.docs[i].end for i in ids), dtype=np.float64, count=len(ids))
            self._time_cache = (ids, starts, ends)
        return self._time_cache

    def in_window(self, window: TimeWindow) -> set[str]:
        """Ids whose event interval overlaps ``window`` (start < window end, end >= start)."""
        ids, starts, ends = self._time_arrays()
        mask = (starts < window.end.timestamp()) & (ends >= window.start.timestamp())
        return {ids[i] for i in np.flatnonzero(mask).tolist()}

    def nearest_in_time(self, window: TimeWindow, limit: int, visible: Collection[str] | None = None) -> tuple[list[IndexEntry], int, int]:
        """Up to ``limit`` entries nearest to ``window`` among ``visible`` (None: all): inside
        first, then by the gap, then the later event. Returns them, the number of dated
        entries considered and how many are inside."""
        ids, starts, ends = self._time_arrays()
        if visible is not None:
            keep = np.fromiter((i in visible for i in ids), dtype=bool, count=len(ids))
            ids, starts, ends = [i for i, k in zip(ids, keep, strict=True) if k], starts[keep], ends[keep]
        ws, we = window.start.timestamp(), window.end.timestamp()
        inside = (starts < we) & (ends >= ws)
        distance = np.where(inside, 0.0, np.where(ends < ws, ws - ends, starts - we))
        order = np.lexsort((-starts, distance, (~inside).astype(np.int8)))[:limit]
        return [self.docs[ids[i]].entry for i in order.tolist()], len(ids), int(inside.sum())

    # -- maintenance recall --------------------------------------------------------------
    def coarse_rank(self, candidates: list[str], k: int, vectors: Vectors | None, n_queries: int, extra: list[str]) -> list[str]:
        """Stage-2 coarse rank: ``candidates`` by their best cosine to the first
        ``n_queries`` rows of ``vectors`` (the rows after them embed ``extra``, candidates
        the index has no vector for), cut to ``k``. Unembedded candidates keep the given
        order in a reserved quota; without vectors the answer is the given order."""
        if vectors is None or self.vectors is None:
            return candidates[:k]
        queries = vectors[:n_queries]
        own = {c: vectors[n_queries + i] for i, c in enumerate(extra)}
        scored: list[tuple[float, int, str]] = []
        unembedded: list[str] = []
        for position, cid in enumerate(candidates):
            vec = own.get(cid)
            if vec is None:
                vec = self.vectors.get(cid)
            if vec is None:
                unembedded.append(cid)
                continue
            best = float(np.max(queries @ vec))
            scored.append((-best, position, cid))  # ties keep the given (evidence) order
        scored.sort()
        embedded = [cid for _, _, cid in scored]
        # Unembedded candidates keep a reserved share so that they are not starved.
        quota = min(len(unembedded), max(1, k // (self.s.recall_coarse_oversample + 1))) if unembedded else 0
        chosen = embedded[: k - quota] + unembedded[:quota]
        if len(chosen) < k:
            rest = embedded[k - quota :] + unembedded[quota:]
            chosen += rest[: k - len(chosen)]
        return chosen

    def related(self, vectors: Vectors, per_query_k: int, cap: int, tiers: Collection[str], exclude: Collection[str]) -> list[str]:
        """The ``per_query_k`` entries nearest to each query row, merged round-robin (every
        query's first before anyone's second), deduplicated, capped at ``cap``; only
        ``tiers``, never ``exclude``. Empty without a vector side."""
        if self.vectors is None:
            return []
        tier_set, excluded, docs = set(tiers), set(exclude), self.docs

        def accept(doc_id: str) -> bool:
            doc = docs.get(doc_id)
            return doc is not None and doc.tier in tier_set and doc_id not in excluded

        per_query = [[i for i, _ in self.vectors.search(row, per_query_k, accept)] for row in vectors]
        merged: list[str] = []
        seen: set[str] = set()
        for rank in range(per_query_k):
            for hits in per_query:
                if rank < len(hits) and hits[rank] not in seen:
                    seen.add(hits[rank])
                    merged.append(hits[rank])
                    if len(merged) >= cap:
                        return merged
        return merged
