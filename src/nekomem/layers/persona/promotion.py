"""Promotion of reflections into the persona: with powerful memory on, each candidate past
its gate is judged by the ``judge_promotion`` model task; off, by elapsed time alone. The
outcome of each candidate goes back to the reflections and into the /reflect report.
"""

from __future__ import annotations

from nekomem.actors.messages import ModelResult, Promote, PromotionResult, Report
from nekomem.actors.ports import LayerPorts
from nekomem.domain import evidence as ev
from nekomem.domain import persona as pl
from nekomem.domain.layers import REFLECTIONS
from nekomem.domain.persona.promotion import PromotionOutcome
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Reflection
from nekomem.layers.persona.state import PersonaStore
from nekomem.runtime.reply import Reply

# One line of the report's "promotion" list: reflection_id, kind, and entry_id or reason.
PromotionLine = dict[str, object]


class PromotionRound:
    """One Promote message: its judge jobs still out, and the report they fill in. The
    report is answered once, when the last job is back (or at once when none was sent)."""

    def __init__(self, report: Report | None, reply: Reply | None) -> None:
        self.left = 0
        self.report = report
        self.reply = reply
        self.results: list[PromotionLine] = []
        if report is not None:
            report.promotion = self.results

    def maybe_answer(self) -> None:
        if self.left == 0 and self.reply is not None and self.report is not None:
            self.reply.ok(self.report)
            self.reply = None


class PromoteDone(ModelResult, frozen=True):
    """A ``judge_promotion`` job finished for ``reflection`` (as recorded at the attempt),
    one of the jobs of ``round``."""

    reflection: Reflection
    round: PromotionRound


class Promotion:
    """Judges the reflections handed over for promotion (see the module)."""

    def __init__(self, ports: LayerPorts, store: PersonaStore) -> None:
        self.ports = ports
        self.store = store

    def promote(self, msg: Promote) -> None:
        """Decide on each candidate now (time-driven) or send it to ``judge_promotion``;
        answer ``msg.reply`` with the report when every decision is in. Raises OSError."""
        store, s, ports = self.store, self.store.s, self.ports
        now = ports.now()
        round = PromotionRound(msg.report, msg.reply)
        results = round.results
        powerful = ports.powerful()
        for ref in msg.candidates:
            if not powerful:
                outcome = pl.time_driven_promotion(ref, store.persona, store.corrections, now, s, ports.stop_names())
                self._apply_outcome(outcome, results)
                continue
            gate = pl.promotion_gate(ref, now, s)
            if gate == "wait":
                results.append({"reflection_id": ref.id, "kind": "waiting"})
                continue
            if gate == "block":
                blocked = pl.blocked(ref, now)
                ports.send(REFLECTIONS, PromotionResult(reflection=blocked, kind="blocked"))
                results.append({"reflection_id": ref.id, "kind": "blocked"})
                continue
            attempted = pl.record_promotion_attempt(ref, now)
            ports.send(REFLECTIONS, PromotionResult(reflection=attempted, kind="attempt"))
            pool = pl.promotion_pool(attempted, store.persona, msg.candidates, now, s, store.counter.count)
            score = ev.net_score(attempted, now, s)
            messages = prompts.judge_promotion_messages(attempted, score, pool, **ports.names())

            def done(token: int, output: object, error: str | None, attempted: Reflection = attempted) -> PromoteDone:
                return PromoteDone(token=token, output=output, error=error, reflection=attempted, round=round)

            token = ports.ask_model("judge_promotion", messages, done, timeout=s.longterm_promotion_timeout_seconds)
            if token is None:
                results.append({"reflection_id": ref.id, "kind": "skipped", "reason": "no correction tier or model pool full"})
            else:
                round.left += 1
        round.maybe_answer()

    def done(self, msg: PromoteDone) -> None:
        """Apply one judge's answer (a failed job is retried after the gate's backoff).
        Raises OSError."""
        store = self.store
        ref = msg.reflection
        if msg.error is not None:
            msg.round.results.append({"reflection_id": ref.id, "kind": "failed"})
            self.ports.log.info("judge_promotion failed; it is retried after the backoff")
        else:
            outcome = pl.apply_promotion_decision(
                ref, msg.output, store.persona, store.corrections, self.ports.now(), store.s, self.ports.stop_names()
            )
            self._apply_outcome(outcome, msg.round.results)
        msg.round.left -= 1
        msg.round.maybe_answer()

    def _apply_outcome(self, outcome: PromotionOutcome, results: list[PromotionLine]) -> None:
        self.store.commit(outcome.persona, outcome.corrections)
        self.ports.send(REFLECTIONS, PromotionResult(reflection=outcome.reflection, kind=outcome.kind))
        results.append({"reflection_id": outcome.reflection.id, "kind": outcome.kind, "entry_id": outcome.entry_id})
        self.ports.log.info("promotion outcome: %s", outcome.kind)
