"""RecentActor: the recent window (recent.json + recent_meta.json) and the raw journal
(time_indexed.db).

A write is durable before it is answered, with one fsync: the turns go to the time index
in one SQLite transaction (synchronous=FULL), which also stores the Idempotency-Key's
response and the post-turn cursor. recent.json and recent_meta.json are then replaced
atomically without fsync (a killed process leaves them whole; after a power loss the window
is rebuilt at load from the window base and the rows after it, see
:mod:`nekomem.domain.window_rebuild`), and /cache is answered. The post-turn
work record goes to the outbox after the answer (its own fsync, off the request's path);
the outbox acknowledges it and the cursor moves with the next transaction, so rows after
the cursor at load are enqueued again (the outbox ignores ranges it already holds).
/process, /renew and /settle still wait for their record, but not for compression. Compression and review
run on the model pool; while one is in flight the actor keeps serving, and the result is
spliced in only if the window's head is still the snapshot it summarised.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    AppendTurns,
    BacklogMined,
    CancelCorrection,
    CompressDone,
    EditRecent,
    Flush,
    ForgetTurns,
    GetRecent,
    OutboxAck,
    OutboxAcks,
    RecentView,
    ReviewDone,
    Tick,
)
from nekomem.actors.recent_theater import RecentTheater
from nekomem.domain import recent_window, review, theater
from nekomem.domain.turns import Turn
from nekomem.runtime.clock import iso
from nekomem.runtime.pool import PoolFull
from nekomem.runtime.reply import ActorFailure, Reply

RESULT_STATUS = {"cache": "cached", "process": "processed", "renew": "processed", "settle": "settled"}


@dataclass
class _PendingWrite:
    reply: Reply | None
    value: dict[str, Any]
    wait_outbox: bool


@dataclass
class _Compression:
    token: int
    snapshot: list[Turn]
    settle: bool
    started: float


class RecentActor(RecentTheater):
    child_name = "recent"

    def load(self) -> None:
        self._token = 0
        self._compression: _Compression | None = None
        self._review_token: int | None = None
        self._review_snapshot: list[Turn] | None = None
        self._settle_waiters: list[GetRecent] = []
        self._writes: dict[int, _PendingWrite] = {}
        self._write_seq = 0
        self._last_activity = self.ctx.clock.monotonic()
        self._next_compress_try = 0.0
        self._last_purge = 0.0
        super().load()

    # -- writes ----------------------------------------------------------------------
    @handles(AppendTurns)
    def on_AppendTurns(self, msg: AppendTurns) -> None:
        # An outside edit of recent.json is adopted before the window is used: for /cache
        # right before the new turns join it (the one look of the write, taken as close to
        # the rename as it can be); the other modes also start compression or review.
        looked = msg.mode != "cache"
        if looked:
            self.adopt_outside_edit("write")
        self._last_activity = self.ctx.clock.monotonic()
        key = msg.idempotency_key
        if key:
            stored = self.tindex.idempotent_response(key)
            if stored is not None:
                msg.reply.ok(msgspec.json.decode(stored))
                return
        turns = msg.turns
        if msg.mode != "cache" and turns:
            # A session-boundary batch that repeats the stored tail (a retry without a key,
            # or the reference's /settle with the whole already-cached history) is not
            # stored twice; /cache batches are each a new turn and are stored as sent.
            turns = turns[self._overlap_with_stored_tail(turns) :]
        value: dict[str, Any] = {"status": RESULT_STATUS[msg.mode]}
        if msg.mode == "cache":
            value["count"] = len(msg.turns)
        if turns or key:
            self.tindex.append(
                msg.session_id,
                turns,
                idempotency_key=key,
                response=msgspec.json.encode(value) if key else None,
                cursors=self.cursor_updates(),
            )
        if turns:
            if not looked:
                self.adopt_outside_edit("write")
            self.window.extend(turns)
            self._append_token_counts(turns)
            # recent_meta.json (and its journal_row) is written with the next meta change
            # or flush: at load, rows after the stored journal_row that recent.json already
            # ends with are recognised, so one rename per write is enough.
            self.meta.journal_row = self.tindex.last_row_id
            # Without fsync: at load the window is rebuilt as base + rows. A cap that cut a
            # text makes a window that is not that, so it is written durably (a new base).
            cut = self._enforce_cap()
            self._save_window(durable=cut, looked=msg.mode == "cache")
        write = _PendingWrite(reply=msg.reply, value=value, wait_outbox=bool(turns))
        if turns:
            last = self.tindex.last_row_id
            first = last - len(turns) + 1
            if msg.mode == "cache":
                # Durable with the rows (the cursor rebuilds the record): answer first.
                write.wait_outbox = False
                self._finish_if_ready(write)
                self._enqueue_post_turn(turns, msg.session_id, first, last)
            else:
                self._write_seq += 1
                self._writes[self._write_seq] = write
                self._enqueue_post_turn(turns, msg.session_id, first, last, self._write_seq)
        if msg.mode != "cache":
            # The write is answered once its turns and record are durable; compression runs
            # in the background (a slow or failing model never holds the conversation).
            # /new_dialog still waits for a settle/renew compression (``settle`` below).
            detailed = msg.mode in ("renew", "settle")
            if self._compression is not None:
                self._compression.settle = self._compression.settle or detailed
            elif recent_window.needs_compression(self.window, self.settings):
                self._start_compression(detailed=detailed, settle=detailed)
            self._maybe_review()
        self._finish_if_ready(write)

    @handles(OutboxAcks)
    def on_OutboxAcks(self, msg: OutboxAcks) -> None:
        for ack in msg.acks:
            self.on_OutboxAck(ack)

    @handles(BacklogMined)
    def on_BacklogMined(self, msg: BacklogMined) -> None:
        self.backlog.mined(msg.row)
        self.feed_backlog()

    @handles(OutboxAck)
    def on_OutboxAck(self, msg: OutboxAck) -> None:
        if msg.row:
            self.post_turn.acked(msg.row)
        write = self._writes.pop(msg.write_id, None)
        if write is not None:
            write.wait_outbox = False
            self._finish_if_ready(write)

    def _finish_if_ready(self, write: _PendingWrite) -> None:
        if write.reply is not None and not write.wait_outbox:
            write.reply.ok(write.value)
            write.reply = None

    @handles(CancelCorrection)
    def on_CancelCorrection(self, msg: CancelCorrection) -> None:
        """The reference's memory browser saved recent.json: adopt it, drop a running review."""
        self.adopt_outside_edit("cancel_correction")
        cancelled = self._review_token is not None
        self._review_token = None
        self._review_snapshot = None
        msg.reply.ok({"status": "cancelled" if cancelled else "no_task"})

    # -- compression -----------------------------------------------------------------
    def _llm_ready(self, tier: str) -> bool:
        llm = self.ctx.services.llm
        return llm is not None and llm.available(tier)

    def _start_compression(self, *, detailed: bool, settle: bool) -> bool:
        if not self._llm_ready("summary"):
            return False
        snapshot = list(recent_window.compression_snapshot(self.window, self.settings))
        # Theater capsules are kept whole (after the memo), never summarised into it.
        summarised = [t for t in snapshot if not theater.is_theater(t)]
        if not summarised:
            return False
        self._token += 1
        token = self._token
        stale_hours = self._stale_hours()
        llm = self.ctx.services.llm
        settings = self.settings
        counter = self.counter
        name = self.ctx.name

        def summarize(messages: list[dict[str, Any]]) -> str:
            return llm.run("summarize_recent", messages).summary

        def job() -> Any:
            return recent_window.compress(
                summarised, summarize, settings, counter, character_name=name, detailed=detailed, stale_hours=stale_hours
            )

        try:
            self.ctx.submit_model_job(
                "recent", job, lambda result, error: CompressDone(token=token, result=result, error=None if error is None else repr(error))
            )
        except PoolFull:
            return False
        self._compression = _Compression(token=token, snapshot=snapshot, settle=settle, started=time.monotonic())
        return True

    def _stale_hours(self) -> float | None:
        anchor = self.meta.last_past_block_update_at
        if not anchor:
            return None
        from nekomem.domain.turns import parse_timestamp

        try:
            then = parse_timestamp(anchor)
        except ValueError:
            return None
        return max(0.0, (self.ctx.clock.now() - then).total_seconds() / 3600.0)

    @handles(CompressDone)
    def on_CompressDone(self, msg: CompressDone) -> None:
        comp = self._compression
        if comp is None or comp.token != msg.token:
            return  # a late result of a superseded compression
        self.adopt_outside_edit("compress")
        self._compression = None
        now = self.ctx.clock.now()
        result = msg.result
        if msg.error is None and result is not None:
            spliced = recent_window.splice_memo(self.window, comp.snapshot, result.memo, keep=theater.is_theater)
            if spliced is not None:
                self.window = spliced
                self.tokens = [self.counter.count(t.text) for t in self.window]
                self._enforce_cap()
                self._save_window()
                self.meta.compressions += 1
                self.meta.compress_failures = 0
                self.meta.last_compress_error = None
                self.meta.last_compress_at = iso(now)
                if self.meta.last_past_block_update_at is None or result.used_stale_hint:
                    self.meta.last_past_block_update_at = iso(now)
                self.log.info("compressed the window to %d items (%d llm calls)", len(self.window), result.llm_calls)
            else:
                self.log.info("compression result was moot: the window changed meanwhile")
        else:
            self.meta.compress_failures += 1
            self.meta.last_compress_error = msg.error or "summariser returned nothing"
            backoff = min(
                self.ctx.settings.recent.recent_compress_retry_max_seconds,
                self.ctx.settings.recent.recent_compress_retry_seconds * (2 ** (self.meta.compress_failures - 1)),
            )
            self._next_compress_try = self.ctx.clock.monotonic() + backoff
            self.log.warning("compression failed (%d in a row); the hard cap keeps bounding the window", self.meta.compress_failures)
        self._save_meta()
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            self._answer_view(waiter)

    # -- review ----------------------------------------------------------------------
    def _maybe_review(self) -> None:
        if self._review_token is not None or not self._llm_ready("correction"):
            return
        switch_on = self.ctx.services.switches.review_enabled() if self.ctx.services.switches else self.settings.review_enabled
        reason = review.review_gate(
            self.meta.review,
            self.window,
            self._wall(),
            self._last_activity_wall(),
            switch_on,
            self.settings,
            self.counter,
            in_flight=self._review_token is not None,
        )
        if reason is not None:
            return
        snapshot = list(self.window)
        self._token += 1
        token = self._token
        llm = self.ctx.services.llm
        messages = review.build_review_messages(snapshot, master_name=self.settings.master_name, character_name=self.ctx.name)
        timeout = self.ctx.settings.llm.llm_review_timeout_seconds
        max_tokens = self.ctx.settings.llm.llm_review_max_output_tokens

        def job() -> Any:
            return llm.run("review_recent", messages, max_output_tokens=max_tokens, timeout=timeout)

        try:
            self.ctx.submit_model_job(
                "recent",
                job,
                lambda result, error: ReviewDone(
                    token=token,
                    result=result,
                    error=None if error is None else repr(error),
                    exhausted=bool(getattr(error, "output_exhausted", False)),
                ),
            )
        except PoolFull:
            return
        self._review_token = token
        self._review_snapshot = snapshot

    def _wall(self) -> float:
        """Epoch seconds on the injectable clock (review times are stored as these)."""
        return self.ctx.clock.now().timestamp()

    def _last_activity_wall(self) -> float:
        return self._wall() - (self.ctx.clock.monotonic() - self._last_activity)

    @handles(ReviewDone)
    def on_ReviewDone(self, msg: ReviewDone) -> None:
        if self._review_token != msg.token:
            return
        self.adopt_outside_edit("review")
        snapshot = self._review_snapshot or []
        self._review_token = None
        self._review_snapshot = None
        now = self._wall()
        if msg.error is not None or msg.result is None:
            if msg.exhausted:
                tokens = sum(self.counter.count(t.text) for t in snapshot)
                self.meta.review = review.record_output_exhausted(self.meta.review, tokens, now, self.settings)
            else:
                self.meta.review = review.record_failure(self.meta.review, snapshot, now, self.settings)
            self._save_meta()
            self.log.info("review failed")
            return
        corrected = [{"role": d.role, "content": d.content} for d in msg.result.corrected_dialogue]
        outcome = review.apply_review_detailed(self.window, snapshot, corrected, self.settings, character_name=self.ctx.name)
        if outcome.window is not None and not theater.capsules_kept(self.window, outcome.window):
            # A corrected dialogue never rewrites a theater capsule: the answer is moot.
            self.log.info("review answer would have changed a theater capsule; not applied")
            outcome = review.ReviewApply(None, review.STATUS_WHITE)
        if outcome.window is not None:
            self.window = outcome.window
            self.tokens = [self.counter.count(t.text) for t in self.window]
            self._enforce_cap()
            self._save_window()
            self.meta.review = review.record_success(self.meta.review, now, outcome.cutoff_fingerprint)
        elif outcome.status == review.STATUS_CLEAN:
            self.meta.review = review.record_clean(self.meta.review, snapshot, now, self.settings)
        else:
            self.meta.review = review.record_white(self.meta.review, now)
        self._save_meta()
        self.log.info("review finished: %s", outcome.status)

    # -- reads -----------------------------------------------------------------------
    @handles(GetRecent)
    def on_GetRecent(self, msg: GetRecent) -> None:
        self.adopt_outside_edit("read")
        if msg.wait_settle and self._compression is not None and self._compression.settle:
            self._settle_waiters.append(msg)
            return
        self._answer_view(msg)

    def _answer_view(self, msg: GetRecent) -> None:
        view = RecentView(
            window=list(self.window),
            last_timestamp=self.tindex.last_timestamp(),
            stored_total=self.tindex.count(),
            shown=self.shown_texts(),
        )
        msg.reply.ok(view)

    @handles(EditRecent)
    def on_EditRecent(self, msg: EditRecent) -> None:
        self.adopt_outside_edit("edit")
        if not 0 <= msg.index < len(self.window):
            raise ActorFailure("not_found", f"no recent item {msg.index}", 404)
        # A new list, never an edit in place: the window is only ever extended in place
        # (see RecentState._window_bytes).
        i = msg.index
        if msg.text is None:
            self.window = self.window[:i] + self.window[i + 1 :]
        else:
            old = self.window[i]
            self.window = [*self.window[:i], msgspec.structs.replace(old, text=msg.text), *self.window[i + 1 :]]
        self.tokens = [self.counter.count(t.text) for t in self.window]
        self._enforce_cap()
        self._save_window()
        self._save_meta()  # journal_row with it: the edit must not be undone at load
        msg.reply.ok(RecentView(window=list(self.window), last_timestamp=self.tindex.last_timestamp(), stored_total=self.tindex.count()))

    @handles(ForgetTurns)
    def on_ForgetTurns(self, msg: ForgetTurns) -> None:
        from nekomem.actors.recent_erase import forget_turns

        forget_turns(self, msg)

    # -- periodic --------------------------------------------------------------------
    def due_at(self) -> float | None:
        """Idle compression (once idle, after a failure's backoff), the idle review (once
        per idle spell) and the idempotency-key purge."""
        idle_at = self._last_activity + self.settings.recent_idle_compress_seconds
        due = [self._last_purge + self.ctx.settings.server.idempotency_purge_seconds]
        if self._compression is None and self._llm_ready("summary") and recent_window.needs_compression(self.window, self.settings):
            due.append(max(idle_at, self._next_compress_try))
        if (
            getattr(self, "_idle_seen", None) != self._last_activity
            and self._review_token is None
            and self.window
            and self._llm_ready("correction")
        ):
            due.append(idle_at)
        return min(due)

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        now = msg.monotonic
        idle = now - self._last_activity
        if idle >= self.settings.recent_idle_compress_seconds:
            self._idle_seen = self._last_activity
        if (
            self._compression is None
            and idle >= self.settings.recent_idle_compress_seconds
            and now >= self._next_compress_try
            and recent_window.needs_compression(self.window, self.settings)
        ):
            self._start_compression(detailed=True, settle=False)
        if idle >= self.settings.recent_idle_compress_seconds:
            self._maybe_review()
        if now - self._last_purge >= self.ctx.settings.server.idempotency_purge_seconds:
            self._last_purge = now
            self.tindex.purge_idempotency(time.time() - self.ctx.settings.server.idempotency_ttl_seconds)

    @handles(Flush)
    def on_Flush(self, msg: Flush) -> None:
        self.flush()
        if msg.reply is not None:
            msg.reply.ok(True)
