"""Evidence mapping: new facts are weighed against the persona's entries and the
reflections' observations by the ``map_evidence`` model task; the persona applies the
signals about its own entries and hands those about reflections over.
"""

from __future__ import annotations

from nekomem.actors.messages import ApplySignals, EvidencePass, ModelResult, SignalsProcessed
from nekomem.actors.ports import LayerPorts
from nekomem.domain import evidence as ev
from nekomem.domain import persona as pl
from nekomem.domain.layers import FACTS, REFLECTIONS
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Observation
from nekomem.layers.persona.state import PersonaStore


class EvidenceDone(ModelResult, frozen=True):
    """A ``map_evidence`` job finished for the facts ``fact_ids`` against ``observations``
    (the list the prompt showed, which the answer is validated against)."""

    fact_ids: list[str]
    observations: list[Observation]


class EvidenceMapping:
    """Runs ``map_evidence`` for the facts the fact layer hands over (see the module)."""

    def __init__(self, ports: LayerPorts, store: PersonaStore) -> None:
        self.ports = ports
        self.store = store

    def start(self, msg: EvidencePass) -> None:
        """Send a batch of ``msg.facts`` to ``map_evidence``; with nothing to weigh them
        against, tell the fact layer at once that they are processed."""
        store, s, ports = self.store, self.store.s, self.ports
        now = ports.now()
        batch = msg.facts[: s.evidence_map_max_new_facts]
        own = ev.observation_pool([], store.persona, now, s)
        observations = (list(msg.reflection_observations) + own)[: s.evidence_map_max_observations]
        observations = prompts.cap_observations(observations, store.counter.count, s)
        fact_ids = [f.id for f in batch]
        if not observations:
            ports.send(FACTS, SignalsProcessed(fact_ids=fact_ids))
            return
        messages = prompts.map_evidence_messages(batch, observations, count_tokens=store.counter.count, settings=s, **ports.names())
        token = ports.ask_model(
            "map_evidence",
            messages,
            lambda token, output, error: EvidenceDone(
                token=token, output=output, error=error, fact_ids=fact_ids, observations=observations
            ),
            timeout=s.longterm_map_evidence_timeout_seconds,
        )
        if token is None:
            ports.log.info("map_evidence skipped: no summary tier or model pool full")

    def done(self, msg: EvidenceDone) -> None:
        """Apply the persona's signals (journaled), pass the reflections' on, and tell the
        fact layer the batch is processed. A failed job is only logged. Raises OSError."""
        if msg.error is not None:
            self.ports.log.info("map_evidence failed")
            return
        store = self.store
        signals = ev.resolve_signals(msg.output, msg.fact_ids, msg.observations)
        mine = [s for s in signals if s.target_kind == "persona"]
        theirs = [s for s in signals if s.target_kind == "reflection"]
        if mine:
            new, _changed = pl.apply_resolved_signals(store.persona, mine, self.ports.now(), store.s)
            store.commit(new, type="persona.evidence_updated")
        if theirs:
            self.ports.send(REFLECTIONS, ApplySignals(signals=theirs))
        self.ports.send(FACTS, SignalsProcessed(fact_ids=msg.fact_ids))
