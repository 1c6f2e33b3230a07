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
:class:`RelatedFacts`, answered with :class:`RankedIds` through ``ports.send``). A query
that needs its own embedding submits it to the pool and finishes when the vector comes back
(or, after ``recall_query_embed_timeout_seconds``, from BM25 alone). The fact rows of the
index are persisted (:mod:`nekomem.layers.recall.persist`); the rest is rebuilt from the owners' stores at every activation.
"""

from __future__ import annotations

import time

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    BackfillDone,
    ExplainQuery,
    IndexRemove,
    IndexUpsert,
    IndexWaitOver,
    MaintenanceVectors,
    QueryExpired,
    QueryMemory,
    QueryVector,
    RankForStage2,
    RelatedFacts,
    RequestIndex,
    Reranked,
    RerankExpired,
    ScrubTexts,
    Tick,
    TurnVectorsDone,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import RECALL, tier_owners
from nekomem.layers.recall import persist
from nekomem.layers.recall.maintenance import MaintenanceRanking
from nekomem.layers.recall.query import QueryPath
from nekomem.layers.recall.state import RecallState
from nekomem.layers.recall.vectors import VectorUpkeep
from nekomem.recall.query_text import forget_memoised_words
from nekomem.stores.fence import FencedWrite


class RecallLayer:
    """One character's recall: the index and its feed (here), composed with the parts
    that own the vectors it still lacks (:class:`VectorUpkeep`), the queries waiting for
    their embedding or for the owners' first feed (:class:`QueryPath`) and the pipeline's
    background ranking (:class:`MaintenanceRanking`)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.log = ports.log
        self.pending_counter = self.ports.pending
        self.state = RecallState(ports)
        self.vectors = VectorUpkeep(self.state)
        self.query = QueryPath(self.state, self.vectors)
        self.maintenance = MaintenanceRanking(self.state, self.vectors)

    # -- lifecycle -------------------------------------------------------------------
    def load(self) -> None:
        self.state.reset_index()
        s = self.state.s
        self.vectors.reset()
        self.query.reset()
        self.state.reset_feed()
        self.state.reset_segment()
        self.ports.deadline(s.recall_index_wait_seconds, IndexWaitOver())
        self.maintenance.reset()
        self.state.reset_tokens()
        if not self.ports.first_load():
            # What was in flight to the old instance is sent again with the whole index.
            self.pending_counter.forget(self.ports.character)
            # The index died with the old instance: the owners are asked to send it again.
            for owner in dict.fromkeys(tier_owners().values()):
                self.ports.send(owner, RequestIndex())
            self.state.fact_feed_asked = True
        elif (
            not self.state.segment_due
            or not self._segment_looks_current()
            or (self.state.uses_vectors() and not persist.vectors_current(self.ports.paths, None))
        ):
            # The facts owner reads its facts only when a message needs them: their feed
            # is asked for now when the segment will not answer for it (none current,
            # persistence off, or vectors to take from the feed when no current vector
            # block holds them), so that it is read while the character wakes, not behind
            # its first query.
            self._ask_fact_feed()

    def _segment_looks_current(self) -> bool:
        return persist.looks_current(self.ports.paths, self.ports.settings, self.state.index.analyzer)

    def _ask_fact_feed(self) -> None:
        """Ask the facts owner for its complete feed, once per load (see
        :meth:`RecallState.request_fact_feed`)."""
        self.state.request_fact_feed()

    # -- the persisted fact rows (layers/recall/persist.py) ---------------------------
    def _ensure_segment(self) -> None:
        """Load the facts' segment if it is still due (the first message that reads or
        feeds the index does, before anything else touches it)."""
        state = self.state
        if state.segment_due:
            state.segment_due = False
            self._load_segment()
            waiting, state.waiting_feeds = state.waiting_feeds, []
            for feed in waiting:
                self.on_IndexUpsert(feed)

    def _load_segment(self) -> None:
        """Take the facts' rows from their segment when it is current (see
        :mod:`nekomem.layers.recall.persist`); otherwise the facts' feed builds them."""
        state = self.state
        loaded = persist.load(self.ports.paths, self.ports.settings, state.index.analyzer)
        if loaded is None:
            self._ask_fact_feed()
            return
        started = time.perf_counter()
        try:
            state.index.load_base(loaded.base)
        except Exception as exc:  # noqa: BLE001 - a segment is only a cache: any failure means a rebuild
            loaded.rows.close()
            self.log.info("recall segment ignored (%s); the index is rebuilt from the views", type(exc).__name__)
            state.index = state.fresh_index([])
            self._ask_fact_feed()
            return
        state.persisted = loaded
        state.loaded_tie = loaded.stamp
        state.facts_fed = True
        if not state.uses_vectors():
            # BM25 only: the segment answers as the facts' feed would.
            state.fed.add(tier_owners()["fact"])
        else:
            # With vectors, the facts' cached vectors come from their block beside the
            # segment when it is current too; else queries wait for the feed (its entries
            # carry them), which costs the facts' load, not a re-indexing.
            state.stored_vectors = persist.load_vectors(self.ports.paths)
            if state.stored_vectors is None:
                self._ask_fact_feed()
            else:
                state.fed.add(tier_owners()["fact"])
        self.log.info(
            "recall: %d fact rows loaded from their segment in %.1f ms", len(loaded.base.ids), (time.perf_counter() - started) * 1000
        )
        if state.stored_vectors is not None:
            started = time.perf_counter()
            count = len(state.stored_vectors.ids)
            self.vectors.safe_sync()  # taken now when the embedding service is ready, else when it is
            if state.stored_vectors is None:
                self.log.info(
                    "recall: %d cached fact vectors taken from their block in %.1f ms", count, (time.perf_counter() - started) * 1000
                )

    def _take_fact_feed(self, msg: IndexUpsert, persisted: persist.Loaded) -> None:
        """The facts' complete feed over a loaded segment: its entries taken onto the
        segment's rows when its views are the segment's, else the fact rows rebuilt."""
        assert msg.replace_tier is not None
        state = self.state
        try:
            if msg.views is not None and msg.views == persisted.stamp[:2]:
                state.index.adopt(msg.entries, msg.replace_tier)
                for doc_id in state.index.unresolved():
                    _ = state.index.docs[doc_id].entry  # none when the views are the same: read before closing
                return
            self.log.info("recall: the facts' views are not the segment's; rebuilding the fact rows")
            others = [d.entry for d in state.index.docs.values() if d.tier not in persist.FACT_TIERS]
            state.index = state.fresh_index(others)
            state.index.upsert(msg.entries, msg.replace_tier)
        finally:
            persisted.rows.close()

    def _drop_vector_block(self) -> None:
        """Remove the facts' vector block once the fact rows changed (a forgotten fact's
        vector must not stay on disk; it is written afresh at stop); once per load."""
        state = self.state
        if state.vector_block_dropped:
            return
        state.vector_block_dropped = True
        try:
            persist.discard_vectors(self.ports.paths)
        except OSError:
            self.log.warning("recall vectors could not be removed after a change of the facts; they are rewritten at stop")

    def _write_vectors(self) -> None:
        """Write the facts' vector block at stop when the segment is current and the block
        is not (missing, stale, another model); never raises (a missing block only makes
        the next wake wait for the facts' feed)."""
        state = self.state
        model = state.index.vector_model
        vectors = state.index.vectors
        if model is None or vectors is None or not state.uses_vectors():
            return
        paths = self.ports.paths
        try:
            if persist.vectors_current(paths, model):
                return
            started = time.perf_counter()
            data = persist.encode_vectors(paths, model, vectors.dim)
            if data is None:
                persist.discard_vectors(paths)
                return
            persist.write_vectors(paths, data)
            self.log.info("recall vectors written: %d bytes in %.1f ms", len(data), (time.perf_counter() - started) * 1000)
        except FencedWrite:
            self.log.info("recall vectors not written: this node no longer owns the character")
        except Exception as exc:  # noqa: BLE001 - a stop must complete; a missing block only costs a slower wake
            self.log.warning("recall vectors not written (%s)", type(exc).__name__)
            try:
                persist.discard_vectors(paths)
            except OSError:
                pass

    def _write_segment(self) -> None:
        """Write the fact rows' segment when they mirror the facts' views (see
        :mod:`nekomem.layers.recall.persist`); never raises (a missing segment only costs
        the next wake a rebuild)."""
        state = self.state
        if not state.s.recall_index_persist or not state.facts_fed:
            return
        paths = self.ports.paths
        try:
            if not state.facts_changed and persist.tied_stamp(paths) == state.loaded_tie:
                self._write_vectors()  # the segment on disk is still current; its block may not be
                return
            if self.ports.journal.unapplied_for(tier_owners()["fact"]):
                persist.discard(paths)
                return
            started = time.perf_counter()
            data = persist.encode_fact_segment(paths, self.ports.settings, state.index.analyzer, state.index)
            if data is None:
                persist.discard(paths)
                return
            persist.write(paths, data)
            self.log.info("recall segment written: %d bytes in %.1f ms", len(data), (time.perf_counter() - started) * 1000)
            self._write_vectors()
        except FencedWrite:
            self.log.info("recall segment not written: this node no longer owns the character")
        except Exception as exc:  # noqa: BLE001 - a stop must complete; a missing segment only costs a rebuild
            self.log.warning("recall segment not written (%s); the next wake rebuilds the index", type(exc).__name__)
            try:
                persist.discard(paths)
            except OSError:
                pass

    def close(self) -> None:
        self._write_segment()
        if self.state.persisted is not None:
            self.state.persisted.rows.close()
            self.state.persisted = None
        self.pending_counter.forget(self.ports.character)
        self.query.close()

    def flush(self) -> None:
        """Nothing to write: the index is rebuilt from its owners at every activation."""

    def due_at(self) -> float | None:
        return None

    def real_due_at(self) -> float | None:
        """While the embedding service loads, or the vector side lags it, or a backfill
        waits: when to look again (real time: this waits on a model, not on domain time)."""
        return self.vectors.real_due_at()

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self.vectors.safe_sync()

    # -- feed ------------------------------------------------------------------------
    @handles(IndexUpsert)
    def on_IndexUpsert(self, msg: IndexUpsert) -> None:
        state = self.state
        if state.segment_due and msg.replace_tier not in persist.FACT_TIERS:
            # Another owner's feed (the reflections'): kept until the segment is loaded, so
            # that loading it is left to the first message that needs the facts.
            state.waiting_feeds.append(msg)
            return
        self._ensure_segment()
        if msg.replace_tier is not None:
            state.fed.add(tier_owners().get(msg.replace_tier, msg.replace_tier))
        fact_feed = msg.replace_tier in persist.FACT_TIERS
        if fact_feed and state.persisted is not None:
            persisted, state.persisted = state.persisted, None
            self._take_fact_feed(msg, persisted)
        else:
            state.index.upsert(msg.entries, msg.replace_tier)
        if fact_feed:
            state.facts_fed = True
            state.facts_changed = state.facts_changed or msg.views is None or msg.views != (state.loaded_tie or [])[:2]
        elif any(e.tier in persist.FACT_TIERS for e in msg.entries):
            state.facts_changed = True
        if state.facts_changed:
            self._drop_vector_block()
        self.state.turn_keys = None
        self.vectors.safe_sync()
        self.ports.pending.indexed(self.ports.character, self.vectors.waiting(), msg.counted)
        if self.query.held and self.state.fed >= set(tier_owners().values()):
            self.query.release_held()
        if (
            self.state.turns is None
            and self.state.index.docs
            and self.state.fed >= set(tier_owners().values())
            and self.state.s.recall_turn_vectors
        ):
            self.vectors.uncovered_turns()  # indexed (and embedded in the background) before the first query

    @handles(IndexWaitOver)
    def on_index_wait_over(self, msg: IndexWaitOver) -> None:
        if self.query.held:
            self.log.warning("recall: answering %d queries before every index owner reported", len(self.query.held))
        self.state.fed |= set(tier_owners().values())
        self.query.release_held()

    @handles(IndexRemove)
    def on_IndexRemove(self, msg: IndexRemove) -> None:
        self._ensure_segment()
        state = self.state
        if state.s.recall_index_persist and any(
            (doc := state.index.docs.get(i)) is not None and doc.tier in persist.FACT_TIERS for i in msg.ids
        ):
            # The segment on disk still has the removed rows' token hashes: gone now, written
            # afresh when this actor stops.
            state.facts_changed = True
            try:
                persist.discard(self.ports.paths)
            except OSError:
                self.log.warning("recall segment could not be removed after an erasure; it is rewritten at stop")
            self._drop_vector_block()
        state.index.remove(msg.ids)
        self.state.turn_keys = None
        forget_memoised_words()
        self.vectors.publish_pending()

    @handles(ScrubTexts)
    def on_ScrubTexts(self, msg: ScrubTexts) -> None:
        """An entry erasure's relay. Its owner told this mailbox the IndexRemove before it
        started the relay, so the row, its segment and its vector block are gone by now;
        passing the relay on from here makes the erasure's answer wait for that."""
        self.ports.send(msg.onward(RECALL), msg)

    # -- vectors ---------------------------------------------------------------------
    @handles(BackfillDone)
    def on_backfill_done(self, msg: BackfillDone) -> None:
        self.vectors.backfill_done(msg)

    @handles(TurnVectorsDone)
    def on_turn_vectors(self, msg: TurnVectorsDone) -> None:
        self.vectors.turn_vectors_done(msg)

    # -- user recall -----------------------------------------------------------------
    @handles(QueryMemory)
    def on_QueryMemory(self, msg: QueryMemory) -> None:
        self._ensure_segment()
        self.query.query_memory(msg)

    @handles(ExplainQuery)
    def on_ExplainQuery(self, msg: ExplainQuery) -> None:
        """The playground's recall: the plan, embedding and search of /query_memory, over
        the private corpus, answered with each leg explained."""
        self._ensure_segment()
        self.query.explain_query(msg)

    @handles(QueryVector)
    def on_query_vector(self, msg: QueryVector) -> None:
        self.query.query_vector(msg)

    @handles(QueryExpired)
    def on_query_expired(self, msg: QueryExpired) -> None:
        self.query.query_expired(msg)

    @handles(Reranked)
    def on_reranked(self, msg: Reranked) -> None:
        self.query.reranked(msg)

    @handles(RerankExpired)
    def on_rerank_expired(self, msg: RerankExpired) -> None:
        self.query.rerank_expired(msg)

    # -- maintenance recall ----------------------------------------------------------
    @handles(RankForStage2)
    def on_RankForStage2(self, msg: RankForStage2) -> None:
        self._ensure_segment()
        self.maintenance.rank_for_stage2(msg)

    @handles(RelatedFacts)
    def on_RelatedFacts(self, msg: RelatedFacts) -> None:
        self._ensure_segment()
        self.maintenance.related_facts(msg)

    @handles(MaintenanceVectors)
    def on_maintenance_vectors(self, msg: MaintenanceVectors) -> None:
        self.maintenance.maintenance_vectors(msg)
