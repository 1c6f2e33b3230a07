"""Public knowledge lookups: ``/internal/knowledge/query`` within its budget.

A lookup takes one of QUERY_CONCURRENCY slots (none free: ``busy``), embeds the query on
a thread of its own while the budget allows (a late vector is dropped: BM25 alone), then
searches and renders under the lock. The last lookups are kept for
``/diagnostics/recent`` as metadata only (never the query or a text).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import numpy.typing as npt

from nekomem.domain import knowledge_pack as kp
from nekomem.domain.knowledge_render import Card, best_excerpt, render_block
from nekomem.recall.knowledge_index import SEP
from nekomem.recall.tokenize import Tokenizer
from nekomem.runtime.knowledge_state import DIAGNOSTICS_KEPT, KnowledgeState, pack_of_key
from nekomem.stores.knowledge import Registry

log = logging.getLogger("nekomem.knowledge")

# The reference's query limits (knowledge/service.py), part of the protocol.
DEFAULT_QUERY_BUDGET_MS = 1_500
MIN_QUERY_BUDGET_MS = 50
MAX_QUERY_BUDGET_MS = 5_000
MAX_QUERY_CHARS = 2_000
MAX_QUERY_LIMIT = 10
QUERY_CONCURRENCY = 4
# Left of the budget for the search and the rendering when the query's vector is awaited.
VECTOR_RESERVE_SECONDS = 0.05


class KnowledgeLookup:
    """Lookups over the shared state (see the module docstring)."""

    def __init__(self, st: KnowledgeState) -> None:
        self.st = st
        self._terms = Tokenizer(st.index.settings)
        self._query_slots = threading.BoundedSemaphore(QUERY_CONCURRENCY)
        self._embed_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-query-embed")
        self._queries: collections.deque[dict[str, Any]] = collections.deque(maxlen=DIAGNOSTICS_KEPT)

    def stop(self) -> None:
        self._embed_pool.shutdown(wait=False, cancel_futures=True)

    def diagnostics(self) -> dict[str, Any]:
        """The last lookups and vector batches: metadata only, never a query or a text."""
        return {"queries": list(self._queries), "index_batches": list(self.st.batches)}

    def _allowed(self, registry: Registry, material_type: str) -> Callable[[str], bool]:
        wanted = kp.MATERIAL_TYPES if material_type in ("", "auto", "all") else (material_type,)
        visible = {
            self.st.current(pack_id): record
            for pack_id, record in registry.packs.items()
            if record.effective_material_type in wanted and self.st.current(pack_id) is not None
        }
        disabled = {key: set(record.disabled_titles) for key, record in visible.items()}

        def allowed(doc_id: str) -> bool:
            key, _, title = doc_id.partition(SEP)
            titles = disabled.get(key)
            return titles is not None and title not in titles

        return allowed

    def _vector_allowed(self, registry: Registry) -> Callable[[str], bool]:
        keys = {self.st.current(p) for p, r in registry.packs.items() if r.local_embedding}
        return lambda doc_id: doc_id.partition(SEP)[0] in keys

    def query(self, *, query: str, mode: str, material_type: str, limit: int, budget_ms: int, language: str | None) -> dict[str, Any]:
        """Look entries up (``lookup``) or sample entries by tag (``sample``) within the
        budget; never raises. ``result`` is matched, miss, timeout, busy, disabled or
        unavailable; ``context`` is the fenced block (empty unless matched)."""
        started = time.monotonic()
        mode = mode if mode in ("lookup", "sample") else "lookup"
        text = query.strip()[:MAX_QUERY_CHARS]
        limit = min(max(limit, 1), MAX_QUERY_LIMIT)
        budget = min(max(budget_ms or DEFAULT_QUERY_BUDGET_MS, MIN_QUERY_BUDGET_MS), MAX_QUERY_BUDGET_MS) / 1000
        deadline = started + budget
        extra: dict[str, Any] = {}
        if self.st.state != "ready":
            return self._answer("unavailable", started, mode)
        if not self.st.registry.enabled:
            return self._answer("disabled", started, mode)
        if not text:
            return self._answer("miss", started, mode)
        if not self._query_slots.acquire(blocking=False):
            return self._answer("busy", started, mode)
        try:
            registry = self.st.registry
            qvec = self._query_vector(text, deadline) if mode == "lookup" else None
            if time.monotonic() > deadline:
                return self._answer("timeout", started, mode)
            with self.st.lock:
                allowed = self._allowed(registry, material_type)
                if mode == "sample":
                    ids = self._sample(text, allowed, limit)
                    retrieval, lex, sem = "sample", len(ids), 0
                else:
                    hits, lex, sem = self.st.index.search(text, limit, allowed, qvec, self._vector_allowed(registry), self.st.legs())
                    ids = [doc_id for doc_id, _ in hits]
                    retrieval = "hybrid" if qvec is not None else "bm25"
                extra = {"retrieval_mode": retrieval, "lexical_candidates": lex, "semantic_candidates": sem}
                if not ids:
                    return self._answer("miss", started, mode, **extra)
                hits_json, cards = self._cards(ids, registry, text if mode == "lookup" else "")
            if time.monotonic() > deadline:
                return self._answer("timeout", started, mode, **extra)
            return self._answer("matched", started, mode, hits=hits_json, context=render_block(cards, language), **extra)
        except Exception as exc:
            log.warning("knowledge query failed: %s", type(exc).__name__, exc_info=True)
            return self._answer("error", started, mode, error_type=type(exc).__name__, **extra)
        finally:
            self._query_slots.release()

    def _query_vector(self, text: str, deadline: float) -> npt.NDArray[np.float32] | None:
        """The query's vector when the embedder answers in time (a late one is dropped and
        the lookup is BM25 alone)."""
        if (
            self.st.index.vectors is None
            or len(self.st.index.vectors) == 0
            or self.st.embedder is None
            or self.st.embedder.state != "ready"
        ):
            return None
        future: Future[npt.NDArray[np.float32] | None] = self._embed_pool.submit(self.st.embed, [text], "query")
        try:
            rows = future.result(timeout=max(deadline - time.monotonic() - VECTOR_RESERVE_SECONDS, 0.0))
        except FutureTimeout:
            return None
        return None if rows is None else rows[0]

    def _sample(self, tag: str, allowed: Callable[[str], bool], limit: int) -> list[str]:
        wanted = tag.casefold()
        found = [d for d, e in self.st.index.entries.items() if allowed(d) and any(t.casefold() == wanted for t in e.tags)]
        return found[:limit]

    def _cards(self, ids: list[str], registry: Registry, query: str) -> tuple[list[dict[str, str]], list[Card]]:
        hits: list[dict[str, str]] = []
        cards: list[Card] = []
        for doc_id in ids:
            entry = self.st.index.entries.get(doc_id)
            pack_id = pack_of_key(doc_id)
            record = registry.packs.get(pack_id)
            if entry is None or record is None:
                continue
            kind = record.effective_material_type
            excerpt = best_excerpt(entry.content, lambda t: set(self._terms(t)), query)
            cards.append(Card(entry.title, kind, entry.summary, excerpt, record.source.name, record.source.license))
            hits.append({"pack_id": pack_id, "title": entry.title, "material_type": kind})
        return hits, cards

    def _answer(self, result: str, started: float, mode: str, **extra: Any) -> dict[str, Any]:
        elapsed = int((time.monotonic() - started) * 1000)
        hits = extra.get("hits") or []
        self._queries.appendleft(
            {
                "timestamp": self.st.now(),
                "mode": mode,
                "result": result,
                "retrieval_mode": extra.get("retrieval_mode", ""),
                "embedding_service_state": self.st.embedding_state(),
                "lexical_candidates": extra.get("lexical_candidates", 0),
                "semantic_candidates": extra.get("semantic_candidates", 0),
                "hits": len(hits),
                "elapsed_ms": elapsed,
                "error_type": extra.get("error_type", ""),
            }
        )
        return {
            "result": result,
            "context": extra.get("context", ""),
            "hits": hits,
            "card_ids": [f"{h['pack_id']}/{kp.title_key(h['title'])}" for h in hits],
            "retrieval_mode": extra.get("retrieval_mode", ""),
            "elapsed_ms": elapsed,
        }
