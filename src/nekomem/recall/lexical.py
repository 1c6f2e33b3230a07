"""An incremental Okapi BM25 index over short memory texts.

Writes are incremental: ``add``/``remove``/``update`` touch only the postings of the
document's own terms. A query touches only the postings of its own terms (numpy arrays
gathered and scored in bulk), so its cost grows with how many documents contain the query
terms, not with the corpus size.

Scoring (per query term t with query multiplicity w_t, over live documents):

    idf(t)   = ln((N - n_t + 0.5) / (n_t + 0.5) + 1)          (Robertson-Sparck Jones, > 0)
    sat(t,d) = tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    raw(d)   = sum_t w_t * idf(t) * sat(t, d)                 (textbook Okapi BM25)
    score(d) = raw(d) / (sum_t w_t * idf(t))                  (what ``search`` returns)

N counts every live document, empty ones included; n_t is the live document frequency;
dl is the document's token count and avgdl the mean over live documents. ``sat`` is 1.0
for a term found once in a document of average length and tends to k1 + 1 as tf grows.
So the normalised score is the idf-weighted average of ``sat`` over the query's terms
(a term missing from the document counts 0, a word missing from the corpus still weighs
in the denominator; with ``recall_bm25_skip_unseen_cjk_grams`` an n-gram missing from the
corpus does not when it is shorter than a CJK run the tokenizer could not cut (see
``Tokenizer.straddling``): a Chinese question cut into sliding n-grams is mostly n-grams
that straddle two words and exist nowhere, and they would otherwise take the largest idf
and push every hit below the threshold. A Japanese run cut at its script changes gives
word-like pieces, and an unseen piece weighs like an unseen word): 1.0 means "every query term, once, in an average-length document",
0.1 means roughly a tenth of the query's weight matched once. It does not depend on the
corpus size the way raw BM25 does, so one threshold (``recall_bm25_threshold``) fits a
3-fact and a 100k-fact memory alike. Documents scoring 0 are never returned.

New postings of a term wait in plain Python lists and move into numpy arrays (doubling)
in one assignment once ``recall_bm25_list_postings_max`` wait or a query reads the term. A query adds
each term's contributions into a scratch row indexed by document slot and reads back only
the touched slots; top-k is an argpartition (ties broken by id).

Removed documents leave dead postings behind; a term's postings are compacted the next time
a query reads them once the dead fraction passes ``recall_bm25_compact_dead_ratio``, and
the document slots are renumbered (amortised, on a write) when that fraction of all slots
is dead. Not thread-safe: one owner (an actor) calls it.

A *base* (:meth:`LexicalIndex.load_base`) is a sealed set of documents loaded from a
persisted segment (:mod:`nekomem.recall.segment`): their postings stay in the segment's
arrays as a CSR keyed by 64-bit term hashes (:func:`~nekomem.recall.segment.term_hash`),
they take the first slots, and documents added later go to the ordinary postings beside
them. A query reads a term's postings from both, so the scores are exactly those of an
index built document by document. A base document that is removed is only marked dead
(the slots are not renumbered while a base exists); :meth:`LexicalIndex.export` writes the
live documents back into one CSR for the next segment.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator

import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.recall.fusion import top_k
from nekomem.recall.segment import LexicalArrays, term_hash, term_hashes
from nekomem.recall.tokenize import Tokenizer, normalise

Allowed = Callable[[str], bool] | Collection[str] | None


class _Postings:
    """The documents containing one term.

    New postings go to two plain lists (cheap per posting); they are moved into numpy
    arrays (doubling when full) in one slice assignment once ``list_max`` are waiting or a
    query reads the term, so a query never converts more than ``list_max`` postings per
    term and a wake that indexes 50,000 documents does no numpy work per posting.
    """

    __slots__ = ("term", "slots", "tfs", "n", "tail_slots", "tail_tfs", "dead")

    def __init__(self, term: str) -> None:
        self.term = term
        self.slots: np.ndarray | None = None
        self.tfs: np.ndarray | None = None
        self.n = 0  # postings held in the arrays
        self.tail_slots: list[int] = []  # postings not yet in the arrays
        self.tail_tfs: list[int] = []
        self.dead = 0  # postings whose document was removed

    @property
    def size(self) -> int:
        """Postings held, dead ones included."""
        return self.n + len(self.tail_slots)

    @property
    def live(self) -> int:
        return self.size - self.dead

    def append(self, slot: int, tf: int, list_max: int) -> None:
        self.tail_slots.append(slot)
        self.tail_tfs.append(tf)
        if len(self.tail_slots) >= list_max:
            self._flush()

    def _flush(self) -> None:
        """Move the waiting postings into the arrays (made or grown as needed)."""
        count = len(self.tail_slots)
        need = self.n + count
        if self.slots is None or self.tfs is None or need > self.slots.shape[0]:
            capacity = max(2 * need, 1)
            slots = np.empty(capacity, dtype=np.int32)
            tfs = np.empty(capacity, dtype=np.float64)
            if self.slots is not None and self.tfs is not None:
                slots[: self.n] = self.slots[: self.n]
                tfs[: self.n] = self.tfs[: self.n]
            self.slots, self.tfs = slots, tfs
        if count:
            self.slots[self.n : need] = self.tail_slots
            self.tfs[self.n : need] = self.tail_tfs
            self.n = need
            self.tail_slots = []
            self.tail_tfs = []

    def arrays(self, alive: np.ndarray, dead_ratio: float) -> tuple[np.ndarray, np.ndarray]:
        """Slots and term frequencies of the live postings (compacting dead ones lazily)."""
        if self.tail_slots or self.slots is None:
            self._flush()
        assert self.slots is not None and self.tfs is not None
        slots, tfs = self.slots[: self.n], self.tfs[: self.n]
        if not self.dead:
            return slots, tfs
        mask = alive[slots]
        live_slots, live_tfs = slots[mask], tfs[mask]
        if self.dead > dead_ratio * self.n:
            count = live_slots.shape[0]
            self.slots[:count] = live_slots
            self.tfs[:count] = live_tfs
            self.n, self.dead = count, 0
        return live_slots, live_tfs

    def remap(self, alive: np.ndarray, remap: np.ndarray) -> None:
        """Keep the live postings only, renumbered through ``remap`` (old slot -> new slot)."""
        self._flush()
        assert self.slots is not None and self.tfs is not None
        slots, tfs = self.slots[: self.n], self.tfs[: self.n]
        mask = alive[slots]
        count = int(mask.sum())
        self.slots[:count] = remap[slots[mask]]
        self.tfs[:count] = tfs[mask]
        self.n = count
        self.dead = 0


class LexicalIndex:
    """Incremental BM25 over ``doc_id -> text`` (see the module docstring for the score)."""

    def __init__(self, settings: RecallSettings | None = None, stop_names: Iterable[str] = ()) -> None:
        s = settings or RecallSettings()
        self._k1 = s.recall_bm25_k1
        self._b = s.recall_bm25_b
        self._dead_ratio = s.recall_bm25_compact_dead_ratio
        self._compact_min = s.recall_bm25_compact_min_slots
        self._list_max = s.recall_bm25_list_postings_max
        self._tokenizer = Tokenizer(s)
        self._skip_unseen_cjk = s.recall_bm25_skip_unseen_cjk_grams
        self._stop_names: tuple[str, ...] = self._clean_names(stop_names)
        self._postings: dict[str, _Postings] = {}
        self._texts: dict[str, str] = {}
        self._id_slot: dict[str, int] = {}
        self._slot_ids: list[str | None] = []
        self._slot_posts: list[tuple[_Postings, ...] | None] = []
        capacity = s.recall_index_initial_capacity
        self._dl = np.zeros(capacity, dtype=np.float64)
        self._alive = np.zeros(capacity, dtype=bool)
        self._scratch = np.zeros(capacity, dtype=np.float64)
        self._total_len = 0
        self._dead_slots = 0
        self._base: LexicalArrays | None = None
        self._base_dead = 0  # base documents removed since the base was loaded

    def load_base(self, ids: list[str], base: LexicalArrays, id_slot: dict[str, int] | None = None) -> None:
        """Take the documents ``ids`` (row i of ``base`` is ``ids[i]``) from a persisted
        segment as the first slots, without tokenising anything (``id_slot``: id -> row,
        made by the caller when it has one, then owned by this index). Raises ValueError
        when the index is not empty or ``ids`` and ``base`` disagree."""
        if self._id_slot or self._slot_ids:
            raise ValueError("a base is loaded into an empty index only")
        n = len(ids)
        if base.dl.shape[0] != n or (base.term_ptr.shape[0] and int(base.term_ptr[-1]) != base.rows.shape[0]):
            raise ValueError("segment arrays do not match its ids")
        while self._dl.shape[0] < n + 1:
            self._grow()
        self._slot_ids = list(ids)
        self._slot_posts = [None] * n
        self._id_slot = id_slot if id_slot is not None else dict(zip(ids, range(n), strict=True))
        if len(self._id_slot) != n:
            raise ValueError("segment ids are not unique")
        self._dl[:n] = base.dl
        self._alive[:n] = True
        self._total_len = int(base.dl.sum())
        self._base = base
        self._base_dead = 0

    @property
    def has_base(self) -> bool:
        """True while documents of a persisted segment are held as a base."""
        return self._base is not None

    # ------------------------------------------------------------------ writes

    def add(self, doc_id: str, text: str) -> None:
        """Index a new document. Raises ValueError if ``doc_id`` is empty or already present."""
        if not doc_id:
            raise ValueError("doc_id must be a non-empty string")
        if doc_id in self._id_slot:
            raise ValueError(f"document {doc_id!r} is already indexed")
        text = "" if text is None else str(text)
        self._texts[doc_id] = text
        self._insert(doc_id, self._tokenizer(text, self._stop_names))

    def remove(self, doc_id: str) -> bool:
        """Drop a document; returns False (and does nothing) if it was not indexed."""
        slot = self._id_slot.pop(doc_id, None)
        if slot is None:
            return False
        self._texts.pop(doc_id, None)  # a base document has no text here
        posts = self._slot_posts[slot]
        if posts is None:
            self._base_dead += 1
        for p in posts or ():
            p.dead += 1
            if p.dead == p.size:
                del self._postings[p.term]
        self._slot_posts[slot] = None
        self._slot_ids[slot] = None
        self._alive[slot] = False
        self._total_len -= int(self._dl[slot])
        self._dead_slots += 1
        if self._dead_slots >= self._compact_min and self._dead_slots > self._dead_ratio * len(self._slot_ids):
            self._renumber()
        return True

    def update(self, doc_id: str, text: str) -> None:
        """Replace a document's text, or add it if absent (unchanged text is a no-op)."""
        text = "" if text is None else str(text)
        if self._texts.get(doc_id) == text and doc_id in self._id_slot:
            return
        self.remove(doc_id)
        self.add(doc_id, text)

    def set_stop_names(self, names: Iterable[str]) -> None:
        """Change the stop names; re-tokenises every document (only) if the set changed."""
        cleaned = self._clean_names(names)
        if cleaned == self._stop_names:
            return
        if self._base is not None:
            raise RuntimeError("the stop names of an index with a persisted base cannot change (its texts are not held)")
        self._stop_names = cleaned
        texts = list(self._texts.items())
        self._postings.clear()
        self._texts.clear()
        self._id_slot.clear()
        self._slot_ids.clear()
        self._slot_posts.clear()
        self._alive[:] = False
        self._total_len = 0
        self._dead_slots = 0
        for doc_id, text in texts:
            self.add(doc_id, text)

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        return len(self._id_slot)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._id_slot

    def ids(self) -> Iterator[str]:
        """The indexed ids (base documents first, then insertion order; updates move to the end)."""
        return iter(self._id_slot)

    @property
    def stop_names(self) -> tuple[str, ...]:
        return self._stop_names

    def search(
        self,
        query: str,
        k: int,
        allowed: Allowed = None,
        *,
        min_score: float = 0.0,
        normalised: bool = True,
    ) -> list[tuple[str, float]]:
        """The best ``k`` ``(doc_id, score)`` pairs for ``query``, best first (ties by id).

        ``allowed`` restricts the candidates: a set (or other collection) of ids, or a
        predicate on the id. Hits scoring below ``min_score`` (in the returned scale) or 0
        are dropped. ``normalised=False`` returns textbook raw BM25 instead of the
        normalised score. An empty query or index gives ``[]``; never raises on text.
        """
        n_docs = len(self._id_slot)
        if k <= 0 or n_docs == 0:
            return []
        weights = Counter(self._tokenizer(query, self._stop_names))
        if not weights:
            return []
        straddling = self._tokenizer.straddling(query, self._stop_names) if self._skip_unseen_cjk else set()
        avgdl = self._total_len / n_docs if self._total_len else 1.0
        k1, b = self._k1, self._b
        denominator = 0.0
        touched: list[np.ndarray] = []
        scratch = self._scratch
        for term, weight in weights.items():
            p = self._postings.get(term)
            base = self._base_postings(term) if self._base is not None else None
            df = (p.live if p is not None else 0) + (base[0].shape[0] if base is not None else 0)
            if not df and term in straddling:
                continue  # most likely straddles two words of a spaceless query: no evidence either way
            idf = math.log((n_docs - df + 0.5) / (df + 0.5) + 1.0)
            denominator += weight * idf
            if not df:
                continue
            slots, tfs = self._term_postings(p, base)
            norm = k1 * (1.0 - b + b * self._dl[slots] / avgdl)
            # Every contribution is > 0, so a zero in the scratch row marks a slot that no
            # earlier query term touched: the candidate union costs O(postings), no sort.
            touched.append(slots[scratch[slots] == 0.0] if touched else slots)
            scratch[slots] += (weight * idf) * (tfs * (k1 + 1.0) / (tfs + norm))
        if not touched:
            return []
        cand = touched[0] if len(touched) == 1 else np.concatenate(touched)
        scores = scratch[cand]
        scratch[cand] = 0.0
        if normalised:
            scores = scores / denominator
        keep = scores > 0.0
        if min_score > 0.0:
            keep &= scores >= min_score
        accept: Callable[[str], bool] | None = None
        if allowed is not None and not callable(allowed):
            keep &= self._allowed_mask(cand, allowed)
        elif allowed is not None:
            accept = allowed
        if not keep.all():
            cand, scores = cand[keep], scores[keep]
        slot_ids = self._slot_ids
        return top_k(cand, scores, k, lambda s: slot_ids[s], accept)  # type: ignore[arg-type,return-value]

    # ------------------------------------------------------------------ internals

    def _base_postings(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The live base postings of ``term`` (slots, float64 term frequencies), or None."""
        base = self._base
        assert base is not None
        h = np.uint64(term_hash(term))
        i = int(np.searchsorted(base.term_hash, h))
        if i >= base.term_hash.shape[0] or base.term_hash[i] != h:
            return None
        lo, hi = int(base.term_ptr[i]), int(base.term_ptr[i + 1])
        rows, tfs = base.rows[lo:hi], base.tfs[lo:hi].astype(np.float64)
        if self._base_dead:
            mask = self._alive[rows]
            rows, tfs = rows[mask], tfs[mask]
        return (rows, tfs) if rows.shape[0] else None

    def _term_postings(self, p: _Postings | None, base: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        """A term's live postings from the base and the ordinary postings together."""
        if p is None:
            assert base is not None
            return base
        slots, tfs = p.arrays(self._alive, self._dead_ratio)
        if base is None:
            return slots, tfs
        return np.concatenate((base[0], slots)), np.concatenate((base[1], tfs))

    def export(self, ids: list[str]) -> LexicalArrays:
        """The documents ``ids`` (row i is ``ids[i]``; each must be indexed) as one CSR over
        term hashes, for a segment file. Raises KeyError for an id not indexed."""
        used = len(self._slot_ids)
        slots = np.array([self._id_slot[i] for i in ids], dtype=np.int64)
        remap = np.full(max(used, 1), -1, dtype=np.int64)
        remap[slots] = np.arange(slots.shape[0], dtype=np.int64)
        hashes: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        tfs: list[np.ndarray] = []
        base = self._base
        if base is not None and base.rows.shape[0]:
            counts = np.diff(base.term_ptr)
            hashes.append(np.repeat(base.term_hash, counts))
            rows.append(remap[base.rows])
            tfs.append(base.tfs.astype(np.int64))
        # The ordinary postings (dead ones included: ``remap`` drops them), their terms
        # hashed in one pass, their arrays and waiting lists joined once each.
        postings = list(self._postings.values())
        if postings:
            codes = term_hashes([p.term for p in postings])
            held = [p for p in postings if p.n]
            if held:
                assert all(p.slots is not None and p.tfs is not None for p in held)
                hashes.append(np.repeat(codes[[i for i, p in enumerate(postings) if p.n]], [p.n for p in held]))
                rows.append(remap[np.concatenate([p.slots[: p.n] for p in held])])  # type: ignore[index]
                tfs.append(np.concatenate([p.tfs[: p.n] for p in held]).astype(np.int64))  # type: ignore[index]
            waiting = [len(p.tail_slots) for p in postings]
            if any(waiting):
                hashes.append(np.repeat(codes, waiting))
                rows.append(remap[np.fromiter(itertools.chain.from_iterable(p.tail_slots for p in postings), dtype=np.int64)])
                tfs.append(np.fromiter(itertools.chain.from_iterable(p.tail_tfs for p in postings), dtype=np.int64))
        if hashes:
            all_hash, all_rows, all_tfs = np.concatenate(hashes), np.concatenate(rows), np.concatenate(tfs)
            keep = all_rows >= 0  # dead documents and documents not asked for
            all_hash, all_rows, all_tfs = all_hash[keep], all_rows[keep], all_tfs[keep]
            order = np.lexsort((all_rows, all_hash))
            all_hash, all_rows, all_tfs = all_hash[order], all_rows[order], all_tfs[order]
            uniq, starts = np.unique(all_hash, return_index=True)
            ptr = np.append(starts, all_hash.shape[0]).astype(np.int64)
        else:
            uniq, ptr = np.zeros(0, dtype=np.uint64), np.zeros(1, dtype=np.int64)
            all_rows, all_tfs = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return LexicalArrays(
            term_hash=uniq.astype(np.uint64),
            term_ptr=ptr,
            rows=all_rows.astype(np.int32),
            tfs=all_tfs.astype(np.int32),
            dl=self._dl[slots].astype(np.int32),
        )

    def _clean_names(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({normalise(n).strip() for n in names if n and normalise(n).strip()}))

    def _allowed_mask(self, cand: np.ndarray, allowed: Collection[str]) -> np.ndarray:
        if len(allowed) < len(cand):
            slots = [self._id_slot[i] for i in allowed if i in self._id_slot]
            return np.isin(cand, np.array(slots, dtype=np.int32))
        slot_ids = self._slot_ids
        return np.fromiter((slot_ids[s] in allowed for s in cand.tolist()), dtype=bool, count=len(cand))

    def _insert(self, doc_id: str, tokens: list[str]) -> None:
        slot = len(self._slot_ids)
        if slot >= self._dl.shape[0]:
            self._grow()
        counts = Counter(tokens)
        posts = []
        postings, list_max = self._postings, self._list_max
        for term, tf in counts.items():
            p = postings.get(term)
            if p is None:
                p = postings[term] = _Postings(term)
            tail = p.tail_slots
            tail.append(slot)  # Postings.append, inlined (the hot loop of a wake)
            p.tail_tfs.append(tf)
            if len(tail) >= list_max:
                p._flush()
            posts.append(p)
        self._id_slot[doc_id] = slot
        self._slot_ids.append(doc_id)
        self._slot_posts.append(tuple(posts))
        self._dl[slot] = len(tokens)
        self._alive[slot] = True
        self._total_len += len(tokens)

    def _grow(self) -> None:
        size = self._dl.shape[0] * 2
        for name in ("_dl", "_alive", "_scratch"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def _renumber(self) -> None:
        """Drop dead slots: every live document gets a dense new slot, postings are remapped.
        Not while a base is held (its postings are the segment's arrays): its dead slots
        stay until the next segment is written."""
        if self._base is not None:
            return
        used = len(self._slot_ids)
        alive = self._alive[:used]
        remap = np.full(used, -1, dtype=np.int32)
        remap[alive] = np.arange(int(alive.sum()), dtype=np.int32)
        for p in self._postings.values():
            p.remap(alive, remap)
        keep = np.flatnonzero(alive).tolist()
        self._slot_ids = [self._slot_ids[s] for s in keep]
        self._slot_posts = [self._slot_posts[s] for s in keep]
        live = len(keep)
        self._dl[:live] = self._dl[keep]
        self._dl[live:] = 0.0
        self._alive[:live] = True
        self._alive[live:] = False
        self._id_slot = {doc_id: slot for slot, doc_id in enumerate(self._slot_ids)}  # type: ignore[misc]
        self._dead_slots = 0
