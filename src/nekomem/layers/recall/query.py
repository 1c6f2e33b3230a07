"""The query path of one character's recall: ``/query_memory`` and the playground's
explain (held until every owner has fed the index), the query's embedding and its
deadline, the search over the index and the uncovered turns, the re-ranker, and the
answer's body.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import msgspec

from nekomem.actors.messages import ExplainAnswer, ExplainQuery, QueryExpired, QueryMemory, QueryVector, Reranked, RerankExpired, Vectors
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import tier_owners
from nekomem.layers.recall.state import RecallPart, RecallState, as_vectors
from nekomem.layers.recall.vectors import VectorUpkeep
from nekomem.recall.explain import explain
from nekomem.recall.fusion import rrf
from nekomem.recall.journal_fallback import journal_hits
from nekomem.recall.names import blend_query_vectors
from nekomem.recall.query_plan import QueryPlan, plan_query
from nekomem.recall.response import empty_response, query_response, time_response
from nekomem.recall.timewindow import TimeWindow
from nekomem.recall.turn_keys import TurnKeys
from nekomem.recall.turn_leg import TurnCorpus
from nekomem.runtime.protocol import Message
from nekomem.stores.timeindex_read import TimeIndexReader
from nekomem.wire.answers import RecallAnswer


class Ranker(Protocol):
    """A re-ranker of a recall's fused candidates (the /rerank endpoint, or the chat model)."""

    def rank(self, query: str, documents: Sequence[str]) -> list[int]: ...


class QueryPath(RecallPart):
    """User recall over one character's index (see the module)."""

    def __init__(self, state: RecallState, vectors: VectorUpkeep) -> None:
        super().__init__(state)
        self.vectors = vectors
        # token -> a query (or a playground explain) waiting for its embedding, and its plan
        self.queries: dict[int, tuple[QueryMemory | ExplainQuery, QueryPlan]] = {}
        self.held: list[QueryMemory] = []
        # token -> a query waiting for the re-ranker, and its fused hits
        self.reranks: dict[int, tuple[QueryMemory, _Fused]] = {}

    def reset(self) -> None:
        """No query waits for an embedding or for the owners (at every load)."""
        self.queries = {}
        self.held = []

    def close(self) -> None:
        """Answer every query still waiting (empty, or in the fused order for a re-rank)."""
        for msg, plan in self.queries.values():
            if msg.reply is not None:
                failed = empty_response(plan.query, error=True)
                msg.reply.ok(ExplainAnswer(explanation=msgspec.to_builtins(failed)) if isinstance(msg, ExplainQuery) else failed)
        self.queries.clear()
        for query, found in self.reranks.values():
            if query.reply is not None:
                query.reply.ok(found.body())
        self.reranks.clear()
        for held in self.held:
            if held.reply is not None:
                held.reply.ok(empty_response((held.query or "").strip(), error=True))
        self.held = []

    def release_held(self) -> None:
        held, self.held = self.held, []
        for query in held:
            self.query_memory(query)

    def query_memory(self, msg: QueryMemory) -> None:
        if msg.reply is None:
            return
        if not self.fed >= set(tier_owners().values()):
            self.held.append(msg)
            return
        started = time.perf_counter()
        query = (msg.query or "").strip()[: self.s.recall_query_max_chars]
        try:
            self.vectors.sync_vectors()
            # Subject scoping is a hard filter applied before any scoring (fail closed).
            visible = self.index.visible(msg.subjects)
            now = msg.now or datetime.now(self.index.tz)
            plan = plan_query(query, msg.time or "", now, self.index, self.s, started, visible, scoped=msg.subjects is not None)
            if plan.window is None and plan.spec:
                self.log.info("recall: time expression not understood; ignored")
            if not query:
                msg.reply.ok(empty_response("") if plan.window is None else self._time_only(plan.window, plan.spec, started, visible))
                return
            if not self._embed_query(msg, plan):
                self._finish(msg, plan, None)
        except Exception:
            self.log.exception("recall query failed")
            msg.reply.ok(empty_response(query, error=True))

    def explain_query(self, msg: ExplainQuery) -> None:
        """The playground's recall: the plan, embedding and search of /query_memory, over
        the private corpus, answered with each leg explained."""
        if msg.reply is None:
            return
        self.vectors.sync_vectors()
        query = (msg.query or "").strip()[: self.s.recall_query_max_chars]
        now = msg.now or datetime.now(self.index.tz)
        plan = plan_query(query, msg.time or "", now, self.index, self.s, time.perf_counter(), self.index.visible(None))
        if not (query and self._embed_query(msg, plan)):
            self._finish(msg, plan, None)

    def _embed_query(self, msg: QueryMemory | ExplainQuery, plan: QueryPlan) -> bool:
        """Submit the embedding of ``plan``'s query to the pool (the answer finishes when it
        comes back, or from BM25 alone after recall_query_embed_timeout_seconds); False
        when vectors are off or empty, the window allows nothing, or the pool is full."""
        allowed = plan.allowed
        if self.s.recall_legs == "bm25" or not self.index.vector_count() or (allowed is not None and not allowed):
            return False
        token = self.state.next_token()

        def wrap(result: object, error: BaseException | None) -> Message:
            return QueryVector(token=token, vectors=as_vectors(result), error=None if error is None else repr(error))

        if not self.vectors.submit_embed(list(plan.vector_texts), wrap, urgent=True):
            return False
        self.queries[token] = (msg, plan)
        self.ports.deadline(self.s.recall_query_embed_timeout_seconds, QueryExpired(token=token))
        return True

    def query_vector(self, msg: QueryVector) -> None:
        pending = self.queries.pop(msg.token, None)
        if pending is None:
            return  # answered already (timed out)
        vec = None
        if msg.error is None and msg.vectors is not None and len(msg.vectors):
            vec = blend_query_vectors(list(msg.vectors), self.s.recall_query_unnamed_weight)
        else:
            self.log.info("recall: query embedding failed; answering from BM25 alone")
        self._finish(*pending, vec)

    def query_expired(self, msg: QueryExpired) -> None:
        pending = self.queries.pop(msg.token, None)
        if pending is not None:
            self.log.info("recall: query embedding timed out; answering from BM25 alone")
            self._finish(*pending, None)

    def _journal_search(self, pending: QueryPlan) -> RecallAnswer:
        """No long-term entry yet: the newest journal turns ranked by BM25 (read-only;
        RecentActor is the journal's writer). See :mod:`nekomem.recall.journal_fallback`."""
        path = self.ports.paths.time_index_db
        rows = []
        if path.exists():
            try:
                with TimeIndexReader.read_only(path) as journal:
                    rows = journal.tail_rows(self.s.recall_journal_fallback_rows)
            except sqlite3.Error:  # not created yet, or unreadable: nothing to search
                rows = []
        hits, sessions = journal_hits(rows, pending.search, self.index.analyzer, self.s)
        elapsed = round((time.perf_counter() - pending.started) * 1000, 1)
        self.log.info("recall query: no long-term entry; journal fallback over %d turns: %d hits", len(rows), len(hits))
        return query_response(hits, pending.query, len(rows), elapsed, sessions)

    def _turn_leg(self, pending: QueryPlan, qvec: Vectors | None) -> tuple[TurnCorpus | None, list[list[str]]]:
        """The rankings of the uncovered turns for ``pending`` (ids, best first): BM25, then
        one per embedding model when the turns have vectors; none for a scoped query (the
        journal is the owner's private conversation). An explicit time window keeps the
        turns inside it."""
        if pending.scoped:
            return None, []
        corpus = self.vectors.uncovered_turns()
        if corpus is None or not len(corpus):
            return corpus, []
        allowed = corpus.inside(pending.window) if pending.window is not None else None
        depth = self.s.recall_budget_each
        legs: list[list[str]] = []
        if self.s.recall_legs != "vector":
            legs.append([doc_id for doc_id, _ in corpus.leg(pending.search, depth, allowed)])
        emb = self.state.service()
        if qvec is not None and emb is not None and corpus.vector_model == emb.model_id and self.s.recall_turn_vectors:
            legs += corpus.vector_legs(
                qvec, getattr(emb, "legs", ()) if len(getattr(emb, "legs", ())) > 1 else (), self.s.recall_cosine_threshold, depth, allowed
            )
        return corpus, [leg for leg in legs if leg]

    def _covered_turns(self) -> TurnCorpus | None:
        """The newest recall_uncovered_turns covered journal turns, indexed (recall_turn_keys);
        kept while the journal's rows and coverage are unchanged. None when the journal
        does not track coverage."""
        path = self.ports.paths.time_index_db
        limit = self.s.recall_uncovered_turns
        if limit <= 0 or not path.exists():
            return None
        try:
            with TimeIndexReader.read_only(path) as journal:
                mined = journal.mined_ranges()
                if not mined:
                    return None
                top, count = journal.shape()
                key = (top, count, tuple(mined))
                if self.state.keys is None:
                    self.state.keys = TurnCorpus([], "turnkey", self.index.analyzer, self.s)
                if self.state.keys.key != key:
                    self.state.keys.sync(journal.covered_ids(mined, limit), journal.rows_by_id, key)
        except sqlite3.Error:
            self.state.keys = None
        return self.state.keys

    def _key_leg(self, pending: QueryPlan) -> list[str]:
        """recall_turn_keys: the facts whose source turns match ``pending`` best (see
        :mod:`nekomem.recall.turn_keys`); none for a scoped query or when off."""
        if not self.s.recall_turn_keys or pending.scoped or not pending.search or self.s.recall_legs == "vector":
            return []
        corpus = self._covered_turns()
        if corpus is None or not len(corpus):
            return []
        if self.state.turn_keys is None:
            self.state.turn_keys = TurnKeys(self.index.docs.items(), self.index.tz)
        if not len(self.state.turn_keys):
            return []
        depth = self.s.recall_budget_each
        hits = corpus.leg(pending.search, depth)
        return self.state.turn_keys.leg([corpus.entries[doc_id].created_at for doc_id, _ in hits], depth, pending.allowed)

    def _finish(self, msg: QueryMemory | ExplainQuery, plan: QueryPlan, qvec: Vectors | None) -> None:
        if isinstance(msg, ExplainQuery):
            if msg.reply is not None:
                msg.reply.ok(ExplainAnswer(explanation=explain(self.index, self.s, plan, qvec, msg.excluded)))
            return
        try:
            ranker = self._ranker_for(msg)
            found = self._query_search(plan, qvec, deep=ranker is not None)
            if isinstance(found, _Fused) and ranker is not None and self._rerank(msg, found, ranker):
                return  # answered when the re-ranker answers, or at its deadline
            body: object = found.body() if isinstance(found, _Fused) else found
        except Exception:
            self.log.exception("recall query failed")
            body = empty_response(plan.query, error=True)
        if msg.reply is not None:
            msg.reply.ok(body)

    def _ranker_for(self, msg: QueryMemory) -> Ranker | None:
        """Who re-ranks ``msg``'s candidates: the /rerank endpoint when one is configured,
        else, for an explicit unscoped recall, the chat model when recall_llm_rerank is on
        and its tier has an endpoint; None: the fused order."""
        if self.ports.reranker is not None:
            return self.ports.reranker
        llm = self.ports.llm_reranker
        if llm is not None and msg.explicit and msg.subjects is None and llm.ready():
            return llm
        return None

    def _query_search(self, pending: QueryPlan, qvec: Vectors | None, deep: bool = False) -> RecallAnswer | _Fused:
        """The fused hits of ``pending`` (the index's legs and the uncovered turns' leg),
        deep enough for the re-ranker when one is configured; the journal fallback's body
        for a character without any long-term entry."""
        index = self.index
        if not index.docs and pending.allowed is None and not pending.scoped and self.s.recall_journal_fallback_rows > 0:
            return self._journal_search(pending)
        pool_size = len(index.docs) if pending.allowed is None else len(pending.allowed)
        hits, legs = index.search(pending.search, qvec, pending.allowed, pending.hinted)
        corpus, turn_legs = self._turn_leg(pending, qvec)
        key_leg = self._key_leg(pending)
        reranking = deep and bool(pending.search)
        depth = max(self.s.recall_rerank_top_n, self.s.recall_budget_total) if reranking else self.s.recall_budget_total
        sessions: dict[str, str] = {}
        if (corpus is not None and turn_legs) or key_leg or depth > self.s.recall_budget_total:
            # The uncovered turns are one more leg of the fusion, as the index fuses its own
            # (and the facts found by their source turns another).
            turns = corpus.entries if corpus is not None else {}
            weights = [1.0] * len(legs) + [self.s.recall_turn_leg_weight] * len(turn_legs)
            extra = [key_leg] if key_leg else []
            weights += [self.s.recall_turn_keys_weight] * len(extra)
            fused = rrf([*legs, *turn_legs, *extra], self.s.recall_rrf_k, depth, weights)
            hits = []
            for doc_id, score in fused:
                entry = turns.get(doc_id)
                if entry is None and doc_id in index.docs:
                    entry = index.docs[doc_id].entry
                if entry is not None:
                    hits.append((entry, round(score, 6)))
                    if corpus is not None and doc_id in corpus.sessions:
                        sessions[doc_id] = corpus.sessions[doc_id]
            pool_size += len(corpus) if corpus is not None else 0
        self.log.info(
            "recall query: pool=%d vectors=%d bm25=%d cosine=%d turns=%d fused=%d window=%s time_hint=%s embedding=%s elapsed_ms=%.1f",
            pool_size,
            index.vector_count(),
            len(legs[0]),
            len(legs[1]),
            sum(len(leg) for leg in turn_legs),
            len(hits),
            pending.window is not None,
            pending.hinted is not None,
            "used" if qvec is not None else "none",
            (time.perf_counter() - pending.started) * 1000,
        )
        self.log.debug("recall query %r -> %s", pending.query, [entry.id for entry, _ in hits])
        return _Fused(pending, hits, sessions, pool_size, self.s.recall_budget_total)

    def _rerank(self, msg: QueryMemory, found: _Fused, reranker: Ranker) -> bool:
        """Hand ``found``'s candidates to ``reranker`` on the model pool; False (answer
        now, in the fused order) when there is nothing to re-order or the pool is full."""
        if len(found.hits) < 2 or msg.reply is None:
            return False
        token = self.state.next_token()
        query = found.plan.search
        texts = [entry.text for entry, _ in found.hits]

        def job() -> object:
            return reranker.rank(query, texts)

        def wrap(result: object, error: BaseException | None) -> Message:
            order = [int(i) for i in result] if isinstance(result, list) else None
            return Reranked(token=token, order=order, error=None if error is None else f"{type(error).__name__}: {error}")

        if not self.ports.run_job(job, wrap, lane="rerank"):
            return False
        self.reranks[token] = (msg, found)
        self.ports.deadline(self.s.recall_rerank_timeout_seconds, RerankExpired(token=token))
        return True

    def reranked(self, msg: Reranked) -> None:
        pending = self.reranks.pop(msg.token, None)
        if pending is None:
            return  # answered already (its deadline passed)
        query, found = pending
        if msg.order is None:
            self.log.info("recall: re-ranker failed (%s); answering in the fused order", msg.error)
        else:
            found = found.reordered(msg.order)
        if query.reply is not None:
            query.reply.ok(found.body())

    def rerank_expired(self, msg: RerankExpired) -> None:
        pending = self.reranks.pop(msg.token, None)
        if pending is not None:
            self.log.info("recall: re-ranker too slow; answering in the fused order")
            query, found = pending
            if query.reply is not None:
                query.reply.ok(found.body())

    def _time_only(self, window: TimeWindow, spec: str, started: float, visible: set[str] | None) -> RecallAnswer:
        entries, dated, inside = self.index.nearest_in_time(window, self.s.recall_time_budget, visible)
        elapsed = round((time.perf_counter() - started) * 1000, 1)
        self.log.info("recall by time: pool=%d inside=%d returned=%d elapsed_ms=%.1f", dated, inside, len(entries), elapsed)
        return time_response(entries, spec, dated, elapsed)


class _Fused:
    """The fused hits of one query recall, best first (deeper than the budget while a
    re-ranker is to see them), and how to answer with them."""

    def __init__(
        self, plan: QueryPlan, hits: list[tuple[IndexEntry, float]], sessions: dict[str, str], pool_size: int, budget: int
    ) -> None:
        self.plan = plan
        self.hits = hits
        self.sessions = sessions
        self.pool_size = pool_size
        self.budget = budget

    def reordered(self, order: list[int]) -> _Fused:
        """The hits in the re-ranker's ``order`` (indexes into them; any left out follow
        in their fused order). Position i keeps the i-th best fused score, so scores still
        descend down the rows."""
        seen = [i for i in dict.fromkeys(order) if 0 <= i < len(self.hits)]
        seen += [i for i in range(len(self.hits)) if i not in seen]
        scores = [score for _, score in self.hits]
        hits = [(self.hits[i][0], scores[rank]) for rank, i in enumerate(seen)]
        return _Fused(self.plan, hits, self.sessions, self.pool_size, self.budget)

    def body(self) -> RecallAnswer:
        """The answer: the first ``budget`` hits."""
        elapsed = round((time.perf_counter() - self.plan.started) * 1000, 1)
        return query_response(self.hits[: self.budget], self.plan.query, self.pool_size, elapsed, self.sessions)
