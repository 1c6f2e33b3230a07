"""The fact layer's part of reflection synthesis: it picks the batch of facts a synthesis
works on (periodically, and for POST /reflect), asks RecallActor for the facts related to
them, then hands both to ReflectionActor.
"""

from __future__ import annotations

from nekomem.actors.messages import RelatedFacts, Report, Synthesize
from nekomem.actors.ports import LayerPorts
from nekomem.domain import reflections as rl
from nekomem.domain.layers import FACTS, RECALL, REFLECTIONS
from nekomem.domain.reflections.synthesis import SynthesisBatch
from nekomem.domain.subjects import is_private
from nekomem.layers.facts.state import FactStore
from nekomem.runtime.reply import Reply

Pending = tuple[SynthesisBatch, Report | None, Reply | None]


class SynthesisPicker:
    """The synthesis timer and the batches waiting for their related facts."""

    def __init__(self, ports: LayerPorts, store: FactStore) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.store = store
        self.pending: dict[str, Pending] = {}  # RankedIds tag -> the batch asking
        # Tags stay unique over the reloads of one instance (an answer to a batch of
        # before a reload is then dropped, not taken for a newer one).
        self.seq = 0
        self.next_at = self.ports.clock.monotonic() + self.s.reflection_synthesis_initial_delay_seconds

    def reset(self) -> None:
        """Forget the waiting batches; the first periodic pass waits the initial delay."""
        self.pending = {}
        self.next_at = self.ports.clock.monotonic() + self.s.reflection_synthesis_initial_delay_seconds

    def tick(self, monotonic: float) -> None:
        """Start the periodic pass when its time has come."""
        if monotonic >= self.next_at:
            self.next_at = monotonic + self.s.reflection_synthesis_interval_seconds
            self.start(None, None)

    def start(self, report: Report | None, reply: Reply | None) -> None:
        """Pick the batch, ask RecallActor for related facts (cosine; empty without
        vectors), then hand both to ReflectionActor. With no batch, a /reflect pass
        (``report`` set) goes on to ReflectionActor at once."""
        batch = rl.synthesis_batch(self.store.facts.values(), self.s)
        if batch is None:
            if report is not None:
                self.ports.send(REFLECTIONS, Synthesize(batch=None, report=report, reply=reply))
            return
        self.seq += 1
        tag = f"synth-{self.seq}"
        self.pending[tag] = (batch, report, reply)
        self.ports.send(
            RECALL,
            RelatedFacts(
                query_texts=[f.text for f in batch.facts],
                per_query_k=self.s.reflection_related_per_query_k,
                cap=self.s.reflection_related_total_cap,
                reply_child=FACTS,
                tag=tag,
                tiers=["fact", "fact_archive"],
                exclude_ids=list(batch.source_fact_ids),
            ),
        )

    def related(self, tag: str, ids: list[str]) -> None:
        """Recall answered batch ``tag`` with related fact ``ids``: the private ones go
        with the batch to ReflectionActor (an unknown tag is dropped)."""
        pending = self.pending.pop(tag, None)
        if pending is None:
            return
        batch, report, reply = pending
        store = self.store
        found = [store.facts.get(i) or store.archive.get(i) for i in ids]
        related = [f for f in found if f is not None and is_private(f)]
        self.ports.send(REFLECTIONS, Synthesize(batch=batch, related=related, report=report, reply=reply))
