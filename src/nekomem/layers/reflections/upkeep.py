"""The periodic work of the reflections layer: the promotion timer, the disputation scan of
the raw journal (read-only; RecentActor owns it), the archive sweep and the refinement pass.
"""

from __future__ import annotations

import msgspec

from nekomem.actors.messages import IndexRemove, ModelResult, RefineDone
from nekomem.actors.ports import LayerPorts
from nekomem.actors.refine_jobs import send_refine_clusters
from nekomem.domain import evidence as ev
from nekomem.domain import refine as rf
from nekomem.domain import reflections as rl
from nekomem.domain.gates import task_gate
from nekomem.domain.layers import RECALL
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Observation, assign_shards, new_shard_suffix
from nekomem.domain.reflections.disputation import scan_start
from nekomem.domain.reflections.refinement import cluster_changed, reflection_clusters
from nekomem.domain.turns import Turn
from nekomem.layers.reflections.state import ReflectionState
from nekomem.stores.atomic import shard_counts
from nekomem.stores.cursors import Cursors
from nekomem.stores.timeindex_read import TimeIndexReader

REBUTTAL_CURSOR = "rebuttal_checked_until"


class RebuttalDone(ModelResult, frozen=True):
    """The disputation scan's ``check_disputation`` job finished: ``observations`` are the
    reflections it was shown, ``advance_to`` where the cursor moves once it is applied."""

    observations: list[Observation]
    advance_to: str


class ReflectionUpkeep:
    """Work of the reflections layer that no message asks for, over ``state``."""

    def __init__(self, ports: LayerPorts, state: ReflectionState) -> None:
        self.ports = ports
        self.state = state
        self.reset()
        # Kept across a reload after a storage fault (like the model jobs in flight).
        self.refine_next: float | None = None
        self.refine_inflight = 0
        self.refine_off_noted = False

    def reset(self) -> None:
        """The timers, the scan's failure count and cursors as after a (re)load: every pass
        waits its initial delay again."""
        s = self.state.s
        mono = self.ports.clock.monotonic()
        self.next_promote = mono + s.reflection_auto_promote_initial_delay_seconds
        self.next_sweep = mono + s.evidence_archive_sweep_initial_delay_seconds
        self.next_rebuttal = mono + s.reflection_rebuttal_initial_delay_seconds
        self.rebuttal_inflight = False
        self.rebuttal_failures = 0
        self.rebuttal_gate = task_gate(s)
        self.cursors = Cursors(self.ports.paths.cursors)

    # -- periodic --------------------------------------------------------------------
    def due_at(self) -> float | None:
        """Promotion (with decay), the archive sweep, refinement and the disputation scan."""
        if self.refine_next is None:
            self.refine_next = self.ports.clock.monotonic() + self.state.s.longterm_refine_reflection_initial_delay_seconds
        due = [self.next_promote, self.next_sweep]
        if not self.refine_inflight:
            due.append(self.refine_next)
        if not self.rebuttal_inflight:
            due.append(self.next_rebuttal)
        return min(due)

    def tick(self, monotonic: float) -> None:
        """Run each pass whose time has come (``monotonic``: when the timer fired)."""
        s = self.state.s
        if monotonic >= self.next_promote:
            self.next_promote = monotonic + s.reflection_auto_promote_interval_seconds
            self.state.promotion_pass(None, None)
            # Scores decay with time: tell recall of entries whose filter verdict changed.
            self.state.send_decayed()
        if monotonic >= self.next_sweep:
            self.next_sweep = monotonic + s.evidence_archive_sweep_interval_seconds
            self.sweep()
        self.refine_tick(monotonic)
        self.rebuttal_tick(monotonic)

    # -- periodic disputation scan ---------------------------------------------------
    def rebuttal_tick(self, monotonic: float) -> None:
        """Every ``reflection_rebuttal_interval_seconds``: read the user's messages since the
        cursor from the raw journal (read-only; RecentActor owns it) and ask the emotion tier
        whether they dispute a confirmed reflection. With powerful memory off, or nothing
        to check, the cursor moves to now so nothing is backfilled later."""
        if monotonic < self.next_rebuttal or self.rebuttal_inflight:
            return
        s = self.state.s
        self.next_rebuttal = monotonic + s.reflection_rebuttal_interval_seconds
        now = self.ports.now()
        now_iso = now.isoformat()
        targets = rl.rebuttal_targets(self.state.refs.values(), now, s)
        if not self.ports.powerful() or not targets or not self.ports.model_available("check_disputation"):
            self.cursors.set(REBUTTAL_CURSOR, now_iso)
            return
        start = scan_start(self.cursors.get(REBUTTAL_CURSOR), now, s)
        rows = self._journal_rows(start.isoformat(), now_iso)
        batch = rl.rebuttal_batch(rows, s)
        if not batch.messages:
            self.cursors.set(REBUTTAL_CURSOR, batch.advance_to or now_iso)
            return
        observations = ev.observation_pool(targets, {}, now, s)
        messages = prompts.check_disputation_messages(
            batch.messages, observations, count_tokens=self.state.counter.count, settings=s, **self.ports.names()
        )
        advance_to = batch.advance_to or now_iso

        def done(token: int, output: object, error: str | None) -> RebuttalDone:
            return RebuttalDone(token=token, output=output, error=error, observations=observations, advance_to=advance_to)

        token = self.ports.ask_model("check_disputation", messages, done, timeout=s.longterm_rebuttal_timeout_seconds)
        self.rebuttal_inflight = token is not None

    def _journal_rows(self, start_iso: str, end_iso: str) -> list[Turn]:
        """The raw journal's turns in [start, end], read-only (RecentActor is its writer)."""
        path = self.ports.paths.time_index_db
        if not path.exists():
            return []
        with TimeIndexReader.read_only(path) as journal:
            return journal.between(start_iso, end_iso, limit=self.state.s.reflection_rebuttal_max_rows)

    def rebuttal_done(self, msg: RebuttalDone) -> None:
        """Apply the scan's answer (disputed reflections lose evidence) and move the cursor;
        after a failure, retry the window after a backoff, up to
        ``longterm_liveness_max_attempts`` times before moving past it."""
        s = self.state.s
        self.rebuttal_inflight = False
        if msg.error is not None:
            mono = self.ports.clock.monotonic()
            self.next_rebuttal = max(self.next_rebuttal, mono + self.rebuttal_gate.failed_at(mono))
            self.rebuttal_failures += 1
            if self.rebuttal_failures >= s.longterm_liveness_max_attempts:
                # Dead letter: do not retry the same window forever.
                self.rebuttal_failures = 0
                self.cursors.set(REBUTTAL_CURSOR, msg.advance_to)
            return
        self.rebuttal_failures = 0
        self.rebuttal_gate.answered_at(self.ports.clock.monotonic())
        signals = ev.resolve_disputed(msg.output, msg.observations)
        ids = [sig.target_id for sig in signals if sig.target_kind == "reflection"]
        updated, changed = rl.apply_disputed(list(self.state.refs.values()), ids, self.ports.now(), s)
        self.state.save_changed(updated, changed, "reflection.rebutted")
        self.cursors.set(REBUTTAL_CURSOR, msg.advance_to)
        if changed:
            self.ports.log.info("disputation scan: %d reflections disputed", len(changed))

    # -- archive sweep ---------------------------------------------------------------
    def sweep(self) -> dict[str, int]:
        """Count the reflections' days without evidence and move the faded and the old
        terminal ones to the archive shards (written at once). Returns the counts."""
        state = self.state
        s = state.s
        now = self.ports.now()
        result = rl.archive_sweep(list(state.refs.values()), now, s)
        by_id = {r.id: r for r in result.kept}
        state.save([by_id[i] for i in result.counted if i in by_id], "reflection.evidence_updated")
        # Promoted and denied reflections leave the active file as they are, once old.
        _kept, aged = rl.age_out_terminal(result.kept, now, s)
        leaving = [*result.archived, *aged]
        if leaving:
            counts = shard_counts(self.ports.paths.reflection_archive_dir, state.archived_pending)
            shards = assign_shards(counts, len(leaving), now.date(), new_shard_suffix, s.evidence_archive_shard_max_entries)
            archived = rl.with_shard_paths(leaving, shards)
            state.views.record_many(
                ("reflection.state_changed", {"reflection": msgspec.to_builtins(r), "archive_shard": shard})
                for r, shard in zip(archived, shards, strict=True)
            )
            self.ports.send(RECALL, IndexRemove(ids=[r.id for r in archived]))
            state.views.flush()
        return {"archived": len(leaving), "counted": len(result.counted)}

    # -- refinement ------------------------------------------------------------------
    def refine_tick(self, monotonic: float) -> None:
        """Start a refinement pass when one is due (after its initial delay, then every
        longterm_refine_interval_seconds) and the previous pass has finished."""
        s = self.state.s
        if self.refine_next is None:
            self.refine_next = monotonic + s.longterm_refine_reflection_initial_delay_seconds
        if monotonic < self.refine_next or self.refine_inflight:
            return
        self.refine_next = monotonic + s.longterm_refine_interval_seconds
        self.refine_pass()

    def _refine_vectors(self) -> tuple[str, int] | None:
        """(model id, dim) of a ready embedding service; None (logged once at INFO when
        embeddings are absent or disabled) otherwise."""
        emb = self.ports.embeddings
        if emb is not None and emb.is_ready and emb.model_id and emb.dim:
            return emb.model_id, int(emb.dim)
        if (emb is None or emb.state == "disabled") and not self.refine_off_noted:
            self.refine_off_noted = True
            self.ports.log.info("reflection refinement is off: no embedding model")
        return None

    def refine_pass(self) -> int:
        """Send the clusters of near-duplicate active reflections (per entity, from the
        cached vectors) to refine_cluster; returns how many were sent. Does nothing with
        powerful memory off, without the correction tier or without embeddings."""
        if not self.ports.powerful() or not self.ports.model_available("refine_cluster"):
            return 0
        vectors = self._refine_vectors()
        if vectors is None:
            return 0
        clusters = reflection_clusters(self.state.refs.values(), *vectors, self.ports.now(), self.state.s)
        sent = send_refine_clusters(self.ports, [(members, {}) for members in clusters], "reflection")
        self.refine_inflight += sent
        return sent

    def refine_done(self, msg: RefineDone) -> None:
        """Apply a cluster's refine_cluster answer, unless the cluster changed meanwhile; a
        failed or empty answer is recorded on its members (they are retried later)."""
        state = self.state
        self.refine_inflight = max(0, self.refine_inflight - 1)
        members = msg.members
        if cluster_changed(members, state.refs):
            self.ports.log.info("reflection refinement answer dropped: the cluster changed meanwhile")
            return
        refs = [state.refs[i] for i in members]
        now = self.ports.now()
        ops = [] if msg.error is not None else rf.parse_actions(msg.output, list(members))
        if not ops:
            state.save(rf.record_failure(refs, now))
            self.ports.log.info(
                "reflection refinement failed for a cluster of %d (%s)", len(refs), "error" if msg.error else "no valid action"
            )
            return
        result = rf.refine_reflections(refs, ops, now, state.s, taken_ids=state.refs.keys())
        state.save(result.records)
        self.ports.log.info("reflection refinement applied: %s, %d new", result.outcome.counts, len(result.outcome.created))
