"""The vector side of one character's recall: the index's model kept in line with the
embedding service, the backfill of entries without a vector (in bounded batches on the
model pool, handed back to their owner as :class:`VectorsComputed`), the uncovered
turns' vectors, the embedding-pending count, and the embedding of query texts.
"""

from __future__ import annotations

import sqlite3
import time

from nekomem.actors.messages import BackfillDone, TurnVectorsDone, VectorsComputed
from nekomem.actors.ports import Wrap
from nekomem.domain.layers import Address, tier_owners, vector_tiers
from nekomem.layers.recall.state import RecallPart, RecallState, as_vectors
from nekomem.models.embeddings import EmbeddingsUnavailable
from nekomem.recall.turn_leg import TURN_TIER, TurnCorpus
from nekomem.runtime.protocol import Message
from nekomem.stores.timeindex_read import TimeIndexReader


class VectorUpkeep(RecallPart):
    """The vectors recall still lacks and the jobs that compute them."""

    def __init__(self, state: RecallState) -> None:
        super().__init__(state)
        self.reset()

    def reset(self) -> None:
        """Forget the jobs in flight (at every load: their late results are dropped by token)."""
        self.turn_token: int | None = None  # the embedding job over uncovered turns in flight
        self.turn_after = 0.0  # no turn embedding job before this (monotonic; after a failure)
        self.backfill_token: int | None = None
        self.backfill_items: list[tuple[str, str]] = []
        self.backfill_after = 0.0

    def real_due_at(self) -> float | None:
        """While the embedding service loads, or the vector side lags it, or a backfill
        waits: when to look again (real time: this waits on a model, not on domain time)."""
        emb = self.ports.embeddings
        if emb is None or self.s.recall_legs == "bm25":
            return None
        now = time.monotonic()
        if getattr(emb, "state", "") == "disabled":
            return now if self.index.vectors is not None else None
        ready = self.state.service()
        if ready is None:
            return now + self.ports.settings.runtime.timer_retry_floor_seconds  # still loading
        if self.index.vectors is None or self.index.vector_model != ready.model_id:
            return now
        if self.index.need and self.backfill_token is None:
            return self.backfill_after
        if self.turns is not None and self.turn_token is None and self.s.recall_turn_vectors and self.index.docs and self.turns.missing():
            return max(now, self.turn_after)
        return None

    def safe_sync(self) -> None:
        # The vector side is optional: a failure there is logged, never a crash loop.
        try:
            self.sync_vectors()
            self._pump_turn_vectors()
        except Exception:
            self.log.exception("vector index upkeep failed")

    def sync_vectors(self) -> None:
        """Bring the vector index in line with the embedding service, then backfill (once
        the facts' feed has handed over a loaded segment's entries, which hold the cached
        vectors: reading them from the views one by one would cost more), or once the
        segment's vector block is there to give them."""
        state = self.state
        if state.segment_due or (state.persisted is not None and state.stored_vectors is None):
            return
        emb = state.service()
        model = emb.model_id if emb is not None else None
        if model is None:
            service = self.ports.embeddings
            if self.index.vectors is not None and (service is None or getattr(service, "state", "") == "disabled"):
                self.index.detach_model()
                self.publish_pending()
            return
        assert emb is not None
        stored, state.stored_vectors = state.stored_vectors, None
        if stored is not None and stored.model != model:
            # A block of another model: the entries' cached vectors decide, as before it.
            self.log.info("recall vectors of another model ignored; the facts' feed brings the cached ones")
            state.fed.discard(tier_owners()["fact"])
            state.request_fact_feed()
            return
        if self.index.attach_model(model, int(emb.dim or 0), getattr(emb, "legs", ()), stored=stored):
            self.publish_pending()
        self._pump_backfill()

    def _pump_backfill(self) -> None:
        if self.backfill_token is not None or not self.index.need or self.index.vectors is None:
            return
        if time.monotonic() < self.backfill_after:
            return
        emb = self.state.service()
        if emb is None:
            return
        items, texts = self.index.take_backfill(self.s.recall_embed_batch_size)
        token = self.state.next_token()

        def job() -> object:
            return emb.embed(texts, "passage")

        def wrap(result: object, error: BaseException | None) -> Message:
            return BackfillDone(token=token, items=items, vectors=as_vectors(result), error=None if error is None else repr(error))

        if not self.ports.run_job(job, wrap):
            self.backfill_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            return
        self.index.commit_backfill(items)
        self.backfill_token = token
        self.backfill_items = items

    def backfill_done(self, msg: BackfillDone) -> None:
        if msg.token != self.backfill_token:
            return
        self.backfill_token = None
        if msg.error is not None or msg.vectors is None or self.index.vectors is None:
            # Put the batch back (the entries still there and unchanged) and pause; a
            # disabled service clears the vector side on the next sync instead.
            self.index.restore_backfill(msg.items)
            self.backfill_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            self.log.info("vector backfill failed for %d entries; retrying later", len(msg.items))
            self.sync_vectors()
            self.publish_pending()
            return
        for owner, vectors in self.index.store_backfill(msg.items, msg.vectors).items():
            self.ports.send(Address(owner), VectorsComputed(vectors=vectors))
        self.publish_pending()
        self._pump_backfill()

    def publish_pending(self) -> None:
        self.ports.pending.set(self.ports.character, self.waiting())

    def waiting(self) -> int:
        """Indexed entries without a vector: listed for the backfill or in its batch; while
        the model still loads, every vector-tier entry without a stored vector."""
        if self.index.vectors is None:
            emb = self.ports.embeddings
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

    def submit_embed(self, texts: list[str], wrap: Wrap, *, urgent: bool = False) -> bool:
        """Embed ``texts`` as queries; False when that is not possible.

        ``urgent`` (a user waiting) goes straight to the embedding service, ahead of every
        other text there and without taking a model-pool worker (those may all be busy
        with this or other characters' background work); it is dropped there once
        recall_query_embed_timeout_seconds have passed, when the answer has gone out from
        BM25 alone. Background work goes through the model pool under the character's key,
        which also keeps the character active meanwhile.
        """
        emb = self.state.service()
        if emb is None or self.index.vectors is None:
            return False
        if urgent:
            expires = time.monotonic() + self.s.recall_query_embed_timeout_seconds
            try:
                emb.embed_for_user(texts, self.ports.result_sender(wrap), expires=expires)
            except EmbeddingsUnavailable:
                return False
            return True

        def job() -> object:
            return emb.embed(texts, "query")

        return self.ports.run_job(job, wrap)

    def uncovered_turns(self) -> TurnCorpus | None:
        """The newest recall_uncovered_turns journal turns no long-term memory covers
        (:mod:`nekomem.stores.turn_coverage`), indexed; kept while the journal's rows and
        coverage are unchanged. None when off, or when the journal does not track coverage."""
        limit = self.s.recall_uncovered_turns
        path = self.ports.paths.time_index_db
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

    def _pump_turn_vectors(self) -> None:
        """Embed the next batch of uncovered turns without a vector on the model pool (the
        character's own key: background work), one batch at a time."""
        corpus = self.turns
        if corpus is None or not self.s.recall_turn_vectors or self.turn_token is not None or not self.index.docs:
            return  # (without any entry the journal fallback answers, by BM25)
        emb = self.state.service()
        corpus.use_model(emb.model_id if emb is not None else None)
        if emb is None or time.monotonic() < self.turn_after:
            return
        ids = corpus.missing()[: self.s.recall_embed_batch_size]
        if not ids:
            return
        texts = [corpus.entries[doc_id].text for doc_id in ids]
        model = str(emb.model_id)
        token = self.state.next_token()

        def job() -> object:
            return emb.embed(texts, "passage")

        def wrap(result: object, error: BaseException | None) -> Message:
            return TurnVectorsDone(
                token=token, ids=ids, model=model, vectors=as_vectors(result), error=None if error is None else repr(error)
            )

        if not self.ports.run_job(job, wrap):
            self.turn_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            return
        corpus.embedding.update(ids)
        self.turn_token = token

    def turn_vectors_done(self, msg: TurnVectorsDone) -> None:
        if msg.token != self.turn_token:
            return
        self.turn_token = None
        if self.turns is not None:
            self.turns.store(msg.model, msg.ids, None if msg.error is not None else msg.vectors)
        if msg.error is not None or msg.vectors is None:
            self.turn_after = time.monotonic() + self.s.recall_backfill_retry_seconds
        self.publish_pending()
        self._pump_turn_vectors()
