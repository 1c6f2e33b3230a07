"""The search index of the public knowledge packs, built from nekomem's recall pieces.

One :class:`~nekomem.recall.lexical.LexicalIndex` (BM25 over the recall tokenizer: words,
CJK n-grams cut at script changes, Hangul words) holds every entry of every pack; a
:class:`~nekomem.recall.vectors.VectorIndex` holds the entries that have a vector (packs
whose local vectors are on, once the embedding model is ready). A lookup thresholds each
leg and fuses them by Reciprocal Rank Fusion (:func:`~nekomem.recall.fusion.rrf`) as
``/query_memory`` does: when the vectors hold two models (``use+e5``), each model's columns
are a leg of their own with that model's cosine threshold (one model's "unrelated" is
another's "close").

Document ids are ``<pack_id>\\x1f<title key>`` (:func:`entry_id`). Which entries may be
returned (enabled packs, material type, disabled titles) is the caller's predicate. Not
thread-safe: the knowledge service calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.domain.knowledge_pack import PackEntry
from nekomem.models.embeddings import VectorLeg
from nekomem.recall.fusion import leg_top, rrf
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.vectors import VectorIndex

SEP = "\x1f"


def entry_id(pack_id: str, key: str) -> str:
    return f"{pack_id}{SEP}{key}"


def pack_of(doc_id: str) -> str:
    return doc_id.split(SEP, 1)[0]


class KnowledgeIndex:
    """BM25 + vector legs over pack entries, fused by RRF."""

    def __init__(self, settings: RecallSettings | None = None) -> None:
        self.settings = settings or RecallSettings()
        self.lexical = LexicalIndex(self.settings)
        self.vectors: VectorIndex | None = None
        self.entries: dict[str, PackEntry] = {}
        self._by_pack: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def pack_ids(self) -> set[str]:
        return set(self._by_pack)

    def add(self, pack_id: str, entry: PackEntry) -> str:
        """Index one entry (replacing an entry of the same id); returns its id."""
        doc_id = entry_id(pack_id, entry.key)
        self.lexical.update(doc_id, entry.search_text())
        if doc_id not in self.entries:
            self._by_pack.setdefault(pack_id, []).append(doc_id)
        self.entries[doc_id] = entry
        return doc_id

    def set_vector(self, doc_id: str, vector: np.ndarray, legs: Sequence[VectorLeg] = ()) -> None:
        """Attach a vector to an indexed entry (``legs``: the models inside it, when several;
        a change of dimension starts the vectors over)."""
        if doc_id not in self.entries:
            return
        if self.vectors is None or self.vectors.dim != vector.shape[0]:
            cuts = [leg.start for leg in legs[1:]] if len(legs) > 1 else []
            self.vectors = VectorIndex(int(vector.shape[0]), self.settings, blocks=cuts)
        self.vectors.upsert(doc_id, vector)

    def has_vector(self, doc_id: str) -> bool:
        return self.vectors is not None and doc_id in self.vectors

    def drop_vectors(self, pack_id: str) -> None:
        if self.vectors is not None:
            for doc_id in self._by_pack.get(pack_id, ()):
                self.vectors.remove(doc_id)

    def remove_pack(self, pack_id: str) -> int:
        """Forget every entry of a pack (text and vectors); returns how many."""
        ids = self._by_pack.pop(pack_id, [])
        for doc_id in ids:
            self.lexical.remove(doc_id)
            self.entries.pop(doc_id, None)
            if self.vectors is not None:
                self.vectors.remove(doc_id)
        return len(ids)

    def ids_of(self, pack_id: str) -> list[str]:
        return list(self._by_pack.get(pack_id, ()))

    def search(
        self,
        query: str,
        limit: int,
        allowed: Callable[[str], bool],
        query_vector: np.ndarray | None = None,
        vector_allowed: Callable[[str], bool] | None = None,
        legs: Sequence[VectorLeg] = (),
    ) -> tuple[list[tuple[str, float]], int, int]:
        """The best ``limit`` entries for ``query`` as ``(id, fused score)``, best first, and
        the sizes of the lexical and vector legs. ``vector_allowed`` narrows the vector
        legs further (packs whose local vectors are off); ``legs`` are the models inside the
        vectors (one vector leg each when there are several)."""
        s = self.settings
        lexical = self.lexical.search(query, s.recall_budget_each, allowed, min_score=s.recall_bm25_threshold)
        rankings = [leg_top(lexical, s.recall_budget_each, s.recall_bm25_threshold)]
        vector_hits = 0
        if query_vector is not None and self.vectors is not None and self.vectors.dim == query_vector.shape[0]:
            accept = allowed if vector_allowed is None else (lambda i: allowed(i) and vector_allowed(i))
            for hits in self._vector_legs(query_vector, accept, legs):
                rankings.append([doc_id for doc_id, _ in hits])
                vector_hits += len(hits)
        fused = rrf(rankings, s.recall_rrf_k, s.recall_budget_total)
        return fused[: max(limit, 0)], len(lexical), vector_hits

    def _vector_legs(self, qvec: np.ndarray, accept: Callable[[str], bool], legs: Sequence[VectorLeg]) -> list[list[tuple[str, float]]]:
        """Each model's hits above its own cosine threshold (one leg over every column when
        the vectors hold one model)."""
        s = self.settings
        assert self.vectors is not None
        k = s.recall_budget_each
        if len(legs) < 2:
            threshold = legs[0].recall_threshold if legs and legs[0].recall_threshold is not None else s.recall_cosine_threshold
            return [self.vectors.search(qvec, k, accept, min_score=threshold)]
        out = []
        for leg in legs:
            threshold = s.recall_cosine_threshold if leg.recall_threshold is None else leg.recall_threshold
            try:
                # A leg's columns hold its unit vector times its weight: compare in its own cosine.
                hits = self.vectors.search(qvec, k, accept, min_score=threshold * leg.weight, columns=(leg.start, leg.stop))
            except ValueError:
                hits = []
            out.append([(doc_id, score / leg.weight) for doc_id, score in hits])
        return out

    def browse(self, query: str, allowed: Callable[[str], bool], k: int) -> list[str]:
        """Ids of entries matching ``query`` lexically (any score above 0), best first."""
        return [doc_id for doc_id, _ in self.lexical.search(query, k, allowed)]

    def ordered(self, pack_ids: Iterable[str]) -> list[str]:
        """Every entry id of these packs, pack by pack in the given order, entries in pack order."""
        return [doc_id for pack_id in pack_ids for doc_id in self._by_pack.get(pack_id, ())]
