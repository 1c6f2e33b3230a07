"""Duplicate judgments of the fact layer: paraphrase pairs found once RecallActor has
computed the vectors of new facts, judged in batches by ``judge_duplicates`` behind a
gate with backoff (the lexical and exact duplicates never reach the store: see
:class:`~nekomem.domain.dedup_index.DedupIndex`).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from nekomem.actors.messages import IndexRemove, ModelResult, RelatedFacts
from nekomem.actors.ports import LayerPorts
from nekomem.domain import fact_dedup as fd
from nekomem.domain.gates import task_gate
from nekomem.domain.layers import FACTS, RECALL
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import DedupPair
from nekomem.domain.subjects import same_corpus
from nekomem.domain.vector_codec import try_decode
from nekomem.layers.facts.state import FactStore, fact_index_entry


class DupsDone(ModelResult, frozen=True):
    """A ``judge_duplicates`` job over the pairs ``batch`` finished."""

    batch: list[DedupPair]


class DuplicateJudge:
    """The queue of paraphrase pairs awaiting ``judge_duplicates`` (a cache: rebuilt as
    facts arrive), the judgment in flight and its gate."""

    def __init__(self, ports: LayerPorts, store: FactStore) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.store = store
        self.queue: list[DedupPair] = []
        self.inflight = False
        self.gate = task_gate(self.s, self.s.longterm_idle_maintenance_interval_seconds)
        # (queue length, monotonic time) of the last tick that found pairs waiting: a
        # queue that has not grown since is retried per idle-maintenance interval.
        self.tried: tuple[int, float] = (0, 0.0)

    def reset(self) -> None:
        """Forget the queue and the judgment in flight (a load)."""
        self.queue = []
        self.inflight = False
        self.gate = task_gate(self.s, self.s.longterm_idle_maintenance_interval_seconds)

    def vectors_ready(self, vectors: Mapping[str, object]) -> None:
        """Vectors of ``vectors``' ids were computed: each new fact among them asks recall
        for its nearest facts (powerful memory on), answered as RecallAnswer ``dup-<id>``."""
        store = self.store
        for fid in [f for f in vectors if f in store.awaiting_vectors]:
            store.awaiting_vectors.discard(fid)
            fact = store.facts.get(fid)
            if fact is None or not self.ports.powerful():
                continue
            self.ports.send(
                RECALL,
                RelatedFacts(
                    query_texts=[fact.text],
                    per_query_k=self.s.fact_dedup_pairs_per_new + 1,
                    cap=self.s.fact_dedup_pairs_per_new + 1,
                    reply_child=FACTS,
                    tag="dup-" + fid,
                    tiers=["fact"],
                    exclude_ids=[fid],
                ),
            )

    def candidates(self, fid: str, neighbour_ids: list[str]) -> None:
        """Queue the paraphrase pairs of fact ``fid`` among its nearest facts (cosine of
        their cached vectors, same corpus and model only)."""
        facts = self.store.facts
        fact = facts.get(fid)
        embeddings = self.ports.embeddings
        dim = embeddings.dim if embeddings is not None else None
        if fact is None or not isinstance(fact.embedding, str) or not dim:
            return
        mine = try_decode(fact.embedding, dim)
        if mine is None:
            return
        scored = []
        for nid in neighbour_ids:
            other = facts.get(nid)
            if (
                other is None
                or not same_corpus(other, fact)
                or not isinstance(other.embedding, str)
                or other.embedding_model_id != fact.embedding_model_id
            ):
                continue
            vec = try_decode(other.embedding, dim)
            if vec is not None and vec.shape == mine.shape:
                scored.append((other, float(mine @ vec)))
        pairs = fd.paraphrase_pairs(fact, scored, self.ports.now(), self.s)
        if pairs:
            self.queue = fd.enqueue_pairs(self.queue, pairs)
            self.ports.log.info("queued %d paraphrase pairs for judge_duplicates", len(pairs))

    def due(self, monotonic: float) -> float | None:
        """Monotonic time of the next judgment: at once for new pairs, else per
        idle-maintenance interval (never before the gate opens); None when none waits."""
        if not self.queue or self.inflight or not self.ports.model_available("judge_duplicates"):
            return None
        fresh = len(self.queue) != self.tried[0]
        retry = monotonic if fresh else self.tried[1] + self.s.longterm_idle_maintenance_interval_seconds
        return max(retry, self.gate.not_before)

    def tick(self, monotonic: float) -> None:
        """Note the pairs seen waiting at ``monotonic``, then judge a batch if allowed."""
        if self.queue and not self.inflight:
            self.tried = (len(self.queue), monotonic)
        self.judge()

    def judge(self) -> None:
        """Send one batch of pairs to ``judge_duplicates`` (powerful memory on, gate open)."""
        if self.inflight or not self.queue or not self.ports.powerful():
            return
        batch = fd.dedup_batch(self.queue, self.s)
        if not batch or self.gate.blocked(self.ports.clock.monotonic()):
            return
        messages = prompts.judge_duplicates_messages(batch, **self.ports.names())
        token = self.ports.ask_model(
            "judge_duplicates",
            messages,
            lambda token, output, error: DupsDone(token=token, output=output, error=error, batch=batch),
            timeout=self.s.longterm_dedup_timeout_seconds,
        )
        self.inflight = token is not None
        if token is not None:
            self.gate.start()

    def done(self, msg: DupsDone) -> None:
        """Apply a judgment: duplicates deleted, the kept facts rewritten (journaled), the
        recall index and the dedup index told. A failure counts an attempt per pair.
        Raises OSError."""
        self.inflight = False
        batch = msg.batch
        store = self.store
        if msg.error is not None:
            self.queue, _dropped = fd.record_dedup_failure(self.queue, batch, self.s)
            self.gate.failed_at(self.ports.clock.monotonic())
            return
        result = fd.apply_duplicate_decisions(list(store.facts.values()), self.queue, batch, msg.output, self.s)
        self.queue = list(result.queue)
        if result.decided:
            self.gate.answered_at(self.ports.clock.monotonic())
        else:  # no usable decision: counted as a failure of the batch
            self.gate.failed_at(self.ports.clock.monotonic())
        by_id = {f.id: f for f in result.facts}
        items: list[tuple[str, Mapping[str, object]]] = [("fact.deleted", {"id": i}) for i in result.removed_ids]
        items += [("fact.updated", {"fact": msgspec.to_builtins(by_id[i])}) for i in result.changed_ids if i in by_id]
        store.record_many(items)
        for i in result.removed_ids:
            store.dedup.remove(i)
        if result.removed_ids:
            self.ports.send(RECALL, IndexRemove(ids=list(result.removed_ids)))
        changed = [by_id[i] for i in result.changed_ids if i in by_id]
        for fact in changed:
            store.dedup.add(fact)
        if changed:
            self.ports.index_upsert([fact_index_entry(f, "fact") for f in changed])
        self.ports.log.info("judge_duplicates: %d removed, %d rewritten", len(result.removed_ids), len(result.changed_ids))
