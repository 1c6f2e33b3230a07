"""The recent window's post-turn feed: the cursor of the rows whose post-turn work is
recorded, the outbox records of stored turns and the fact backlog's batches.

A write's turns get a post-turn record in the outbox after the write is answered (see
:mod:`nekomem.layers.recent.actor`); the outbox acknowledges it and the cursor moves with the
next time-index transaction, so the rows after the cursor at load are enqueued again (the
outbox drops ranges it already holds; see :mod:`nekomem.domain.post_turn`). Without a
model that can extract facts the turns are announced here instead and go to the fact
backlog (:mod:`nekomem.layers.recent.backlog`).
"""

from __future__ import annotations

from nekomem.actors.messages import Enqueue, OutboxAck
from nekomem.actors.ports import LayerPorts
from nekomem.domain import theater
from nekomem.domain.layers import OUTBOX, RECENT
from nekomem.domain.post_turn import POST_TURN_CURSOR, PostTurnCursor, session_runs
from nekomem.domain.turns import Turn
from nekomem.layers.recent.backlog import FactBacklog
from nekomem.layers.recent.state import RecentStore
from nekomem.stores.fact_backlog import BACKLOG_ROWS_KEY
from nekomem.stores.turn_coverage import seed_ranges

OP_POST_TURN = "extract_facts"  # wire value of the reference's OP_POST_TURN_SIGNALS


class PostTurnFeed:
    """The post-turn cursor and the fact backlog of one character's recent window.

    Built with the layer; :meth:`load` (after the store's) reads both cursors and
    re-enqueues the rows after the post-turn cursor.
    """

    def __init__(self, ports: LayerPorts, store: RecentStore) -> None:
        self.ports = ports
        self.store = store
        # Set by load.
        self.backlog: FactBacklog
        self.cursor: PostTurnCursor
        self._loaded = False

    def load(self) -> None:
        """Read the backlog and post-turn cursors, enqueue again the work of the rows after
        the cursor and hand out the backlog's next batch. Raises OSError (a time-index
        write)."""
        ports = self.ports
        self.backlog = FactBacklog(self.store.tindex, ports.settings.longterm, ports.backlog, ports.character)
        self._replay()
        self.backlog.recount()  # replayed runs may span rows erased before a crash
        self.feed_backlog()

    def _replay(self) -> None:
        """Enqueue again the post-turn work of rows after the cursor (answered before their
        record was acknowledged); the outbox drops ranges it already holds."""
        tindex = self.store.tindex
        saved = tindex.cursor(POST_TURN_CURSOR)
        top = tindex.max_row_id()
        if saved is None:
            # Before the cursor existed every record was written before the answer.
            tindex.set_cursors({POST_TURN_CURSOR: top})
            saved = top
        self.cursor = PostTurnCursor(saved)
        self._loaded = True
        if not tindex.coverage_started():
            tindex.start_coverage(seed_ranges(saved, self.backlog.lo, self.backlog.hi))
        if top <= saved:
            return
        rows = [row for row in tindex.rows_after(saved) if not theater.is_theater(row.turn)]  # no post-turn work
        for run in session_runs(rows):
            self.enqueue([r.turn for r in run], run[0].session_id or "", run[0].id, run[-1].id, replay=True)
        self.ports.log.info("re-enqueued post-turn work of %d stored turns", len(rows))

    def enqueue(self, turns: list[Turn], session_id: str, first: int, last: int, write_id: int = 0, *, replay: bool = False) -> None:
        """Record the post-turn work of rows ``first..last`` in the outbox; it acknowledges
        the write ``write_id`` (0: nobody waits) with an :class:`OutboxAck`."""
        ack = OutboxAck(write_id=write_id, row=last)
        self.cursor.sent(last)
        if not self.ports.model_available("extract_facts"):
            # No model can extract facts: the record would only announce the turns and be
            # finished unrun (FactActor.on_RunOp), so the turns are announced here, with no
            # record, and count as done (a write that waits hears it as from the outbox).
            # They stay in the fact backlog, mined once such a model is configured.
            self.ports.announce_stored_turns(list(turns))
            self.backlog.extend(first, last)
            if write_id:
                self.ports.send(RECENT, ack)
            else:
                self.cursor.acked(last)
            return
        payload = {"messages": [t.to_disk() for t in turns], "session_id": session_id, "rows": [first, last]}
        self.ports.send(OUTBOX, Enqueue(op_type=OP_POST_TURN, payload=payload, reply_value=ack, replay=replay, turns=list(turns)))

    def feed_backlog(self) -> None:
        """Hand the fact backlog's next batch to the fact actor, as a post-turn record
        marked ``backlog`` (see :mod:`nekomem.layers.recent.backlog`), when a model can
        extract facts and no batch is being mined."""
        if not self.ports.model_available("extract_facts"):
            return
        batch = self.backlog.next_batch()
        if batch is None:
            return
        # "backlog_rows", not "rows": the outbox's replay check takes every row under its
        # floor as recorded, and these rows are older than that.
        payload = {
            "messages": [t.to_disk() for t in batch.turns],
            "session_id": batch.session_id,
            BACKLOG_ROWS_KEY: [batch.first, batch.last],
        }
        self.ports.log.info("fact backlog: rows %d..%d handed to extraction", batch.first, batch.last)
        self.ports.send(OUTBOX, Enqueue(op_type=OP_POST_TURN, payload=payload, turns=list(batch.turns)))

    def cursor_updates(self) -> dict[str, int] | None:
        """The post-turn and fact-backlog cursors that moved since they were last stored
        (stored with the next time-index transaction), or None."""
        update = {**(self.cursor.update() or {}), **self.backlog.update()}
        return update or None

    def save_cursor(self) -> None:
        """Store the cursors that moved (nothing before the first load got that far)."""
        update = self.cursor_updates() if self._loaded else None
        if update:
            self.store.tindex.set_cursors(update)
