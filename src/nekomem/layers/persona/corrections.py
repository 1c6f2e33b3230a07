"""The persona's queue of corrections: contradictions between a new entry and the persona,
resolved one at a time by the ``resolve_correction`` model task, behind a gate with
backoff, when powerful memory is on.
"""

from __future__ import annotations

from nekomem.actors.messages import CorrectionResolved, ModelResult
from nekomem.actors.ports import LayerPorts
from nekomem.domain import persona as pl
from nekomem.domain.gates import TaskGate, task_gate
from nekomem.domain.layers import REFLECTIONS
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Correction
from nekomem.layers.persona.state import PersonaStore


class CorrectionDone(ModelResult, frozen=True):
    """A ``resolve_correction`` job finished for the queued correction ``item``."""

    item: Correction


class CorrectionQueue:
    """Resolves the store's queued corrections one at a time (see the module)."""

    def __init__(self, ports: LayerPorts, store: PersonaStore) -> None:
        self.ports = ports
        self.store = store
        self.s = store.s
        self.inflight = False
        self.gate: TaskGate = task_gate(self.s, self.s.longterm_idle_maintenance_interval_seconds)
        self.next_at = 0.0

    def reset(self, monotonic: float) -> None:
        """A fresh start at load: nothing in flight, a new gate, the first attempt after
        the initial delay from ``monotonic``."""
        self.inflight = False
        self.gate = task_gate(self.s, self.s.longterm_idle_maintenance_interval_seconds)
        self.next_at = monotonic + self.s.longterm_idle_maintenance_initial_delay_seconds

    def due_at(self) -> float | None:
        """The next attempt, when corrections wait and none is in flight."""
        return self.next_at if self.store.corrections and not self.inflight else None

    def tick(self, monotonic: float) -> None:
        if monotonic >= self.next_at:
            self.next_at = monotonic + self.s.longterm_idle_maintenance_interval_seconds
            self.resolve_next()

    def resolve_next(self) -> None:
        """Send the first correction of the batch to ``resolve_correction`` unless one is
        in flight, the queue is empty, powerful memory is off or the gate is closed."""
        if self.inflight or not self.store.corrections or not self.ports.powerful():
            return
        if self.gate.blocked(self.ports.clock.monotonic()):
            return
        batch = pl.correction_batch(self.store.corrections, self.s)
        if not batch:
            return
        item = batch[0]
        messages = prompts.resolve_correction_messages(item, **self.ports.names())
        token = self.ports.ask_model(
            "resolve_correction",
            messages,
            lambda token, output, error: CorrectionDone(token=token, output=output, error=error, item=item),
            timeout=self.s.longterm_correction_timeout_seconds,
        )
        self.inflight = token is not None
        if token is not None:
            self.gate.start()

    def done(self, msg: CorrectionDone) -> None:
        """Apply the answer (a failed or invalid one counts against the item and backs the
        gate off). Raises OSError."""
        self.inflight = False
        store = self.store
        item = msg.item
        clock = self.ports.clock
        outcome = (
            None
            if msg.error is not None
            else pl.apply_correction(store.persona, store.corrections, item, msg.output, self.ports.now(), self.s)
        )
        if outcome is None or outcome.kind == "invalid":
            self.gate.failed_at(clock.monotonic())
            corrections, _dead = pl.record_correction_failure(store.corrections, item, self.s)
            store.commit(pl.copy_persona(store.persona), corrections)
            return
        self.gate.answered_at(clock.monotonic())
        store.commit(outcome.persona, outcome.corrections)
        if outcome.source_id:
            self.ports.send(REFLECTIONS, CorrectionResolved(reflection_id=outcome.source_id, kind=outcome.kind))
