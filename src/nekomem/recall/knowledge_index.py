"""The search index of the public knowledge packs, built from nekomem's recall pieces.

One :class:`~nekomem.recall.lexical.LexicalIndex` (BM25 over the recall tokenizer: words,
CJK n-grams cut at script changes, Hangul words) holds every entry of every pack; a
:class:`~nekomem.recall.vectors.VectorIndex` holds the entries that have a vector (packs
whose local vectors are on, once the embedding model is ready). A lookup thresholds each
leg and fuses them by Reciprocal Rank Fusion (:func:`~nekomem.recall.fusion.fuse_legs`).

Document ids are ``<pack_id>\\x1f<title key>`` (:func:`entry_id`). Which entries may be
returned (enabled packs, material type, disabled titles) is the caller's predicate. Not
thread-safe: the knowledge service calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.domain.knowledge_pack import PackEntry
from nekomem.recall.fusion import fuse_legs
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

    def set_vector(self, doc_id: str, vector: np.ndarray) -> None:
        """Attach a vector to an indexed entry (a model change of dimension starts over)."""
        if doc_id not in self.entries:
            return
        if self.vectors is None or self.vectors.dim != vector.shape[0]:
            self.vectors = VectorIndex(int(vector.shape[0]), self.settings)
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
    ) -> tuple[list[tuple[str, float]], int, int]:
        """The best ``limit`` entries for ``query`` as ``(id, fused score)``, best first, and
        the sizes of the lexical and vector legs. ``vector_allowed`` narrows the vector
        leg further (packs whose local vectors are off)."""
        s = self.settings
        lexical = self.lexical.search(query, s.recall_budget_each, allowed, min_score=s.recall_bm25_threshold)
        vector: list[tuple[str, float]] = []
        if query_vector is not None and self.vectors is not None and self.vectors.dim == query_vector.shape[0]:
            accept = allowed if vector_allowed is None else (lambda i: allowed(i) and vector_allowed(i))
            vector = self.vectors.search(query_vector, s.recall_budget_each, accept, min_score=s.recall_cosine_threshold)
        fused = fuse_legs(lexical, vector, s)
        return fused[: max(limit, 0)], len(lexical), len(vector)

    def browse(self, query: str, allowed: Callable[[str], bool], k: int) -> list[str]:
        """Ids of entries matching ``query`` lexically (any score above 0), best first."""
        return [doc_id for doc_id, _ in self.lexical.search(query, k, allowed)]

    def ordered(self, pack_ids: Iterable[str]) -> list[str]:
        """Every entry id of these packs, pack by pack in the given order, entries in pack order."""
        return [doc_id for pack_id in pack_ids for doc_id in self._by_pack.get(pack_id, ())]
