"""The persona's refinement pass: with powerful memory on and an embedding model ready,
entries lacking a vector are embedded on the model pool, then each entity's clusters of
close entries go to the ``refine_cluster`` model task, whose answer may keep, modify,
merge, split or discard them. Protected (card) entries never take part.
"""

from __future__ import annotations

import numpy as np

from nekomem.actors.messages import ModelResult, RefineDone
from nekomem.actors.ports import LayerPorts
from nekomem.actors.refine_jobs import send_refine_clusters
from nekomem.domain import refine as rf
from nekomem.domain.persona.refinement import cluster_changed, missing_vectors, persona_clusters, with_vectors
from nekomem.layers.persona.state import PersonaStore
from nekomem.models.embeddings import EmbeddingService


class RefineVectorsDone(ModelResult, frozen=True):
    """The embedding job of a refinement pass finished: ``output`` holds one row per item
    of ``items`` (entry id, text embedded) for ``model`` of ``dim`` dimensions."""

    items: list[tuple[str, str]]
    model: str
    dim: int


class PersonaRefinement:
    """Runs the refinement pass (see the module) every longterm_refine_interval_seconds,
    after an initial delay, one pass at a time."""

    def __init__(self, ports: LayerPorts, store: PersonaStore) -> None:
        self.ports = ports
        self.store = store
        self.s = store.s
        # Kept over a reload after a storage fault: a pass in flight still comes back.
        self.next_at: float | None = None
        self.inflight = 0  # clusters sent to refine_cluster whose answer has not come back
        self.embedding = False  # the pass's embedding job is out
        self.off_noted = False

    def due_at(self) -> float | None:
        """The next pass, unless one is still running."""
        if self.next_at is None:
            self.next_at = self.ports.clock.monotonic() + self.s.longterm_refine_persona_initial_delay_seconds
        if self.inflight or self.embedding:
            return None
        return self.next_at

    def tick(self, monotonic: float) -> None:
        """Start a pass when one is due and the previous pass has finished."""
        if self.next_at is None:
            self.next_at = monotonic + self.s.longterm_refine_persona_initial_delay_seconds
        if monotonic < self.next_at or self.inflight or self.embedding:
            return
        self.next_at = monotonic + self.s.longterm_refine_interval_seconds
        self.run_pass()

    def _service(self) -> EmbeddingService | None:
        """The embedding service when it is ready; None (logged once at INFO when it is
        absent or disabled) otherwise."""
        emb = self.ports.embeddings
        if emb is not None and emb.is_ready and emb.model_id and emb.dim:
            return emb
        if (emb is None or emb.state == "disabled") and not self.off_noted:
            self.off_noted = True
            self.ports.log.info("persona refinement is off: no embedding model")
        return None

    def run_pass(self) -> int:
        """One pass. Entries without a vector for the current model are embedded first on
        the model pool (the pass goes on when they arrive); then the clusters are sent to
        refine_cluster. Returns the clusters sent now."""
        if not self.ports.powerful() or not self.ports.model_available("refine_cluster"):
            return 0
        emb = self._service()
        if emb is None:
            return 0
        model, dim = str(emb.model_id), int(emb.dim or 0)
        missing = missing_vectors(self.store.persona, model, dim, self.ports.now(), self.s)
        if not missing:
            return self._send(model, dim)
        texts = [text for _id, text in missing]

        def job() -> object:
            return emb.embed(texts, "passage")

        def wrap(result: object, error: BaseException | None) -> RefineVectorsDone:
            return RefineVectorsDone(
                token=0, output=result, error=None if error is None else repr(error), items=missing, model=model, dim=dim
            )

        if not self.ports.run_job(job, wrap):
            return 0
        self.embedding = True
        return 0

    def vectors_done(self, msg: RefineVectorsDone) -> None:
        """Cache the vectors on the entries still holding the text embedded, then send the
        clusters. Vectors are a cache: kept at the next view write, not journaled."""
        self.embedding = False
        # embed() returns one row per text; anything else is a failed job.
        if msg.error is not None or not isinstance(msg.output, np.ndarray):
            self.ports.log.info("persona refinement: embedding failed; retried at the next pass")
            return
        store = self.store
        store.persona, changed = with_vectors(store.persona, msg.items, list(msg.output), msg.model)
        if changed and not store.views.dirty:
            store.views.changed()
        if self.ports.powerful() and self.ports.model_available("refine_cluster"):
            self._send(msg.model, msg.dim)

    def _send(self, model: str, dim: int) -> int:
        clusters = persona_clusters(self.store.persona, model, dim, self.ports.now(), self.s)
        sent = send_refine_clusters(self.ports, [(members, {"entity": entity}) for members, entity in clusters], "persona")
        self.inflight += sent
        return sent

    def refine_done(self, msg: RefineDone) -> None:
        """Apply a cluster's answer (journaled), unless the cluster changed meanwhile; a
        failed or empty answer counts a failed attempt on its members. Raises OSError."""
        self.inflight = max(0, self.inflight - 1)
        store = self.store
        entity = str(msg.extra["entity"])
        members = msg.members
        if cluster_changed(store.persona, entity, members):
            self.ports.log.info("persona refinement answer dropped: the cluster changed meanwhile")
            return
        now = self.ports.now()
        ids = list(members)
        ops = [] if msg.error is not None else rf.parse_actions(msg.output, ids)
        if not ops:
            store.commit(rf.persona_failure(store.persona, entity, ids, now))
            self.ports.log.info("persona refinement failed for a cluster of %d (%s)", len(ids), "error" if msg.error else "no valid action")
            return
        result = rf.refine_persona(store.persona, entity, ids, ops, now, self.s)
        store.commit(result.persona)
        self.ports.log.info("persona refinement applied: %s, %d new", result.outcome.counts, len(result.outcome.created))
