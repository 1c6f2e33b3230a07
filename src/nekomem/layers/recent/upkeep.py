"""The recent window's upkeep: compression and review on the model pool, the idle pass
and the idempotency-key purge.

Compression and review run on the model pool; while one is in flight the layer keeps
serving, and the result (a :class:`CompressDone` or :class:`ReviewDone`) is spliced in
only if the window's head is still the snapshot it summarised (or reviewed). Neither
job is a single model call with a plain result (compression may map-reduce over several
``summarize_recent`` calls; a review's failure must say whether the answer ran out of
output tokens), so both go to the pool as jobs of their own through
:meth:`LayerPorts.run_job` rather than through :meth:`LayerPorts.ask_model`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from nekomem.actors.messages import CompressDone, ReviewDone
from nekomem.actors.ports import LayerPorts
from nekomem.domain import recent_window, review, theater
from nekomem.domain.recent_window import CompressResult
from nekomem.domain.turns import Turn, parse_timestamp
from nekomem.layers.recent.state import RecentStore
from nekomem.models.llm import LLMTaskFailed
from nekomem.models.tasks import ReviewRecentOutput, SummarizeRecentOutput
from nekomem.runtime.clock import iso
from nekomem.stores.window_sources import item_key


@dataclass
class _Compression:
    token: int
    snapshot: list[Turn]
    settle: bool
    started: float


class WindowUpkeep:
    """Compression, review and the periodic passes of one character's recent window.

    Built with the layer; :meth:`reset` forgets the jobs in flight at every load (their
    late results are then dropped by token).
    """

    def __init__(self, ports: LayerPorts, store: RecentStore) -> None:
        self.ports = ports
        self.log = ports.log
        self.store = store
        self._token = 0
        self._compression: _Compression | None = None
        self._review_token: int | None = None
        self._review_snapshot: list[Turn] | None = None
        self._last_activity = 0.0
        self._next_compress_try = 0.0
        self._last_purge = 0.0
        # The activity mark of the last idle spell a Tick saw: the idle review is due once
        # per spell. Kept across loads (reset() leaves it).
        self._idle_seen: float | None = None

    def reset(self) -> None:
        """Forget the jobs in flight and start a new activity spell (at every load)."""
        self._token = 0
        self._compression = None
        self._review_token = None
        self._review_snapshot = None
        self._last_activity = self.ports.clock.monotonic()
        self._next_compress_try = 0.0
        self._last_purge = 0.0

    def touch(self) -> None:
        """A write came in: the idle spell starts again."""
        self._last_activity = self.ports.clock.monotonic()

    @property
    def settling(self) -> bool:
        """Whether a compression that a settle or renew waits for is in flight."""
        return self._compression is not None and self._compression.settle

    def after_write(self, *, detailed: bool) -> None:
        """A process/renew/settle write was stored: compress in the background when the
        window needs it (``detailed`` for renew and settle, which /new_dialog waits for),
        and review when the gate allows."""
        if self._compression is not None:
            self._compression.settle = self._compression.settle or detailed
        elif recent_window.needs_compression(self.store.window, self.store.settings):
            self._start_compression(detailed=detailed, settle=detailed)
        self._maybe_review()

    def cancel_review(self) -> bool:
        """Drop the review in flight (its result is then ignored); whether there was one."""
        cancelled = self._review_token is not None
        self._review_token = None
        self._review_snapshot = None
        return cancelled

    # -- compression -----------------------------------------------------------------
    def _llm_ready(self, tier: str) -> bool:
        llm = self.ports.llm
        return llm is not None and llm.available(tier)

    def _start_compression(self, *, detailed: bool, settle: bool) -> bool:
        llm = self.ports.llm
        if llm is None or not llm.available("summary"):
            return False
        store = self.store
        snapshot = list(recent_window.compression_snapshot(store.window, store.settings))
        # Theater capsules are kept whole (after the memo), never summarised into it.
        summarised = [t for t in snapshot if not theater.is_theater(t)]
        if not summarised:
            return False
        self._token += 1
        token = self._token
        stale_hours = self._stale_hours()
        settings = store.settings
        counter = store.counter
        name = self.ports.character

        def summarize(messages: list[dict[str, str]]) -> str:
            output = llm.run("summarize_recent", messages)
            if not isinstance(output, SummarizeRecentOutput):
                raise TypeError(f"summarize_recent returned {type(output).__name__}")
            return output.summary

        def job() -> CompressResult | None:
            return recent_window.compress(
                summarised, summarize, settings, counter, character_name=name, detailed=detailed, stale_hours=stale_hours
            )

        def done(result: object, error: BaseException | None) -> CompressDone:
            return CompressDone(token=token, result=result, error=None if error is None else repr(error))

        if not self.ports.run_job(job, done):
            return False
        self._compression = _Compression(token=token, snapshot=snapshot, settle=settle, started=time.monotonic())
        return True

    def _stale_hours(self) -> float | None:
        anchor = self.store.meta.last_past_block_update_at
        if not anchor:
            return None
        try:
            then = parse_timestamp(anchor)
        except ValueError:
            return None
        return max(0.0, (self.ports.clock.now() - then).total_seconds() / 3600.0)

    def compress_done(self, msg: CompressDone) -> bool:
        """Splice a compression's memo into the window (when its head is still the
        snapshot) or count its failure; False for a late result of a superseded job."""
        comp = self._compression
        if comp is None or comp.token != msg.token:
            return False  # a late result of a superseded compression
        store = self.store
        store.adopt_outside_edit("compress")
        self._compression = None
        now = self.ports.clock.now()
        result = msg.result
        if msg.error is None and isinstance(result, CompressResult):
            spliced = recent_window.splice_memo(store.window, comp.snapshot, result.memo, keep=theater.is_theater)
            if spliced is not None:
                store.window = spliced
                store.tokens = [store.counter.count(t.text) for t in store.window]
                store.enforce_cap()
                store.save_window()
                meta = store.meta
                meta.compressions += 1
                meta.compress_failures = 0
                meta.last_compress_error = None
                meta.last_compress_at = iso(now)
                if meta.last_past_block_update_at is None or result.used_stale_hint:
                    meta.last_past_block_update_at = iso(now)
                self.log.info("compressed the window to %d items (%d llm calls)", len(store.window), result.llm_calls)
            else:
                self.log.info("compression result was moot: the window changed meanwhile")
        else:
            meta = store.meta
            meta.compress_failures += 1
            meta.last_compress_error = msg.error or "summariser returned nothing"
            backoff = min(
                self.ports.settings.recent.recent_compress_retry_max_seconds,
                self.ports.settings.recent.recent_compress_retry_seconds * (2 ** (meta.compress_failures - 1)),
            )
            self._next_compress_try = self.ports.clock.monotonic() + backoff
            self.log.warning("compression failed (%d in a row); the hard cap keeps bounding the window", meta.compress_failures)
        store.save_meta()
        return True

    # -- review ----------------------------------------------------------------------
    def _maybe_review(self) -> None:
        llm = self.ports.llm
        if self._review_token is not None or llm is None or not llm.available("correction"):
            return
        store = self.store
        switch_on = self.ports.review_enabled()
        reason = review.review_gate(
            store.meta.review,
            store.window,
            self._wall(),
            self._last_activity_wall(),
            switch_on,
            store.settings,
            store.counter,
            in_flight=self._review_token is not None,
        )
        if reason is not None:
            return
        snapshot = list(store.window)
        self._token += 1
        token = self._token
        messages = review.build_review_messages(snapshot, master_name=store.settings.master_name, character_name=self.ports.character)
        timeout = self.ports.settings.llm.llm_review_timeout_seconds
        max_tokens = self.ports.settings.llm.llm_review_max_output_tokens

        def job() -> object:
            return llm.run("review_recent", messages, max_output_tokens=max_tokens, timeout=timeout)

        def done(result: object, error: BaseException | None) -> ReviewDone:
            return ReviewDone(
                token=token,
                result=result,
                error=None if error is None else repr(error),
                # The last answer stopped on its output-token limit: that has its own
                # breaker (review.record_output_exhausted).
                exhausted=isinstance(error, LLMTaskFailed) and error.output_exhausted,
            )

        if not self.ports.run_job(job, done):
            return
        self._review_token = token
        self._review_snapshot = snapshot

    def _wall(self) -> float:
        """Epoch seconds on the injectable clock (review times are stored as these)."""
        return self.ports.clock.now().timestamp()

    def _last_activity_wall(self) -> float:
        return self._wall() - (self.ports.clock.monotonic() - self._last_activity)

    def review_done(self, msg: ReviewDone) -> None:
        """Apply a review's corrected dialogue to the window (when it still fits) and record
        the outcome in the review state; a result of a dropped review is ignored."""
        if self._review_token != msg.token:
            return
        store = self.store
        store.adopt_outside_edit("review")
        snapshot = self._review_snapshot or []
        self._review_token = None
        self._review_snapshot = None
        now = self._wall()
        result = msg.result
        if msg.error is not None or not isinstance(result, ReviewRecentOutput):
            if msg.exhausted:
                tokens = sum(store.counter.count(t.text) for t in snapshot)
                store.meta.review = review.record_output_exhausted(store.meta.review, tokens, now, store.settings)
            else:
                store.meta.review = review.record_failure(store.meta.review, snapshot, now, store.settings)
            store.save_meta()
            self.log.info("review failed")
            return
        corrected = [{"role": d.role, "content": d.content} for d in result.corrected_dialogue]
        outcome = review.apply_review_detailed(store.window, snapshot, corrected, store.settings, character_name=self.ports.character)
        if outcome.window is not None and not theater.capsules_kept(store.window, outcome.window):
            # A corrected dialogue never rewrites a theater capsule: the answer is moot.
            self.log.info("review answer would have changed a theater capsule; not applied")
            outcome = review.ReviewApply(None, review.STATUS_WHITE)
        if outcome.window is not None:
            self._note_sources(outcome)
            store.window = outcome.window
            store.tokens = [store.counter.count(t.text) for t in store.window]
            store.enforce_cap()
            store.sources.keep_only(store.window)
            store.sources.save()
            store.save_window()
            store.meta.review = review.record_success(store.meta.review, now, outcome.cutoff_fingerprint)
        elif outcome.status == review.STATUS_CLEAN:
            store.meta.review = review.record_clean(store.meta.review, snapshot, now, store.settings)
        else:
            store.meta.review = review.record_white(store.meta.review, now)
        store.save_meta()
        self.log.info("review finished: %s", outcome.status)

    def _note_sources(self, outcome: review.ReviewApply) -> None:
        """A corrected message no longer matches the row of the item it replaced by text:
        it is mapped to that item's rows, and to the rows of the items the answer left out
        (their words may be in any corrected message), so a forget of any of them takes it."""
        store = self.store
        sources = store.sources

        def rows(item: Turn) -> list[int]:
            return sources.rows_of(item) or store.tindex.row_ids_of(item)

        left_out = [r for item in outcome.dropped for r in rows(item)]
        for old, new in outcome.replaced:
            if item_key(old) != item_key(new) or left_out:
                sources.edited(old, new, [*rows(old), *left_out])

    # -- periodic --------------------------------------------------------------------
    def due_at(self) -> float | None:
        """Idle compression (once idle, after a failure's backoff), the idle review (once
        per idle spell) and the idempotency-key purge."""
        store = self.store
        idle_at = self._last_activity + store.settings.recent_idle_compress_seconds
        due = [self._last_purge + self.ports.settings.server.idempotency_purge_seconds]
        if self._compression is None and self._llm_ready("summary") and recent_window.needs_compression(store.window, store.settings):
            due.append(max(idle_at, self._next_compress_try))
        if self._idle_seen != self._last_activity and self._review_token is None and store.window and self._llm_ready("correction"):
            due.append(idle_at)
        return min(due)

    def tick(self, now: float) -> None:
        """The periodic pass at monotonic time ``now``: compress and review an idle window,
        purge expired idempotency keys."""
        store = self.store
        idle = now - self._last_activity
        if idle >= store.settings.recent_idle_compress_seconds:
            self._idle_seen = self._last_activity
        if (
            self._compression is None
            and idle >= store.settings.recent_idle_compress_seconds
            and now >= self._next_compress_try
            and recent_window.needs_compression(store.window, store.settings)
        ):
            self._start_compression(detailed=True, settle=False)
        if idle >= store.settings.recent_idle_compress_seconds:
            self._maybe_review()
        if now - self._last_purge >= self.ports.settings.server.idempotency_purge_seconds:
            self._last_purge = now
            store.tindex.purge_idempotency(time.time() - self.ports.settings.server.idempotency_ttl_seconds)
