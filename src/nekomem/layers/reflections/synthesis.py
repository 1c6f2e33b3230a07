"""Synthesis in the reflections layer: a batch of facts chosen by FactActor becomes one
reflection through the ``synthesize_reflection`` model task, and the facts are absorbed.

A /reflect pass (``report`` set) runs the promotion pass after synthesis, whatever its
outcome, and is answered there; a background synthesis is gated so that the same facts are
not offered again while in flight, after an answer or in backoff.
"""

from __future__ import annotations

from nekomem.actors.messages import AbsorbFacts, ModelResult, Report, Synthesize
from nekomem.actors.ports import LayerPorts
from nekomem.domain import reflections as rl
from nekomem.domain.gates import task_gate
from nekomem.domain.layers import FACTS
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.reflections import SynthesisBatch
from nekomem.layers.reflections.state import ReflectionState
from nekomem.runtime.reply import Reply


class SynthDone(ModelResult, frozen=True):
    """A ``synthesize_reflection`` job finished for ``batch``. ``report`` and
    ``report_reply`` are the /reflect pass's (None for a background synthesis); the reply
    is not the message's own ``reply``, so a failure to handle this result does not answer
    the pass with that failure."""

    batch: SynthesisBatch
    report: Report | None
    report_reply: Reply | None


class ReflectionSynthesis:
    """Synthesis of new reflections into ``state`` (see the module)."""

    def __init__(self, ports: LayerPorts, state: ReflectionState) -> None:
        self.ports = ports
        self.state = state
        self.reset()

    def reset(self) -> None:
        """Forget the backoffs and the gate (as after a (re)load)."""
        self.backoff: dict[str, rl.SynthBackoff] = {}
        self.synth_gate = task_gate(self.state.s)  # background synthesis: not the same batch twice

    def synthesize(self, msg: Synthesize) -> None:
        """Start the model job for ``msg.batch`` unless its reflection exists already, its
        facts are in backoff or (in the background) gated. A /reflect pass that starts
        no job goes on to the promotion pass at once."""
        state = self.state
        s = state.s
        report = msg.report
        batch = msg.batch
        if batch is None:
            if report is not None:
                report.synthesis = {"status": "not_enough_facts"}
                state.promotion_pass(report, msg.reply)
            return
        existing = state.refs.get(batch.reflection_id)
        if existing is not None:
            # A retry of a batch that already produced its reflection (crash between the
            # answer and the absorb): finish the absorb, create nothing.
            self.ports.send(FACTS, AbsorbFacts(ids=list(batch.source_fact_ids), reflection_id=existing.id))
            if report is not None:
                report.synthesis = {"status": "exists", "reflection_id": existing.id}
                state.promotion_pass(report, msg.reply)
            return
        now = self.ports.now()
        if not rl.synthesis_allowed(self.backoff, batch.backoff_key, now, s):
            if report is not None:
                report.synthesis = {"status": "backoff"}
                state.promotion_pass(report, msg.reply)
            return
        background = report is None
        if background and self.synth_gate.blocked(self.ports.clock.monotonic(), batch.backoff_key):
            return  # answered already for these very facts, in backoff, or in flight
        messages = prompts.synthesize_reflection_messages(batch.facts, list(msg.related), now=now, settings=s, **self.ports.names())
        reply = msg.reply

        def done(token: int, output: object, error: str | None) -> SynthDone:
            return SynthDone(token=token, output=output, error=error, batch=batch, report=report, report_reply=reply)

        token = self.ports.ask_model("synthesize_reflection", messages, done, timeout=s.longterm_synthesis_timeout_seconds)
        if token is None:
            if report is not None:
                report.synthesis = {"status": "skipped", "reason": "no summary tier or model pool full"}
                state.promotion_pass(report, msg.reply)
        elif background:
            self.synth_gate.start(batch.backoff_key)

    def synth_done(self, msg: SynthDone) -> None:
        """Save the synthesised reflection and have its facts absorbed, or back off the
        batch when the model gave nothing; then a /reflect pass goes on to promotion."""
        state = self.state
        batch = msg.batch
        report = msg.report
        now = self.ports.now()
        if report is None:
            mono = self.ports.clock.monotonic()
            # A null answer is an answer: the same facts are not offered again until they change.
            if msg.error is not None:
                self.synth_gate.failed_at(mono)
            else:
                self.synth_gate.answered_at(mono)
        ref = None
        if msg.error is None:
            ref = rl.build_reflection(msg.output, batch, now, state.s, state.counter.count)
        if ref is None:
            self.backoff = rl.record_synthesis_failure(self.backoff, batch.backoff_key, now)
            self.ports.log.info("reflection synthesis produced nothing (%s)", "error" if msg.error else "null answer")
            if report is not None:
                report.synthesis = {"status": "failed" if msg.error else "none"}
        else:
            self.backoff = rl.clear_synthesis_backoff(self.backoff, batch.backoff_key)
            if ref.id not in state.refs:
                state.save([ref], "reflection.synthesized")
                self.ports.log.info("synthesised a reflection from %d facts", len(batch.source_fact_ids))
            self.ports.send(FACTS, AbsorbFacts(ids=list(batch.source_fact_ids), reflection_id=ref.id))
            if report is not None:
                report.synthesis = {"status": "created", "reflection_id": ref.id, "text": ref.text}
        if report is not None:
            state.promotion_pass(report, msg.report_reply)
