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
(or, after ``recall_query_embed_timeout_seconds``, from BM25 alone). Nothing is persisted:
the index is rebuilt from the owners' stores at every activation.
"""

from __future__ import annotations

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
    Tick,
    TurnVectorsDone,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import tier_owners
from nekomem.layers.recall.maintenance import MaintenanceRanking
from nekomem.layers.recall.query import QueryPath
from nekomem.layers.recall.state import RecallState
from nekomem.layers.recall.vectors import VectorUpkeep
from nekomem.recall.query_text import forget_memoised_words


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
        self.ports.deadline(s.recall_index_wait_seconds, IndexWaitOver())
        self.maintenance.reset()
        self.state.reset_tokens()
        if not self.ports.first_load():
            # What was in flight to the old instance is sent again with the whole index.
            self.pending_counter.forget(self.ports.character)
            # The index died with the old instance: the owners are asked to send it again.
            for owner in dict.fromkeys(tier_owners().values()):
                self.ports.send(owner, RequestIndex())

    def close(self) -> None:
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
        if msg.replace_tier is not None:
            self.state.fed.add(tier_owners().get(msg.replace_tier, msg.replace_tier))
        self.state.index.upsert(msg.entries, msg.replace_tier)
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
        self.state.index.remove(msg.ids)
        self.state.turn_keys = None
        forget_memoised_words()
        self.vectors.publish_pending()

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
        self.query.query_memory(msg)

    @handles(ExplainQuery)
    def on_ExplainQuery(self, msg: ExplainQuery) -> None:
        """The playground's recall: the plan, embedding and search of /query_memory, over
        the private corpus, answered with each leg explained."""
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
        self.maintenance.rank_for_stage2(msg)

    @handles(RelatedFacts)
    def on_RelatedFacts(self, msg: RelatedFacts) -> None:
        self.maintenance.related_facts(msg)

    @handles(MaintenanceVectors)
    def on_maintenance_vectors(self, msg: MaintenanceVectors) -> None:
        self.maintenance.maintenance_vectors(msg)
