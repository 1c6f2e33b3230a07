"""The recent window layer: the recent window (recent.json + recent_meta.json) and the raw
journal (time_indexed.db) of one character, owned by :class:`~nekomem.layers.recent.actor.RecentActor`.

A write is durable before it is answered, with one fsync: the turns go to the time index
in one SQLite transaction (synchronous=FULL), which also stores the Idempotency-Key's
response and the post-turn cursor. recent.json and recent_meta.json are then replaced
atomically without fsync (a killed process leaves them whole; after a power loss the window
is rebuilt at load from the window base and the rows after it, see
:mod:`nekomem.domain.window_rebuild`), and /cache is answered. The post-turn
work record goes to the outbox after the answer (its own fsync, off the request's path);
the outbox acknowledges it and the cursor moves with the next transaction, so rows after
the cursor at load are enqueued again (the outbox ignores ranges it already holds).
/process, /renew and /settle still wait for their record, but not for compression.
Compression and review run on the model pool (:mod:`nekomem.layers.recent.upkeep`).

The layer is made of plain parts, each owning one concern: :class:`RecentStore` (the
window, its meta and the time index), :class:`PostTurnFeed` (the post-turn cursor and
the fact backlog), :class:`WindowUpkeep` (compression, review, the periodic passes) and
:class:`RecentTheater` (theater capsules); erasure is :func:`forget_turns`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    AppendTurns,
    BacklogMined,
    CancelCorrection,
    CompressDone,
    CountEntries,
    EditRecent,
    EntryCounts,
    ForgetTurns,
    GetRecent,
    OutboxAck,
    OutboxAcks,
    RecentView,
    ReviewDone,
    TheaterForget,
    TheaterRetract,
    TheaterWrite,
    Tick,
    TurnsMined,
)
from nekomem.actors.ports import LayerPorts
from nekomem.importer import neko_folder
from nekomem.layers.recent.erase import forget_turns
from nekomem.layers.recent.post_turn import PostTurnFeed
from nekomem.layers.recent.state import RecentStore, answer
from nekomem.layers.recent.theater import RecentTheater
from nekomem.layers.recent.upkeep import WindowUpkeep
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.stores.faults import classify
from nekomem.wire.answers import StatusAnswer, WriteAnswer

RESULT_STATUS = {"cache": "cached", "process": "processed", "renew": "processed", "settle": "settled"}


@dataclass
class _PendingWrite:
    reply: Reply | None
    value: WriteAnswer
    wait_outbox: bool


class RecentLayer:
    """The recent window of one character: its messages' handlers over its parts."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.log = ports.log
        self.store = RecentStore(ports)
        self.feed = PostTurnFeed(ports, self.store)
        self.upkeep = WindowUpkeep(ports, self.store)
        self.theater = RecentTheater(ports, self.store)
        self._settle_waiters: list[GetRecent] = []
        self._writes: dict[int, _PendingWrite] = {}
        self._write_seq = 0

    # -- lifecycle -------------------------------------------------------------------
    def load(self) -> None:
        """Read the window, its meta and the time index (rebuilding what a crash left
        apart), then re-enqueue unacknowledged post-turn work. Raises OSError."""
        self.upkeep.reset()
        self._settle_waiters = []
        self._writes = {}
        self._write_seq = 0
        self.store.load()
        self.feed.load()

    def flush(self) -> None:
        """Persist the post-turn cursor and recent_meta.json (with journal_row)."""
        self.feed.save_cursor()
        self.store.save_meta()

    def close(self) -> None:
        """Store the moved cursors and close the time index (nothing when it is not open)."""
        if self.store.is_open:
            self.feed.save_cursor()
            self.store.close()
            paths = self.ports.paths
            if paths.neko_folder:
                # The reference reads its own time_indexed.db: written whole from nekomem's
                # at every close (passivation, /release_character, /reload, shutdown). A
                # failure leaves the previous copy and must not keep the character open.
                try:
                    neko_folder.mirror_journal(paths, self.ports.settings.importer.import_source_timezone)
                except (OSError, sqlite3.Error) as exc:
                    self.ports.log.warning("the reference's time_indexed.db was not rewritten: %s", type(exc).__name__)

    def due_at(self) -> float | None:
        return self.upkeep.due_at()

    def real_due_at(self) -> float | None:
        return None

    # -- writes ----------------------------------------------------------------------
    @handles(AppendTurns)
    def on_AppendTurns(self, msg: AppendTurns) -> None:
        store = self.store
        # An outside edit of recent.json is adopted before the window is used: for /cache
        # right before the new turns join it (the one look of the write, taken as close to
        # the rename as it can be); the other modes also start compression or review.
        looked = msg.mode != "cache"
        if looked:
            store.adopt_outside_edit("write")
        self.upkeep.touch()
        key = msg.idempotency_key
        if key:
            stored = store.tindex.idempotent_response(key)
            if stored is not None:
                answer(msg.reply, msgspec.json.decode(stored, type=WriteAnswer))
                return
        turns = msg.turns
        if msg.mode != "cache" and turns:
            # A session-boundary batch that repeats the stored tail (a retry without a key,
            # or the reference's /settle with the whole already-cached history) is not
            # stored twice; /cache batches are each a new turn and are stored as sent.
            turns = turns[store.overlap_with_stored_tail(turns) :]
        value = WriteAnswer(status=RESULT_STATUS[msg.mode], count=len(msg.turns) if msg.mode == "cache" else None)
        if turns or key:
            store.tindex.append(
                msg.session_id,
                turns,
                idempotency_key=key,
                response=msgspec.json.encode(value) if key else None,
                cursors=self.feed.cursor_updates(),
            )
        if turns:
            if not looked:
                store.adopt_outside_edit("write")
            store.window.extend(turns)
            store.append_token_counts(turns)
            # recent_meta.json (and its journal_row) is written with the next meta change
            # or flush: at load, rows after the stored journal_row that recent.json already
            # ends with are recognised, so one rename per write is enough.
            store.meta.journal_row = store.tindex.last_row_id
            # Without fsync: at load the window is rebuilt as base + rows. A cap that cut a
            # text makes a window that is not that, so it is written durably (a new base).
            cut = store.enforce_cap()
            try:
                store.save_window(durable=cut, looked=msg.mode == "cache")
            except Exception as exc:
                if classify(exc) is None:
                    raise
                # The rows are committed: the turn is stored, and telling the client
                # otherwise would make a retry without an Idempotency-Key store it twice.
                # recent.json is a view of base + rows; the fault still goes to the actor,
                # which reports it and reloads the layer from disk (rebuilding the window and
                # re-enqueueing the rows after the post-turn cursor).
                answer(msg.reply, value)
                raise
        write = _PendingWrite(reply=msg.reply, value=value, wait_outbox=bool(turns))
        if turns:
            last = store.tindex.last_row_id
            first = last - len(turns) + 1
            if msg.mode == "cache":
                # Durable with the rows (the cursor rebuilds the record): answer first.
                write.wait_outbox = False
                self._finish_if_ready(write)
                self.feed.enqueue(turns, msg.session_id, first, last)
            else:
                self._write_seq += 1
                self._writes[self._write_seq] = write
                self.feed.enqueue(turns, msg.session_id, first, last, self._write_seq)
        if msg.mode != "cache":
            # The write is answered once its turns and record are durable; compression runs
            # in the background (a slow or failing model never holds the conversation).
            # /new_dialog still waits for a settle/renew compression (``settle`` below).
            self.upkeep.after_write(detailed=msg.mode in ("renew", "settle"))
        self._finish_if_ready(write)

    @handles(OutboxAcks)
    def on_OutboxAcks(self, msg: OutboxAcks) -> None:
        for ack in msg.acks:
            self.on_OutboxAck(ack)

    @handles(TurnsMined)
    def on_TurnsMined(self, msg: TurnsMined) -> None:
        try:
            self.store.tindex.mark_mined(msg.ranges)
        except sqlite3.Error as exc:
            # The safe side: the turns stay uncovered (recall keeps offering them).
            self.log.warning("mined rows not recorded (%s): %d ranges stay uncovered", type(exc).__name__, len(msg.ranges))

    @handles(BacklogMined)
    def on_BacklogMined(self, msg: BacklogMined) -> None:
        self.feed.backlog.mined(msg.row)
        self.feed.feed_backlog()

    @handles(OutboxAck)
    def on_OutboxAck(self, msg: OutboxAck) -> None:
        if msg.row:
            self.feed.cursor.acked(msg.row)
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
        self.store.adopt_outside_edit("cancel_correction")
        cancelled = self.upkeep.cancel_review()
        answer(msg.reply, StatusAnswer(status="cancelled" if cancelled else "no_task"))

    # -- model results ---------------------------------------------------------------
    @handles(CompressDone)
    def on_CompressDone(self, msg: CompressDone) -> None:
        if not self.upkeep.compress_done(msg):
            return
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            self._answer_view(waiter)

    @handles(ReviewDone)
    def on_ReviewDone(self, msg: ReviewDone) -> None:
        self.upkeep.review_done(msg)

    # -- reads -----------------------------------------------------------------------
    @handles(GetRecent)
    def on_GetRecent(self, msg: GetRecent) -> None:
        self.store.adopt_outside_edit("read")
        if msg.wait_settle and self.upkeep.settling:
            self._settle_waiters.append(msg)
            return
        self._answer_view(msg)

    @handles(CountEntries)
    def on_CountEntries(self, msg: CountEntries) -> None:
        self.store.adopt_outside_edit("read")
        answer(msg.reply, EntryCounts({"recent": len(self.store.window)}))

    def _answer_view(self, msg: GetRecent) -> None:
        store = self.store
        view = RecentView(
            window=list(store.window),
            last_timestamp=store.tindex.last_timestamp(),
            stored_total=store.tindex.count(),
            shown=store.shown_texts(),
        )
        answer(msg.reply, view)

    @handles(EditRecent)
    def on_EditRecent(self, msg: EditRecent) -> None:
        store = self.store
        store.adopt_outside_edit("edit")
        if not 0 <= msg.index < len(store.window):
            raise ActorFailure("not_found", f"no recent item {msg.index}", 404)
        # A new list, never an edit in place: the window is only ever extended in place
        # (see RecentStore._window_bytes).
        i = msg.index
        old = store.window[i]
        new = None if msg.text is None else msgspec.structs.replace(old, text=msg.text)
        if new is None:
            store.window = store.window[:i] + store.window[i + 1 :]
        else:
            store.window = [*store.window[:i], new, *store.window[i + 1 :]]
        # The edited item no longer matches its row by text: the rows it came from are
        # kept beside the window, so forgetting them takes the edited item too. Written
        # before the window: a crash between them leaves a mapping of an absent item.
        sources = store.sources
        sources.edited(old, new, sources.rows_of(old) or store.tindex.row_ids_of(old))
        store.tokens = [store.counter.count(t.text) for t in store.window]
        store.enforce_cap()
        sources.keep_only(store.window)
        sources.save()
        store.save_window()
        store.save_meta()  # journal_row with it: the edit must not be undone at load
        answer(
            msg.reply,
            RecentView(window=list(store.window), last_timestamp=store.tindex.last_timestamp(), stored_total=store.tindex.count()),
        )

    @handles(ForgetTurns)
    def on_ForgetTurns(self, msg: ForgetTurns) -> None:
        forget_turns(self.ports, self.store, msg)
        self.feed.backlog.recount()

    # -- theater ---------------------------------------------------------------------
    @handles(TheaterWrite)
    def on_TheaterWrite(self, msg: TheaterWrite) -> None:
        self.theater.write(msg)
        self.feed.backlog.recount()  # the rebuild may have deleted theater rows of the backlog

    @handles(TheaterForget)
    def on_TheaterForget(self, msg: TheaterForget) -> None:
        self.theater.forget(msg)

    @handles(TheaterRetract)
    def on_TheaterRetract(self, msg: TheaterRetract) -> None:
        self.theater.retract(msg)

    # -- periodic --------------------------------------------------------------------
    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self.upkeep.tick(msg.monotonic)
