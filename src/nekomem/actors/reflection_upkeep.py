"""The periodic half of ReflectionActor: the promotion timer, the disputation scan of the
raw journal (read-only; RecentActor owns it), the archive sweep and the refinement pass.
"""

from __future__ import annotations

import msgspec

from nekomem.actors.messages import (
    IndexRemove,
    ModelDone,
    Tick,
)
from nekomem.actors.reflection_state import ReflectionState
from nekomem.domain import evidence as ev
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain import refine as rf
from nekomem.domain import reflections as rl
from nekomem.domain.records import assign_shards, new_shard_suffix
from nekomem.domain.reflections.disputation import scan_start
from nekomem.domain.reflections.refinement import cluster_changed, reflection_clusters
from nekomem.domain.turns import Turn
from nekomem.stores.atomic import shard_counts
from nekomem.stores.timeindex_read import TimeIndexReader


class ReflectionUpkeep(ReflectionState):
    """Work of the reflections layer that no message asks for."""

    # -- periodic --------------------------------------------------------------------
    def due_at(self) -> float | None:
        """Promotion (with decay), the archive sweep, refinement and the disputation scan."""
        if self._refine_next is None:
            self._refine_next = self.ctx.clock.monotonic() + self.s.longterm_refine_reflection_initial_delay_seconds
        due = [self.next_promote, self.next_sweep]
        if not self._refine_inflight:
            due.append(self._refine_next)
        if not self.rebuttal_inflight:
            due.append(self.next_rebuttal)
        return min(due)

    def tick(self, msg: Tick) -> None:
        if msg.monotonic >= self.next_promote:
            self.next_promote = msg.monotonic + self.s.reflection_auto_promote_interval_seconds
            self._promotion_pass(None, None)
            # Scores decay with time: tell recall of entries whose filter verdict changed.
            self.send_decayed()
        if msg.monotonic >= self.next_sweep:
            self.next_sweep = msg.monotonic + self.s.evidence_archive_sweep_interval_seconds
            self.sweep()
        self.refine_tick(msg.monotonic)
        self.rebuttal_tick(msg.monotonic)

    # -- periodic disputation scan -------------------------------------------------------
    REBUTTAL_CURSOR = "rebuttal_checked_until"

    def rebuttal_tick(self, monotonic: float) -> None:
        """Every ``reflection_rebuttal_interval_seconds``: read the user's messages since the
        cursor from the raw journal (read-only; RecentActor owns it) and ask the emotion tier
        whether they dispute a confirmed reflection. With powerful memory off, or nothing
        to check, the cursor moves to now so nothing is backfilled later."""
        if monotonic < self.next_rebuttal or self.rebuttal_inflight:
            return
        self.next_rebuttal = monotonic + self.s.reflection_rebuttal_interval_seconds
        now = self.now()
        now_iso = now.isoformat()
        targets = rl.rebuttal_targets(self.refs.values(), now, self.s)
        if not self.powerful() or not targets or not self.model_available("check_disputation"):
            self.cursors.set(self.REBUTTAL_CURSOR, now_iso)
            return
        start = scan_start(self.cursors.get(self.REBUTTAL_CURSOR), now, self.s)
        rows = self._journal_rows(start.isoformat(), now_iso)
        batch = rl.rebuttal_batch(rows, self.s)
        if not batch.messages:
            self.cursors.set(self.REBUTTAL_CURSOR, batch.advance_to or now_iso)
            return
        observations = ev.observation_pool(targets, {}, now, self.s)
        messages = prompts.check_disputation_messages(
            batch.messages, observations, count_tokens=self.counter.count, settings=self.s, **self.names()
        )
        token = self.ask_model(
            "rebuttal",
            "check_disputation",
            messages,
            context={"observations": observations, "advance_to": batch.advance_to or now_iso},
            timeout=self.s.longterm_rebuttal_timeout_seconds,
        )
        self.rebuttal_inflight = token is not None

    def _journal_rows(self, start_iso: str, end_iso: str) -> list[Turn]:
        """The raw journal's turns in [start, end], read-only (RecentActor is its writer)."""
        path = self.ctx.paths.time_index_db
        if not path.exists():
            return []
        with TimeIndexReader.read_only(path) as journal:
            return journal.between(start_iso, end_iso, limit=self.s.reflection_rebuttal_max_rows)

    def done_rebuttal(self, msg: ModelDone) -> None:
        self.rebuttal_inflight = False
        if msg.error is not None:
            mono = self.ctx.clock.monotonic()
            self.next_rebuttal = max(self.next_rebuttal, mono + self.rebuttal_gate.failed_at(mono))
            self.rebuttal_failures += 1
            if self.rebuttal_failures >= self.s.longterm_liveness_max_attempts:
                # Dead letter: do not retry the same window forever.
                self.rebuttal_failures = 0
                self.cursors.set(self.REBUTTAL_CURSOR, msg.context["advance_to"])
            return
        self.rebuttal_failures = 0
        self.rebuttal_gate.answered_at(self.ctx.clock.monotonic())
        signals = ev.resolve_disputed(msg.output, msg.context["observations"])
        ids = [s.target_id for s in signals if s.target_kind == "reflection"]
        updated, changed = rl.apply_disputed(list(self.refs.values()), ids, self.now(), self.s)
        self.save_changed(updated, changed, "reflection.rebutted")
        self.cursors.set(self.REBUTTAL_CURSOR, msg.context["advance_to"])
        if changed:
            self.log.info("disputation scan: %d reflections disputed", len(changed))

    def sweep(self) -> dict[str, int]:
        now = self.now()
        result = rl.archive_sweep(list(self.refs.values()), now, self.s)
        by_id = {r.id: r for r in result.kept}
        self.save([by_id[i] for i in result.counted if i in by_id], "reflection.evidence_updated")
        # Promoted and denied reflections leave the active file as they are, once old.
        _kept, aged = rl.age_out_terminal(result.kept, now, self.s)
        leaving = [*result.archived, *aged]
        if leaving:
            counts = shard_counts(self.ctx.paths.reflection_archive_dir, self.archived_pending)
            shards = assign_shards(counts, len(leaving), now.date(), new_shard_suffix, self.s.evidence_archive_shard_max_entries)
            archived = rl.with_shard_paths(leaving, shards)
            self.record_many(
                ("reflection.state_changed", {"reflection": msgspec.to_builtins(r), "archive_shard": shard})
                for r, shard in zip(archived, shards, strict=True)
            )
            self.ctx.send("recall", IndexRemove(ids=[r.id for r in archived]))
            self.flush()
        return {"archived": len(leaving), "counted": len(result.counted)}

    # -- refinement ------------------------------------------------------------------
    _refine_next: float | None = None
    _refine_inflight: int = 0
    _refine_off_noted: bool = False

    def refine_tick(self, monotonic: float) -> None:
        """Start a refinement pass when one is due (after its initial delay, then every
        longterm_refine_interval_seconds) and the previous pass has finished."""
        if self._refine_next is None:
            self._refine_next = monotonic + self.s.longterm_refine_reflection_initial_delay_seconds
        if monotonic < self._refine_next or self._refine_inflight:
            return
        self._refine_next = monotonic + self.s.longterm_refine_interval_seconds
        self.refine_pass()

    def _refine_vectors(self) -> tuple[str, int] | None:
        """(model id, dim) of a ready embedding service; None (logged once at INFO when
        embeddings are absent or disabled) otherwise."""
        emb = self.ctx.services.embeddings
        if emb is not None and getattr(emb, "is_ready", False) and emb.model_id and emb.dim:
            return emb.model_id, int(emb.dim)
        if (emb is None or getattr(emb, "state", "") == "disabled") and not self._refine_off_noted:
            self._refine_off_noted = True
            self.log.info("reflection refinement is off: no embedding model")
        return None

    def refine_pass(self) -> int:
        """Send the clusters of near-duplicate active reflections (per entity, from the
        cached vectors) to refine_cluster; returns how many were sent. Does nothing with
        powerful memory off, without the correction tier or without embeddings."""
        if not self.powerful() or not self.model_available("refine_cluster"):
            return 0
        vectors = self._refine_vectors()
        if vectors is None:
            return 0
        clusters = reflection_clusters(self.refs.values(), *vectors, self.now(), self.s)
        return self.send_refine_clusters([(members, {}) for members in clusters], "reflection")

    def done_refine(self, msg: ModelDone) -> None:
        self._refine_inflight = max(0, self._refine_inflight - 1)
        members: dict[str, str] = msg.context["members"]
        if cluster_changed(members, self.refs):
            self.log.info("reflection refinement answer dropped: the cluster changed meanwhile")
            return
        refs = [self.refs[i] for i in members]
        now = self.now()
        ops = [] if msg.error is not None else rf.parse_actions(msg.output, list(members))
        if not ops:
            self.save(rf.record_failure(refs, now))
            self.log.info("reflection refinement failed for a cluster of %d (%s)", len(refs), "error" if msg.error else "no valid action")
            return
        result = rf.refine_reflections(refs, ops, now, self.s, taken_ids=self.refs.keys())
        self.save(result.records)
        self.log.info("reflection refinement applied: %s, %d new", result.outcome.counts, len(result.outcome.created))
