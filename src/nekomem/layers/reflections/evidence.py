"""Evidence in the reflections layer: the Stage-2 pass over new facts, resolved signals,
the user's answers to surfaced reflections and disputations in their messages (each
checked by a model task), and mentions in the character's replies.
"""

from __future__ import annotations

import msgspec

from nekomem.actors.messages import EvidencePass, ModelResult, RankedIds, RankForStage2
from nekomem.actors.ports import LayerPorts
from nekomem.domain import evidence as ev
from nekomem.domain import reflections as rl
from nekomem.domain.evidence import ResolvedSignal, SignalSource
from nekomem.domain.layers import PERSONA, RECALL, REFLECTIONS
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Fact, Observation, Reflection
from nekomem.domain.reflections.views import TERMINAL
from nekomem.domain.turns import Turn
from nekomem.layers.reflections.state import ReflectionState


class FeedbackDone(ModelResult, frozen=True):
    """A ``check_feedback`` job finished; ``ids`` are the surfaced reflections it asked about."""

    ids: list[str]


class DisputationDone(ModelResult, frozen=True):
    """A ``check_disputation`` job on a user turn finished; ``observations`` are the
    reflections it was shown."""

    observations: list[Observation]


class ReflectionEvidence:
    """Evidence for and against the reflections of ``state`` (see the module)."""

    def __init__(self, ports: LayerPorts, state: ReflectionState) -> None:
        self.ports = ports
        self.state = state
        self.stage2_seq = 0  # kept across a reload: a tag is never reused by one actor
        self.reset()

    def reset(self) -> None:
        """Forget the Stage-2 passes waiting for their rank (as after a (re)load)."""
        self.stage2_pending: dict[str, list[Fact]] = {}

    # -- Stage 2 ---------------------------------------------------------------------
    def new_facts(self, facts: list[Fact]) -> None:
        """Stage 2 starts with a vector coarse rank of the candidate reflections against
        the new facts (RecallActor; evidence order without vectors)."""
        s = self.state.s
        if not s.evidence_signal_check_enabled or not self.ports.powerful():
            return
        now = self.ports.now()
        candidates = [o.id for o in ev.observation_pool(self.state.refs.values(), {}, now, s)]
        if not candidates:
            self.ports.send(PERSONA, EvidencePass(facts=facts, reflection_observations=[]))
            return
        self.stage2_seq += 1
        tag = f"stage2-{self.stage2_seq}"
        self.stage2_pending[tag] = facts
        self.ports.send(
            RECALL,
            RankForStage2(
                query_texts=[f.text for f in facts],
                candidate_ids=candidates,
                budget=s.evidence_map_max_observations,
                reply_child=REFLECTIONS,
                tag=tag,
            ),
        )

    def ranked(self, msg: RankedIds) -> None:
        """Hand the ranked candidates of a Stage-2 pass to the persona layer, which maps
        the evidence (an answer of no pending pass is dropped)."""
        facts = self.stage2_pending.pop(msg.tag, None)
        if facts is None:
            return
        observations = ev.observation_pool(self.state.refs.values(), {}, self.ports.now(), self.state.s, ranked_ids=list(msg.ids))
        self.ports.send(PERSONA, EvidencePass(facts=facts, reflection_observations=observations))

    def apply_signals(self, signals: list[ResolvedSignal], source: SignalSource) -> None:
        """Apply Stage-2 signals resolved by the persona layer."""
        state = self.state
        updated, changed = rl.apply_resolved_signals(list(state.refs.values()), signals, self.ports.now(), state.s, source=source)
        state.save_changed(updated, changed, "reflection.evidence_updated")

    # -- the user's turns ------------------------------------------------------------
    def check_turn(self, turns: list[Turn]) -> None:
        """Ask the model whether the user's messages answer a surfaced reflection or
        dispute one (each only when its tier is configured)."""
        state = self.state
        s = state.s
        user = [t for t in turns if t.role == "human"]
        if not user:
            return
        awaiting = rl.awaiting_feedback(state.surfaced)
        if awaiting and self.ports.model_available("check_feedback"):
            items = [(e.reflection_id, e.text) for e in awaiting if e.reflection_id in state.refs]
            if items:
                messages = prompts.check_feedback_messages(items, user, context=turns, **self.ports.names())
                ids = [i for i, _ in items]

                def feedback_done(token: int, output: object, error: str | None) -> FeedbackDone:
                    return FeedbackDone(token=token, output=output, error=error, ids=ids)

                self.ports.ask_model("check_feedback", messages, feedback_done, timeout=s.longterm_feedback_timeout_seconds)
        # Cheapest test first: powerful() may stat core_config.json, the keyword scan
        # lowercases every user message.
        if (
            self.ports.model_available("check_disputation")
            and self.ports.powerful()
            and rl.contains_negative_keyword([t.text for t in user], s)
        ):
            observations = ev.observation_pool(state.refs.values(), {}, self.ports.now(), s)
            if observations:
                messages = prompts.check_disputation_messages(
                    user, observations, count_tokens=state.counter.count, settings=s, **self.ports.names()
                )

                def disputation_done(token: int, output: object, error: str | None) -> DisputationDone:
                    return DisputationDone(token=token, output=output, error=error, observations=observations)

                self.ports.ask_model("check_disputation", messages, disputation_done, timeout=s.longterm_disputation_timeout_seconds)

    def feedback_done(self, msg: FeedbackDone) -> None:
        """Apply the user's answers to surfaced reflections (each answer once per entry)."""
        state = self.state
        if msg.error is not None:
            self.ports.log.info("check_feedback failed")
            return
        now = self.ports.now()
        changed: list[Reflection] = []
        # Calls overlap (one per user turn): the same answer about an entry counts once.
        recorded = {e.reflection_id: e.feedback for e in state.surfaced}
        for rid, fb in rl.interpret_feedback(msg.output, msg.ids):
            ref = state.refs.get(rid)
            if ref is None or ref.status in TERMINAL or recorded.get(rid) == fb:
                continue
            recorded[rid] = fb
            changed.append(rl.apply_feedback(ref, fb, now, state.s))
            state.surfaced = rl.record_feedback(state.surfaced, rid, fb, now)
        if changed:
            state.views.record_many(
                [("reflection.evidence_updated", {"reflection": msgspec.to_builtins(r)}) for r in changed]
                + [("reflection.surfaced", {"surfaced": msgspec.to_builtins(state.surfaced)})]
            )
            self.ports.index_upsert([state.index_entry(state.refs[r.id]) for r in changed if r.id in state.refs])

    def disputation_done(self, msg: DisputationDone) -> None:
        """Rebut the reflections the user's message disputed."""
        if msg.error is not None:
            return
        state = self.state
        signals = ev.resolve_disputed(msg.output, msg.observations)
        ids = [sig.target_id for sig in signals if sig.target_kind == "reflection"]
        updated, changed = rl.apply_disputed(list(state.refs.values()), ids, self.ports.now(), state.s)
        state.save_changed(updated, changed, "reflection.rebutted")

    # -- the character's replies -----------------------------------------------------
    def record_mentions(self, text: str) -> None:
        """Count the reflections the reply ``text`` mentions as evidence."""
        state = self.state
        updated, changed = rl.record_reply_mentions(list(state.refs.values()), text, self.ports.now(), state.s, self.ports.stop_names())
        state.save_changed(updated, changed, "reflection.evidence_updated")
