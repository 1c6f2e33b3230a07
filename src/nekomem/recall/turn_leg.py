"""Beyond the reference: journal turns as recall candidates (tiers ``turn`` and ``journal``).

A :class:`TurnCorpus` is a BM25 index (the index's own lexical analysis) over a set of
journal rows. Recall builds one over the newest turns that no long-term memory covers
(:mod:`nekomem.stores.turn_coverage`: not mined yet, their extraction failed or is backed
off, or no model at all) and adds its ranking to the index's legs as one more leg of the
Reciprocal Rank Fusion: its rows are of tier ``turn``. A character without any long-term
entry searches its newest turns whether covered or not (tier ``journal``,
:mod:`nekomem.recall.journal_fallback`).

A turn row is a result row like a fact's, with the turn's time as ``created_at`` and
``event_start_at``, the speaker as ``entity`` (``master`` for the user, ``neko`` for the
character) and the write request that stored it as ``session_id``. Its id is
``turn_<row id>`` (``journal_<row id>``).

With ``recall_turn_vectors`` the uncovered turns are embedded in the background (in memory
only, recomputed at each activation) and get one vector leg per embedding model beside
their BM25 leg, fused like the index's legs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.theater import is_theater
from nekomem.domain.turns import parse_timestamp
from nekomem.models.embeddings import VectorLeg
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.query_text import LexicalAnalyzer
from nekomem.recall.timewindow import TimeWindow
from nekomem.stores.timeindex_read import TimeIndexRow

TURN_TIER = "turn"
JOURNAL_TIER = "journal"
TURN_TIERS = frozenset({TURN_TIER, JOURNAL_TIER})


class TurnCorpus:
    """BM25 over journal rows, as entries of ``tier``; system and theater rows and empty
    turns are left out. ``key`` is what the rows were read for (the caller's cache key);
    :meth:`sync` brings the corpus to another set of rows, indexing only the new ones."""

    def __init__(
        self, rows: Sequence[TimeIndexRow], tier: str, analyzer: LexicalAnalyzer, settings: RecallSettings, key: object = None
    ) -> None:
        self.key = key
        self.tier = tier
        self.s = settings
        self.analyzer = analyzer
        self.lexical = LexicalIndex(settings)
        self.entries: dict[str, IndexEntry] = {}
        self.sessions: dict[str, str] = {}
        self.row_ids: set[int] = set()  # every row taken, indexed or left out
        # Vectors of the turns under the embedding model ``vector_model`` (kept in memory only).
        self.vectors: dict[str, np.ndarray] = {}
        self.vector_model: str | None = None
        self.embedding: set[str] = set()  # ids handed to an embedding job not back yet
        self._add(rows)

    def _add(self, rows: Sequence[TimeIndexRow]) -> None:
        for row in rows:
            self.row_ids.add(row.id)
            turn = row.turn
            if turn.role == "system" or not turn.text.strip() or is_theater(turn):
                continue
            doc_id = f"{self.tier}_{row.id}"
            self.entries[doc_id] = IndexEntry(
                id=doc_id,
                tier=self.tier,
                text=turn.text,
                entity="master" if turn.role == "human" else "neko",
                created_at=turn.ts or None,
                event_start_at=turn.ts or None,
            )
            self.sessions[doc_id] = row.session_id or ""
            self.lexical.add(doc_id, self.analyzer.document(turn.text))

    def sync(self, ids: Sequence[int], fetch: Callable[[list[int]], Sequence[TimeIndexRow]], key: object) -> None:
        """Hold exactly the rows ``ids``: rows no longer among them (covered, erased, or
        pushed out by newer ones) are dropped, the new ones read through ``fetch`` and
        indexed. Raises what ``fetch`` raises (then the corpus is unchanged but for drops)."""
        wanted = set(ids)
        for row_id in self.row_ids - wanted:
            doc_id = f"{self.tier}_{row_id}"
            self.lexical.remove(doc_id)
            self.entries.pop(doc_id, None)
            self.sessions.pop(doc_id, None)
            self.vectors.pop(doc_id, None)
        self.row_ids &= wanted
        new = sorted(wanted - self.row_ids)
        if new:
            self._add(fetch(new))
            self.row_ids |= set(new)  # unreadable rows too: not fetched again
        self.key = key

    # -- vectors ---------------------------------------------------------------------
    def use_model(self, model: str | None) -> None:
        """Keep vectors of ``model`` only (None: none); another model drops them all."""
        if model != self.vector_model:
            self.vectors.clear()
            self.embedding.clear()
            self.vector_model = model

    def missing(self) -> list[str]:
        """The ids of the turns without a vector and not being embedded, oldest row first."""
        return [doc_id for doc_id in self.entries if doc_id not in self.vectors and doc_id not in self.embedding]

    def store(self, model: str, ids: Sequence[str], vectors: np.ndarray | None) -> None:
        """Vectors of ``ids`` (rows of ``vectors``, None: the job failed) came back for ``model``."""
        self.embedding.difference_update(ids)
        if vectors is None or model != self.vector_model or len(vectors) != len(ids):
            return
        for doc_id, row in zip(ids, vectors, strict=True):
            if doc_id in self.entries:
                self.vectors[doc_id] = np.asarray(row, dtype=np.float32)

    def vector_legs(
        self, qvec: np.ndarray, legs: Sequence[VectorLeg], threshold: float, depth: int, allowed: set[str] | None = None
    ) -> list[list[str]]:
        """One ranking per model (``legs``: the models' columns, none for a single model)
        of the turns that have a vector, by cosine to ``qvec``, each cut to ``depth`` hits
        scoring at least the model's threshold (``threshold`` when it has none of its own)."""
        ids = [d for d in self.vectors if allowed is None or d in allowed]
        if not ids or depth <= 0:
            return []
        matrix = np.stack([self.vectors[d] for d in ids])
        spans = [(leg.start, leg.stop, threshold if leg.recall_threshold is None else leg.recall_threshold) for leg in legs]
        if not spans:
            spans = [(0, matrix.shape[1], threshold)]
        out: list[list[str]] = []
        for start, stop, floor in spans:
            part, query = matrix[:, start:stop], np.asarray(qvec, dtype=np.float32)[start:stop]
            norms = np.linalg.norm(part, axis=1) * max(float(np.linalg.norm(query)), 1e-12)
            cosines = (part @ query) / np.maximum(norms, 1e-12)
            order = np.argsort(-cosines, kind="stable")[:depth]
            out.append([ids[i] for i in order.tolist() if cosines[i] >= floor])
        return out

    def __len__(self) -> int:
        return len(self.entries)

    def inside(self, window: TimeWindow) -> set[str]:
        """The ids of the turns whose time lies in ``window`` (undated turns never do)."""
        out: set[str] = set()
        for doc_id, entry in self.entries.items():
            if not entry.created_at:
                continue
            try:
                when = parse_timestamp(entry.created_at)
            except ValueError:
                continue
            if window.contains(when):
                out.add(doc_id)
        return out

    def leg(self, query: str, depth: int, allowed: set[str] | None = None) -> list[tuple[str, float]]:
        """The best ``depth`` turns for ``query`` (scores at least recall_bm25_threshold)
        inside ``allowed`` (None: all), best first. Never raises on text."""
        if allowed is not None and not allowed:
            return []
        return self.lexical.search(self.analyzer.query(query), depth, allowed, min_score=self.s.recall_bm25_threshold)
