"""The background recall of the long-term pipeline: stage-2 candidates ranked by their
vectors (:class:`RankForStage2`) and the facts related to some texts
(:class:`RelatedFacts`), answered with :class:`RankedIds` through the ports (or the
message's reply).
"""

from __future__ import annotations

from nekomem.actors.messages import MaintenanceRecall, MaintenanceVectors, RankedIds, RankForStage2, RelatedFacts
from nekomem.actors.ports import Wrap
from nekomem.domain.layers import Address
from nekomem.layers.recall.state import RecallPart, RecallState, as_vectors
from nekomem.layers.recall.vectors import VectorUpkeep
from nekomem.runtime.protocol import Message


class MaintenanceRanking(RecallPart):
    """The pipeline's recall requests waiting for their query vectors."""

    def __init__(self, state: RecallState, vectors: VectorUpkeep) -> None:
        super().__init__(state)
        self.vectors = vectors
        self.maintenance: dict[int, tuple[MaintenanceRecall, list[str], int, int, list[str]]] = {}

    def reset(self) -> None:
        self.maintenance = {}

    def _answer(self, msg: MaintenanceRecall, ids: list[str]) -> None:
        if msg.reply_child is not None:
            self.ports.send(Address(msg.reply_child), RankedIds(tag=msg.tag, ids=ids))
        if msg.reply is not None:
            msg.reply.ok(ids)

    def _maintenance_wrap(self, token: int) -> Wrap:
        def wrap(result: object, error: BaseException | None) -> Message:
            return MaintenanceVectors(token=token, vectors=as_vectors(result), error=None if error is None else repr(error))

        return wrap

    def rank_for_stage2(self, msg: RankForStage2) -> None:
        self.vectors.sync_vectors()
        candidates = list(dict.fromkeys(c for c in msg.candidate_ids if c))
        k = max(msg.budget, 0) * self.s.recall_coarse_oversample
        queries = [q.strip() for q in msg.query_texts if isinstance(q, str) and q.strip()]
        if k == 0 or not candidates:
            self._answer(msg, [])
            return
        vectors = self.index.vectors
        extra = [c for c in candidates if (vectors is None or c not in vectors) and msg.candidate_texts.get(c, "").strip()]
        token = self.state.next_token()
        if queries and self.vectors.submit_embed(queries + [msg.candidate_texts[c] for c in extra], self._maintenance_wrap(token)):
            self.maintenance[token] = (msg, candidates, k, len(queries), extra)
            return
        self._answer(msg, candidates[:k])

    def related_facts(self, msg: RelatedFacts) -> None:
        self.vectors.sync_vectors()
        queries = [q.strip() for q in msg.query_texts if isinstance(q, str) and q.strip()]
        token = self.state.next_token()
        if (
            queries
            and msg.per_query_k > 0
            and msg.cap > 0
            and self.index.vector_count()
            and self.vectors.submit_embed(queries, self._maintenance_wrap(token))
        ):
            self.maintenance[token] = (msg, [], 0, len(queries), [])
            return
        self._answer(msg, [])

    def maintenance_vectors(self, msg: MaintenanceVectors) -> None:
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
