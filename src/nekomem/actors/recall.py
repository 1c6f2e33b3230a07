"""RecallActor: one character's recall index behind a mailbox.

The owners (FactActor, ReflectionActor) feed it with :class:`IndexUpsert` /
:class:`IndexRemove`; the index itself (BM25 over facts, reflections and the fact archive,
vectors over facts and reflections) is a :class:`~nekomem.recall.index.RecallIndex`. This
actor adds what needs a mailbox: vectors missing from the entries are computed in bounded
batches on the model pool (never inside the mailbox) and handed back to their owner
(:class:`VectorsComputed`) so that they are cached on the entries; queries that need
their own embedding wait for it.

It answers user recall (:class:`QueryMemory`, the ``/query_memory`` contract) and the
background maintenance recall of the long-term pipeline (:class:`RankForStage2`,
:class:`RelatedFacts`, answered with :class:`RankedIds` through ``ctx.send``). A query
that needs its own embedding submits it to the pool and finishes when the vector comes back
(or, after ``recall_query_embed_timeout_seconds``, from BM25 alone).

The fact rows of the index are persisted (:mod:`nekomem.actors.recall_persist`): loaded at
activation when current, so a long memory answers its first query without waiting for the
facts' feed, and written when the actor stops. Everything else is rebuilt from the owners'
stores at every activation.
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from collections.abc import Callable
from datetime import datetime

import numpy as np

from nekomem.actors import recall_persist
from nekomem.actors.base import ChildActor
from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    BackfillDone,
    ExplainQuery,
    IndexRemove,
    IndexUpsert,
    IndexWaitOver,
    MaintenanceRecall,
    MaintenanceVectors,
    QueryExpired,
    QueryMemory,
    QueryVector,
    RankedIds,
    RankForStage2,
    RelatedFacts,
    RequestIndex,
    Reranked,
    RerankExpired,
    Tick,
    TurnVectorsDone,
    Vectors,
    VectorsComputed,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import tier_owners, vector_tiers
from nekomem.recall.embeddings import EmbeddingService, EmbeddingsUnavailable
from nekomem.recall.entry import display_tz
from nekomem.recall.explain import explain
from nekomem.recall.fusion import rrf
from nekomem.recall.index import RecallIndex
from nekomem.recall.journal_fallback import journal_hits
from nekomem.recall.names import blend_query_vectors
from nekomem.recall.query_plan import QueryPlan, plan_query
from nekomem.recall.response import (
    RecallBody,
    empty_response,
    query_response,
    time_response,
)
from nekomem.recall.timewindow import TimeWindow
from nekomem.recall.tokenize import forget_memoised_words
from nekomem.recall.turn_leg import TURN_TIER, TurnCorpus
from nekomem.runtime.deadlines import RECALL_DEADLINES
from nekomem.runtime.pool import PoolFull
from nekomem.runtime.protocol import Message
from nekomem.stores.fence import FencedWrite
from nekomem.stores.timeindex_read import TimeIndexReader

_LOADS: dict[int, int] = {}  # id(CharacterContext) -> activations of RecallActor on it

# A function that turns a pool job's outcome into the message that reports it.
Wrap = Callable[[object, BaseException | None], Message]


def _vectors(result: object) -> Vectors | None:
    return None if result is None else np.asarray(result, dtype=np.float32)


class RecallActor(ChildActor):
    """The mailbox of a character's recall index (see :class:`RecallLayer`)."""

    child_name = "recall"

    def make_layer(self, ports: LayerPorts) -> RecallLayer:
        return RecallLayer(ports)


class RecallLayer:
    """One character's recall: the index, the vectors it still lacks, and the queries
    waiting for their embedding or for the owners' first feed."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.ctx = ports.ctx
        self.log = ports.log
        self.child_name = ports.child
        self.pending_counter = self.ctx.services.pending
        # token -> a query (or a playground explain) waiting for its embedding, and its plan
        self.queries: dict[int, tuple[QueryMemory | ExplainQuery, QueryPlan]] = {}
        self.held: list[QueryMemory] = []
        # token -> a query waiting for the re-ranker, and its fused hits
        self.reranks: dict[int, tuple[QueryMemory, _Fused]] = {}
        # The uncovered journal turns, indexed (rebuilt when the journal or its coverage changed).
        self.turns: TurnCorpus | None = None
        self.s = self.ctx.settings.recall
        # The fact rows mirror the facts owner (its feed came, or a current segment was
        # loaded); only then is a segment written at close. ``persisted``: the segment
        # loaded, until the facts' feed takes over its rows; ``loaded_tie``: its tie.
        self.facts_fed = False
        self.facts_changed = False
        self.persisted: recall_persist.Loaded | None = None
        self.loaded_tie: list[list[int] | None] | None = None
        self.segment_due = False
        self.waiting_feeds: list[IndexUpsert] = []

    # -- lifecycle -------------------------------------------------------------------
    def load(self) -> None:
        s = self.ctx.settings.recall
        self.s = s
        analyzer = recall_persist.analyzer_for(self.ctx.settings, self.ctx.name)
        self.index = RecallIndex(s, display_tz(self.ctx.settings.server.display_timezone), analyzer)
        self.turns = None
        self.turn_token: int | None = None  # the embedding job over uncovered turns in flight
        self.turn_after = 0.0  # no turn embedding job before this (monotonic; after a failure)
        self.backfill_token: int | None = None
        self.backfill_items: list[tuple[str, str]] = []
        self.backfill_after = 0.0
        self.queries = {}
        # Owners send their complete index from their own start-up, concurrently with the
        # first request: a query that arrives before every owner has is held (bounded by
        # recall_index_wait_seconds), so a just-activated character never answers empty.
        self.fed: set[str] = set()
        self.held = []
        self.facts_fed = False
        self.facts_changed = False
        self.persisted = None
        self.loaded_tie = None
        # Loaded by the first message, not here: this start runs on an actor worker that the
        # character's other actors (the ones /new_dialog asks) are waiting for.
        self.segment_due = s.recall_index_persist
        self.waiting_feeds = []
        tell = self.ports.tell_self
        RECALL_DEADLINES.schedule(s.recall_index_wait_seconds, lambda: tell(IndexWaitOver()))
        self.maintenance: dict[int, tuple[MaintenanceRecall, list[str], int, int, list[str]]] = {}
        self._seq = 0
        if self._restarted():
            # What was in flight to the old instance is sent again with the whole index.
            self.pending_counter.forget(self.ctx.name)
            # The index died with the old instance: the owners are asked to send it again.
            for owner in dict.fromkeys(tier_owners().values()):
                self.ports.send(owner, RequestIndex())

    def _ensure_segment(self) -> None:
        """Load the facts' segment if it is still due (the first message that reads or
        feeds the index does, before anything else touches it)."""
        if self.segment_due:
            self.segment_due = False
            self._load_segment()
            waiting, self.waiting_feeds = self.waiting_feeds, []
            for feed in waiting:
                self.on_IndexUpsert(feed)

    def _load_segment(self) -> None:
        """Take the facts' rows from their segment when it is current (see
        :mod:`nekomem.actors.recall_persist`); otherwise the facts' feed builds them."""
        loaded = recall_persist.load(self.ctx.paths, self.ctx.settings, self.index.analyzer)
        if loaded is None:
            return
        started = time.perf_counter()
        try:
            self.index.load_base(loaded.base)
        except Exception as exc:  # noqa: BLE001 - a segment is only a cache: any failure means a rebuild
            loaded.rows.close()
            self.log.info("recall segment ignored (%s); the index is rebuilt from the views", type(exc).__name__)
            self.index = self._fresh_index([])
            return
        self.persisted = loaded
        self.loaded_tie = loaded.stamp
        self.facts_fed = True
        if not self._uses_vectors():
            # BM25 only: the segment answers as the facts' feed would. With vectors, queries
            # still wait for the feed (its entries carry the cached vectors), which now costs
            # the facts' load, not a re-indexing.
            self.fed.add(tier_owners()["fact"])
        self.log.info(
            "recall: %d fact rows loaded from their segment in %.1f ms", len(loaded.base.ids), (time.perf_counter() - started) * 1000
        )

    def _uses_vectors(self) -> bool:
        """True when recall has, or will have, a vector side (an enabled embedding service)."""
        emb = self.ctx.services.embeddings
        return emb is not None and self.s.recall_legs != "bm25" and getattr(emb, "state", "") != "disabled"

    def _fresh_index(self, keep: list[IndexEntry]) -> RecallIndex:
        """A new, empty index (same settings and analyzer) holding ``keep``."""
        index = RecallIndex(self.s, display_tz(self.ctx.settings.server.display_timezone), self.index.analyzer)
        index.upsert(keep)
        return index

    def _take_fact_feed(self, msg: IndexUpsert, persisted: recall_persist.Loaded) -> None:
        """The facts' complete feed over a loaded segment: its entries taken onto the
        segment's rows when its views are the segment's, else the fact rows rebuilt."""
        assert msg.replace_tier is not None
        try:
            if msg.views is not None and msg.views == persisted.stamp[:2]:
                self.index.adopt(msg.entries, msg.replace_tier)
                for doc_id in self.index.unresolved():
                    _ = self.index.docs[doc_id].entry  # none when the views are the same: read before closing
                return
            self.log.info("recall: the facts' views are not the segment's; rebuilding the fact rows")
            others = [d.entry for d in self.index.docs.values() if d.tier not in recall_persist.FACT_TIERS]
            self.index = self._fresh_index(others)
            self.index.upsert(msg.entries, msg.replace_tier)
        finally:
            persisted.rows.close()

    def _write_segment(self) -> None:
        """Write the fact rows' segment when they mirror the facts' views (see
        :mod:`nekomem.actors.recall_persist`); never raises (a missing segment only costs
        the next wake a rebuild)."""
        if not self.s.recall_index_persist or not self.facts_fed:
            return
        paths = self.ctx.paths
        try:
            if not self.facts_changed and recall_persist.tied_stamp(paths) == self.loaded_tie:
                return  # the segment on disk is still current
            if self.ctx.journal.unapplied_for(tier_owners()["fact"]):
                recall_persist.discard(paths)
                return
            started = time.perf_counter()
            data = recall_persist.encode_fact_segment(paths, self.ctx.settings, self.index.analyzer, self.index)
            if data is None:
                recall_persist.discard(paths)
                return
            recall_persist.write(paths, data)
            self.log.info("recall segment written: %d bytes in %.1f ms", len(data), (time.perf_counter() - started) * 1000)
        except FencedWrite:
            self.log.info("recall segment not written: this node no longer owns the character")
        except Exception as exc:  # noqa: BLE001 - a stop must complete; a missing segment only costs a rebuild
            self.log.warning("recall segment not written (%s); the next wake rebuilds the index", type(exc).__name__)
            try:
                recall_persist.discard(paths)
            except OSError:
                pass

    def _restarted(self) -> bool:
        """True when this is not the first activation on this character's context (the
        context outlives a crash of this actor; a second load is a restart)."""
        key = id(self.ctx)
        loads = _LOADS.get(key, 0)
        if not loads:
            weakref.finalize(self.ctx, _LOADS.pop, key, None)
        _LOADS[key] = loads + 1
        return loads > 0

    def close(self) -> None:
        self._write_segment()
        if self.persisted is not None:
            self.persisted.rows.close()
            self.persisted = None
        self.pending_counter.forget(self.ctx.name)
        for msg, plan in self.queries.values():
            if msg.reply is not None:
                msg.reply.ok(empty_response(plan.query, error=True))
        self.queries.clear()
        for query, found in self.reranks.values():
            if query.reply is not None:
                query.reply.ok(found.body())
        self.reranks.clear()
        for held in self.held:
            if held.reply is not None:
                held.reply.ok(empty_response((held.query or "").strip(), error=True))
        self.held = []

    def flush(self) -> None:
        """Nothing to write: the index is rebuilt from its owners at every activation."""

    def due_at(self) -> float | None:
        return None

    def real_due_at(self) -> float | None:
        """While the embedding service loads, or the vector side lags it, or a backfill
        waits: when to look again (real time: this waits on a model, not on domain time)."""
        emb = self.ctx.services.embeddings
        if emb is None or self.s.recall_legs == "bm25":
            return None
        now = time.monotonic()
        if getattr(emb, "state", "") == "disabled":
            return now if self.index.vectors is not None else None
        ready = self._service()
        if ready is None:
            return now + self.ctx.settings.runtime.timer_retry_floor_seconds  # still loading
        if self.index.vectors is None or self.index.vector_model != ready.model_id:
            return now
        if self.index.need and self.backfill_token is None:
            return self.backfill_after
        if self.turns is not None and self.turn_token is None and self.s.recall_turn_vectors and self.index.docs and self.turns.missing():
            return max(now, self.turn_after)
        return None

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self._safe_sync()

    def _safe_sync(self) -> None:
        # The vector side is optional: a failure there is logged, never a crash loop.
        try:
            self._sync_vectors()
            self._pump_turn_vectors()
        except Exception:
            self.log.exception("vector index upkeep failed")

    # -- feed ------------------------------------------------------------------------
    @handles(IndexUpsert)
    def on_IndexUpsert(self, msg: IndexUpsert) -> None:
        if self.segment_due and msg.replace_tier not in recall_persist.FACT_TIERS:
            # Another owner's feed (the reflections'): kept until the segment is loaded, so
            # that loading it is left to the first message that needs the facts.
            self.waiting_feeds.append(msg)
            return
        self._ensure_segment()
        if msg.replace_tier is not None:
            self.fed.add(tier_owners().get(msg.replace_tier, msg.replace_tier))
        fact_feed = msg.replace_tier in recall_persist.FACT_TIERS
        if fact_feed and self.persisted is not None:
            persisted, self.persisted = self.persisted, None
            self._take_fact_feed(msg, persisted)
        else:
            self.index.upsert(msg.entries, msg.replace_tier)
        if fact_feed:
            self.facts_fed = True
            self.facts_changed = self.facts_changed or msg.views is None or msg.views != (self.loaded_tie or [])[:2]
        elif any(e.tier in recall_persist.FACT_TIERS for e in msg.entries):
            self.facts_changed = True
        self._safe_sync()
        self.pending_counter.indexed(self.ctx.name, self._waiting(), msg.counted)
        if self.held and self.fed >= set(tier_owners().values()):
            self._release_held()
        if self.turns is None and self.index.docs and self.fed >= set(tier_owners().values()) and self.s.recall_turn_vectors:
            self._uncovered_turns()  # indexed (and embedded in the background) before the first query

    @handles(IndexWaitOver)
    def on_index_wait_over(self, msg: IndexWaitOver) -> None:
        if self.held:
            self.log.warning("recall: answering %d queries before every index owner reported", len(self.held))
        self.fed |= set(tier_owners().values())
        self._release_held()

    def _release_held(self) -> None:
        held, self.held = self.held, []
        for query in held:
            self.on_QueryMemory(query)

    @handles(IndexRemove)
    def on_IndexRemove(self, msg: IndexRemove) -> None:
        self._ensure_segment()
        if self.s.recall_index_persist and any(
            (doc := self.index.docs.get(i)) is not None and doc.tier in recall_persist.FACT_TIERS for i in msg.ids
        ):
            # The segment on disk still has the removed rows' token hashes: gone now, written
            # afresh when this actor stops.
            self.facts_changed = True
            try:
                recall_persist.discard(self.ctx.paths)
            except OSError:
                self.log.warning("recall segment could not be removed after an erasure; it is rewritten at stop")
        self.index.remove(msg.ids)
        forget_memoised_words()
        self._publish_pending()

    # -- vectors ---------------------------------------------------------------------
    def _service(self) -> EmbeddingService | None:
        """The process embedding service when it is ready and recall uses vectors."""
        emb = self.ctx.services.embeddings
        if emb is None or self.s.recall_legs == "bm25":
            return None
        return emb if getattr(emb, "is_ready", False) else None

    def _sync_vectors(self) -> None:
        """Bring the vector index in line with the embedding service, then backfill (once
        the facts' feed has handed over a loaded segment's entries, which hold the cached
        vectors: reading them from the views one by one would cost more)."""
        if self.persisted is not None or self.segment_due:
            return
        emb = self._service()
        model = emb.model_id if emb is not None else None
        if model is None:
            service = self.ctx.services.embeddings
            if self.index.vectors is not None and (service is None or getattr(service, "state", "") == "disabled"):
                self.index.detach_model()
                self._publish_pending()
            return
        assert emb is not None
        if self.index.attach_model(model, int(emb.dim or 0), getattr(emb, "legs", ())):
            self._publish_pending()
        self._pump_backfill()

    def _next_token(self) -> int:
        self._seq += 1
        return self._seq

    def _pump_backfill(self) -> None:
        if self.backfill_token is not None or not self.index.need or self.index.vectors is None:
            return
        if time.monotonic() < self.backfill_after:
            return
        emb = self._service()
        if emb is None:
            return
        items, texts = self.index.take_backfill(self.s.recall_embed_batch_size)
        token = self._next_token()

        def job() -> object:
            return emb.embed(texts, "passage")

        def wrap(result: object, error: BaseException | None) -> Message:
            return BackfillDone(token=token, items=items, vectors=_vectors(result), error=None if error is None else repr(error))

        try:
            self.ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            self.backfill_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            return
        self.index.commit_backfill(items)
        self.backfill_token = token
        self.backfill_items = items

    @handles(BackfillDone)
    def on_backfill_done(self, msg: BackfillDone) -> None:
        if msg.token != self.backfill_token:
            return
        self.backfill_token = None
        if msg.error is not None or msg.vectors is None or self.index.vectors is None:
            # Put the batch back (the entries still there and unchanged) and pause; a
            # disabled service clears the vector side on the next sync instead.
            self.index.restore_backfill(msg.items)
            self.backfill_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            self.log.info("vector backfill failed for %d entries; retrying later", len(msg.items))
            self._sync_vectors()
            self._publish_pending()
            return
        for owner, vectors in self.index.store_backfill(msg.items, msg.vectors).items():
            self.ctx.send(owner, VectorsComputed(vectors=vectors))
        self._publish_pending()
        self._pump_backfill()

    def _publish_pending(self) -> None:
        self.pending_counter.set(self.ctx.name, self._waiting())

    def _waiting(self) -> int:
        """Indexed entries without a vector: listed for the backfill or in its batch; while
        the model still loads, every vector-tier entry without a stored vector."""
        if self.index.vectors is None:
            emb = self.ctx.services.embeddings
            if emb is None or self.s.recall_legs == "bm25" or getattr(emb, "state", "") != "loading":
                return 0
            # A row of the segment not yet handed over by its owner counts as waiting (its
            # entry is not read just to count it; the facts' feed follows at once).
            return sum(
                1 for doc in self.index.docs.values() if doc.tier in vector_tiers() and (not doc.resolved or doc.entry.vector is None)
            )
        inflight = len(self.backfill_items) if self.backfill_token is not None else 0
        turns = 0
        if self.turns is not None and self.s.recall_turn_vectors and self.index.docs:
            turns = len(self.turns.missing()) + len(self.turns.embedding)
        return len(self.index.need) + inflight + turns

    def _submit_embed(self, texts: list[str], wrap: Wrap, *, urgent: bool = False) -> bool:
        """Embed ``texts`` as queries; False when that is not possible.

        ``urgent`` (a user waiting) goes straight to the embedding service, ahead of every
        other text there and without taking a model-pool worker (those may all be busy
        with this or other characters' background work); it is dropped there once
        recall_query_embed_timeout_seconds have passed, when the answer has gone out from
        BM25 alone. Background work goes through the model pool under the character's key,
        which also keeps the character active meanwhile.
        """
        emb = self._service()
        if emb is None or self.index.vectors is None:
            return False
        ctx = self.ctx
        if urgent:
            expires = time.monotonic() + self.s.recall_query_embed_timeout_seconds
            try:
                emb.embed_for_user(texts, lambda result, error: ctx.send(self.child_name, wrap(result, error)), expires=expires)
            except EmbeddingsUnavailable:
                return False
            return True

        def job() -> object:
            return emb.embed(texts, "query")

        try:
            ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            return False
        return True

    # -- user recall -----------------------------------------------------------------
    @handles(QueryMemory)
    def on_QueryMemory(self, msg: QueryMemory) -> None:
        self._ensure_segment()
        if msg.reply is None:
            return
        if not self.fed >= set(tier_owners().values()):
            self.held.append(msg)
            return
        started = time.perf_counter()
        query = (msg.query or "").strip()[: self.s.recall_query_max_chars]
        try:
            self._sync_vectors()
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

    @handles(ExplainQuery)
    def on_ExplainQuery(self, msg: ExplainQuery) -> None:
        """The playground's recall: the plan, embedding and search of /query_memory, over
        the private corpus, answered with each leg explained."""
        self._ensure_segment()
        if msg.reply is None:
            return
        self._sync_vectors()
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
        token = self._next_token()

        def wrap(result: object, error: BaseException | None) -> Message:
            return QueryVector(token=token, vectors=_vectors(result), error=None if error is None else repr(error))

        if not self._submit_embed(list(plan.vector_texts), wrap, urgent=True):
            return False
        self.queries[token] = (msg, plan)
        tell = self.ports.tell_self
        RECALL_DEADLINES.schedule(self.s.recall_query_embed_timeout_seconds, lambda: tell(QueryExpired(token=token)))
        return True

    @handles(QueryVector)
    def on_query_vector(self, msg: QueryVector) -> None:
        pending = self.queries.pop(msg.token, None)
        if pending is None:
            return  # answered already (timed out)
        vec = None
        if msg.error is None and msg.vectors is not None and len(msg.vectors):
            vec = blend_query_vectors(list(msg.vectors), self.s.recall_query_unnamed_weight)
        else:
            self.log.info("recall: query embedding failed; answering from BM25 alone")
        self._finish(*pending, vec)

    @handles(QueryExpired)
    def on_query_expired(self, msg: QueryExpired) -> None:
        pending = self.queries.pop(msg.token, None)
        if pending is not None:
            self.log.info("recall: query embedding timed out; answering from BM25 alone")
            self._finish(*pending, None)

    def _journal_search(self, pending: QueryPlan) -> RecallBody:
        """No long-term entry yet: the newest journal turns ranked by BM25 (read-only;
        RecentActor is the journal's writer). See :mod:`nekomem.recall.journal_fallback`."""
        path = self.ctx.paths.time_index_db
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

    def _uncovered_turns(self) -> TurnCorpus | None:
        """The newest recall_uncovered_turns journal turns no long-term memory covers
        (:mod:`nekomem.stores.turn_coverage`), indexed; kept while the journal's rows and
        coverage are unchanged. None when off, or when the journal does not track coverage."""
        limit = self.s.recall_uncovered_turns
        path = self.ctx.paths.time_index_db
        if limit <= 0 or not path.exists():
            self.turns = None
            return None
        try:
            with TimeIndexReader.read_only(path) as journal:
                mined = journal.mined_ranges()
                if mined is None:
                    self.turns = None
                    return None
                top, count = journal.shape()
                key = (top, count, tuple(mined))
                if self.turns is None:
                    self.turns = TurnCorpus([], TURN_TIER, self.index.analyzer, self.s)
                if self.turns.key != key:
                    # Only the rows new to the corpus are read and indexed.
                    self.turns.sync(journal.uncovered_ids(mined, top, limit), journal.rows_by_id, key)
                    self._pump_turn_vectors()
        except sqlite3.Error:  # not created yet, or unreadable: no turn leg
            self.turns = None
        return self.turns

    def _turn_leg(self, pending: QueryPlan, qvec: Vectors | None) -> tuple[TurnCorpus | None, list[list[str]]]:
        """The rankings of the uncovered turns for ``pending`` (ids, best first): BM25, then
        one per embedding model when the turns have vectors; none for a scoped query (the
        journal is the owner's private conversation). An explicit time window keeps the
        turns inside it."""
        if pending.scoped:
            return None, []
        corpus = self._uncovered_turns()
        if corpus is None or not len(corpus):
            return corpus, []
        allowed = corpus.inside(pending.window) if pending.window is not None else None
        depth = self.s.recall_budget_each
        legs: list[list[str]] = []
        if self.s.recall_legs != "vector":
            legs.append([doc_id for doc_id, _ in corpus.leg(pending.search, depth, allowed)])
        emb = self._service()
        if qvec is not None and emb is not None and corpus.vector_model == emb.model_id and self.s.recall_turn_vectors:
            legs += corpus.vector_legs(
                qvec, getattr(emb, "legs", ()) if len(getattr(emb, "legs", ())) > 1 else (), self.s.recall_cosine_threshold, depth, allowed
            )
        return corpus, [leg for leg in legs if leg]

    def _pump_turn_vectors(self) -> None:
        """Embed the next batch of uncovered turns without a vector on the model pool (the
        character's own key: background work), one batch at a time."""
        corpus = self.turns
        if corpus is None or not self.s.recall_turn_vectors or self.turn_token is not None or not self.index.docs:
            return  # (without any entry the journal fallback answers, by BM25)
        emb = self._service()
        corpus.use_model(emb.model_id if emb is not None else None)
        if emb is None or time.monotonic() < self.turn_after:
            return
        ids = corpus.missing()[: self.s.recall_embed_batch_size]
        if not ids:
            return
        texts = [corpus.entries[doc_id].text for doc_id in ids]
        model = str(emb.model_id)
        token = self._next_token()

        def job() -> object:
            return emb.embed(texts, "passage")

        def wrap(result: object, error: BaseException | None) -> Message:
            return TurnVectorsDone(
                token=token, ids=ids, model=model, vectors=_vectors(result), error=None if error is None else repr(error)
            )

        try:
            self.ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            self.turn_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            return
        corpus.embedding.update(ids)
        self.turn_token = token

    @handles(TurnVectorsDone)
    def on_turn_vectors(self, msg: TurnVectorsDone) -> None:
        if msg.token != self.turn_token:
            return
        self.turn_token = None
        if self.turns is not None:
            self.turns.store(msg.model, msg.ids, None if msg.error is not None else msg.vectors)
        if msg.error is not None or msg.vectors is None:
            self.turn_after = time.monotonic() + self.s.recall_backfill_retry_seconds
        self._publish_pending()
        self._pump_turn_vectors()

    def _finish(self, msg: QueryMemory | ExplainQuery, plan: QueryPlan, qvec: Vectors | None) -> None:
        if isinstance(msg, ExplainQuery):
            if msg.reply is not None:
                msg.reply.ok(explain(self.index, self.s, plan, qvec, msg.excluded))
            return
        try:
            found = self._query_search(plan, qvec)
            if isinstance(found, _Fused) and self._rerank(msg, found):
                return  # answered when the re-ranker answers, or at its deadline
            body: object = found.body() if isinstance(found, _Fused) else found
        except Exception:
            self.log.exception("recall query failed")
            body = empty_response(plan.query, error=True)
        if msg.reply is not None:
            msg.reply.ok(body)

    def _query_search(self, pending: QueryPlan, qvec: Vectors | None) -> RecallBody | _Fused:
        """The fused hits of ``pending`` (the index's legs and the uncovered turns' leg),
        deep enough for the re-ranker when one is configured; the journal fallback's body
        for a character without any long-term entry."""
        index = self.index
        if not index.docs and pending.allowed is None and not pending.scoped and self.s.recall_journal_fallback_rows > 0:
            return self._journal_search(pending)
        pool_size = len(index.docs) if pending.allowed is None else len(pending.allowed)
        hits, legs = index.search(pending.search, qvec, pending.allowed, pending.hinted)
        corpus, turn_legs = self._turn_leg(pending, qvec)
        reranking = self.ctx.services.reranker is not None and bool(pending.search)
        depth = max(self.s.recall_rerank_top_n, self.s.recall_budget_total) if reranking else self.s.recall_budget_total
        sessions: dict[str, str] = {}
        if (corpus is not None and turn_legs) or depth > self.s.recall_budget_total:
            # The uncovered turns are one more leg of the fusion, as the index fuses its own.
            turns = corpus.entries if corpus is not None else {}
            weights = [1.0] * len(legs) + [self.s.recall_turn_leg_weight] * len(turn_legs)
            fused = rrf([*legs, *turn_legs], self.s.recall_rrf_k, depth, weights)
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

    # -- re-ranking ------------------------------------------------------------------
    def _rerank(self, msg: QueryMemory, found: _Fused) -> bool:
        """Hand ``found``'s candidates to the re-ranker on the model pool; False (answer
        now, in the fused order) when none is configured, there is nothing to re-order or
        the pool is full."""
        reranker = self.ctx.services.reranker
        if reranker is None or len(found.hits) < 2 or msg.reply is None:
            return False
        token = self._next_token()
        query = found.plan.search
        texts = [entry.text for entry, _ in found.hits]

        def job() -> object:
            return reranker.rank(query, texts)

        def wrap(result: object, error: BaseException | None) -> Message:
            order = [int(i) for i in result] if isinstance(result, list) else None
            return Reranked(token=token, order=order, error=None if error is None else f"{type(error).__name__}: {error}")

        ctx = self.ctx
        try:
            ctx.services.pool.submit(f"{ctx.name}\x00rerank", job, lambda result, error: ctx.send(self.child_name, wrap(result, error)))
        except PoolFull:
            return False
        self.reranks[token] = (msg, found)
        tell = self.ports.tell_self
        RECALL_DEADLINES.schedule(self.s.recall_rerank_timeout_seconds, lambda: tell(RerankExpired(token=token)))
        return True

    @handles(Reranked)
    def on_reranked(self, msg: Reranked) -> None:
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

    @handles(RerankExpired)
    def on_rerank_expired(self, msg: RerankExpired) -> None:
        pending = self.reranks.pop(msg.token, None)
        if pending is not None:
            self.log.info("recall: re-ranker too slow; answering in the fused order")
            query, found = pending
            if query.reply is not None:
                query.reply.ok(found.body())

    def _time_only(self, window: TimeWindow, spec: str, started: float, visible: set[str] | None) -> RecallBody:
        entries, dated, inside = self.index.nearest_in_time(window, self.s.recall_time_budget, visible)
        elapsed = round((time.perf_counter() - started) * 1000, 1)
        self.log.info("recall by time: pool=%d inside=%d returned=%d elapsed_ms=%.1f", dated, inside, len(entries), elapsed)
        return time_response(entries, spec, dated, elapsed)

    # -- maintenance recall ----------------------------------------------------------
    def _answer(self, msg: MaintenanceRecall, ids: list[str]) -> None:
        if msg.reply_child:
            self.ctx.send(msg.reply_child, RankedIds(tag=msg.tag, ids=ids))
        if msg.reply is not None:
            msg.reply.ok(ids)

    def _maintenance_wrap(self, token: int) -> Wrap:
        def wrap(result: object, error: BaseException | None) -> Message:
            return MaintenanceVectors(token=token, vectors=_vectors(result), error=None if error is None else repr(error))

        return wrap

    @handles(RankForStage2)
    def on_RankForStage2(self, msg: RankForStage2) -> None:
        self._ensure_segment()
        self._sync_vectors()
        candidates = list(dict.fromkeys(c for c in msg.candidate_ids if c))
        k = max(msg.budget, 0) * self.s.recall_coarse_oversample
        queries = [q.strip() for q in msg.query_texts if isinstance(q, str) and q.strip()]
        if k == 0 or not candidates:
            self._answer(msg, [])
            return
        vectors = self.index.vectors
        extra = [c for c in candidates if (vectors is None or c not in vectors) and msg.candidate_texts.get(c, "").strip()]
        token = self._next_token()
        if queries and self._submit_embed(queries + [msg.candidate_texts[c] for c in extra], self._maintenance_wrap(token)):
            self.maintenance[token] = (msg, candidates, k, len(queries), extra)
            return
        self._answer(msg, candidates[:k])

    @handles(RelatedFacts)
    def on_RelatedFacts(self, msg: RelatedFacts) -> None:
        self._ensure_segment()
        self._sync_vectors()
        queries = [q.strip() for q in msg.query_texts if isinstance(q, str) and q.strip()]
        token = self._next_token()
        if (
            queries
            and msg.per_query_k > 0
            and msg.cap > 0
            and self.index.vector_count()
            and self._submit_embed(queries, self._maintenance_wrap(token))
        ):
            self.maintenance[token] = (msg, [], 0, len(queries), [])
            return
        self._answer(msg, [])

    @handles(MaintenanceVectors)
    def on_maintenance_vectors(self, msg: MaintenanceVectors) -> None:
        job = self.maintenance.pop(msg.token, None)
        if job is None:
            return
        request, candidates, k, n_queries, extra = job
        vectors = None if msg.error is not None else msg.vectors
        if isinstance(request, RankForStage2):
            self._answer(request, self.index.coarse_rank(candidates, k, vectors, n_queries, extra))
        elif vectors is None:
            self._answer(request, [])
        else:
            self._answer(request, self.index.related(vectors, request.per_query_k, request.cap, request.tiers, request.exclude_ids))


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

    def body(self) -> RecallBody:
        """The answer: the first ``budget`` hits."""
        elapsed = round((time.perf_counter() - self.plan.started) * 1000, 1)
        return query_response(self.hits[: self.budget], self.plan.query, self.pool_size, elapsed, self.sessions)
