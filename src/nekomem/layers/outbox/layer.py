"""OutboxActor: re-runnable background work in outbox.ndjson.

Work is recorded (fsync) before it starts and before the request that caused it is
answered. Each record is dispatched to its handler actor as :class:`RunOp`; the handler
answers :class:`OpFinished`. A handler that batches work answers :class:`OpParked` first:
the record stays pending but frees its dispatch slot, so at most ``replay_concurrency``
records are *running* while any number wait in a handler's batch. A failure is recorded as
an attempt and retried after a delay that doubles with each attempt (up to
``outbox_retry_max_delay_seconds``); after ``outbox_max_attempts`` the record is
dead-lettered. Pending records are replayed
when the character is activated, so work pending at a crash runs after the restart.
Handlers are idempotent (delivery is at least once).

Group commit: the post-turn record of a ``/cache`` (its rows and the post-turn cursor are
already durable in time_indexed.db) is held in memory, and so is its done line when it
finishes first; after ``outbox_sync_seconds`` (real time) one write and one fsync put
every held line in the file, and only then is each held record acknowledged to
RecentActor, whose cursor moves over it. A held record that finishes before that write
leaves no line at all (its work is done, so the cursor may pass it): it is acknowledged
with the group, and a group of such records alone costs no write and no fsync. A crash
(SIGKILL, power loss) loses held lines only: the rows after the cursor are enqueued again
at the next load, and a record whose done line was lost runs once more (delivery is at
least once). A record whose sender waits for it (/process, /renew, /settle) is written and
fsync'd at once, after the held lines. With no model that can extract facts the recent
actor makes no record at all (it could only be finished unrun).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from nekomem.actors.handlers import handles
from nekomem.actors.messages import (
    BacklogMined,
    Enqueue,
    OpFinished,
    OpParked,
    OutboxAck,
    OutboxAcks,
    OutboxState,
    ReclaimParked,
    RunOp,
    ScrubTexts,
    Tick,
)
from nekomem.actors.ports import LayerPorts
from nekomem.domain.gates import backoff_delay
from nekomem.domain.layers import RECENT, outbox_handlers
from nekomem.domain.turns import Turn
from nekomem.runtime.clock import iso
from nekomem.stores import fence
from nekomem.stores.erasure import scrub_value
from nekomem.stores.fact_backlog import backlog_last_row
from nekomem.stores.outbox import Outbox


class OutboxLayer:
    """The outbox of one character: its records, their dispatch to the layers that run
    them, retries with backoff, dead letters, and the group fsync of acknowledgements."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.log = ports.log
        self._reset()

    def _reset(self) -> None:
        self.settings = self.ports.settings.runtime
        self.outbox = Outbox(self.ports.paths.outbox)
        self.records = OutboxRecords()
        self.rows = RecordedRows()
        self.group = GroupCommit(self.ports, self.outbox, self.settings.outbox_sync_seconds)

    def load(self) -> None:
        self._reset()
        for record in self.outbox.records():
            rows = _rows(record.payload)
            if rows is not None:
                self.rows.known.add(rows)
        if self.outbox.line_count >= self.settings.outbox_compact_lines and not self.outbox.pending():
            self.rows.floor = max((last for _first, last in self.rows.known), default=0)
            self.outbox.compact()
        for record in self.outbox.pending():
            self.records.pending[record.op_id] = (record.type, record.payload, record.attempts)
        if self.records.pending:
            self.log.info("replaying %d pending outbox records", len(self.records.pending))
        self._dispatch_ready()

    @handles(Enqueue)
    def on_Enqueue(self, msg: Enqueue) -> None:
        rows = _rows(msg.payload)
        ack = msg.reply_value if isinstance(msg.reply_value, OutboxAck) else None
        # Nobody waits for a /cache turn's record (write_id 0): it joins the group fsync.
        lazy = msg.reply is None and ack is not None and ack.write_id == 0 and self.settings.outbox_sync_seconds > 0
        if msg.replay and rows is not None and (rows in self.rows.known or rows[1] <= self.rows.floor):
            self.log.info("outbox already holds a record of these rows; not added again")
            if not lazy:
                self.group.sync()
        else:
            # A record enqueued again at load (replay) is written at once, unsynced: recovery
            # is over only once the file covers every stored row again.
            held = lazy and not msg.replay
            op_id = self.outbox.add(msg.op_type, msg.payload, iso(self.ports.clock.now()), durable=not lazy, defer=held)
            self.records.pending[op_id] = (msg.op_type, msg.payload, 0)
            if msg.turns is not None:
                self.records.fresh_turns[op_id] = msg.turns
            if held:
                self.group.held_ops.add(op_id)
            if rows is not None:
                self.rows.known.add(rows)
            if not lazy:
                self.group.release()  # that fsync covered the lines appended before it
        if msg.reply is not None:
            msg.reply.ok(msg.reply_value)
        elif ack is not None and lazy:
            self.group.unsynced.append(ack)
            self.group.later()
        elif ack is not None:
            # An acknowledgement message for the sender (process/renew/settle barrier).
            self.ports.send(RECENT, ack)
        self._dispatch_ready()

    def _dispatch_ready(self) -> None:
        if self.records.pending and not fence.permits(self.ports.paths.outbox):
            # Cluster mode, a character this node may not write yet (a take-over being
            # prepared) or any more: its records wait for a later look (see due_at).
            self.records.withheld = True
            return
        self.records.withheld = False
        now = self.ports.clock.monotonic()
        for op_id, (op_type, payload, attempts) in list(self.records.pending.items()):
            if op_id in self.records.running or op_id in self.records.parked or self.records.retry_at.get(op_id, 0.0) > now:
                continue
            if len(self.records.running) >= self.settings.replay_concurrency:
                break
            if attempts >= self.settings.outbox_max_attempts:
                self._dead_letter(op_id, "attempts exhausted")
                continue
            child = outbox_handlers().get(op_type)
            if child is None:
                self._dead_letter(op_id, f"no handler for {op_type}")
                continue
            self.records.running.add(op_id)
            turns = self.records.fresh_turns.pop(op_id, None)
            self.ports.send(child, RunOp(op_id=op_id, op_type=op_type, payload=payload, attempt=attempts + 1, turns=turns))
        self.ports.outbox_tally.set_pending(self.ports.character, len(self.records.pending))

    def close(self) -> None:
        # A stopped character's pending records wait on disk; the gauge counts live ones.
        self.ports.outbox_tally.set_pending(self.ports.character, 0)
        if self.outbox.held:
            # Reached without a flush only after a crash: keep what can be kept.
            try:
                self.outbox.write_held()
            except OSError:
                self.log.warning("held outbox lines not written at close; the cursor re-enqueues their rows at the next load")

    def _dead_letter(self, op_id: str, why: str) -> None:
        entry = self.records.pending.get(op_id)
        backlog = backlog_last_row(entry[1]) if entry is not None else None
        if backlog is not None:
            # A fact-backlog batch given up: recent hands out the next one (else it waits
            # for this one until the next start).
            self.ports.send(RECENT, BacklogMined(row=backlog))
        self.outbox.done(op_id, iso(self.ports.clock.now()), dead=True)
        self.records.fresh_turns.pop(op_id, None)
        self.group.held_ops.discard(op_id)
        self.records.pending.pop(op_id, None)
        self.records.retry_at.pop(op_id, None)
        self.records.dead_count += 1
        self.ports.outbox_tally.dead_lettered()
        self.log.warning("outbox record dead-lettered: %s", why)

    @handles(OpParked)
    def on_OpParked(self, msg: OpParked) -> None:
        if msg.op_id in self.records.running and msg.op_id in self.records.pending:
            self.records.running.discard(msg.op_id)
            self.records.parked.add(msg.op_id)
            self._dispatch_ready()

    @handles(ReclaimParked)
    def on_ReclaimParked(self, msg: ReclaimParked) -> None:
        lost = [
            op_id
            for op_id in self.records.parked
            if op_id in self.records.pending and outbox_handlers().get(self.records.pending[op_id][0]) == msg.child
        ]
        if lost:
            self.records.parked.difference_update(lost)
            self.log.info("%d parked outbox records go back to a restarted %s actor", len(lost), msg.child)
            self._dispatch_ready()

    @handles(OpFinished)
    def on_OpFinished(self, msg: OpFinished) -> None:
        self.records.running.discard(msg.op_id)
        self.records.parked.discard(msg.op_id)
        entry = self.records.pending.get(msg.op_id)
        if entry is None:
            return  # a duplicate report; the record is already finished
        if msg.ok:
            self._finish(msg.op_id)
        else:
            now_iso = iso(self.ports.clock.now())
            op_type, payload, attempts = entry
            self.outbox.attempt(msg.op_id, msg.error[:500], now_iso)
            attempts += 1
            if not msg.retry or attempts >= self.settings.outbox_max_attempts:
                self._dead_letter(msg.op_id, "handler failed")
            else:
                self.records.pending[msg.op_id] = (op_type, payload, attempts)
                delay = backoff_delay(self.settings.outbox_retry_delay_seconds, attempts, self.settings.outbox_retry_max_delay_seconds)
                self.records.retry_at[msg.op_id] = self.ports.clock.monotonic() + delay
        self._dispatch_ready()

    def _finish(self, op_id: str) -> None:
        """A record finished. When its pending line is still held, its lines are dropped
        (the file needs none of them) and its acknowledgement waits for the group as
        before (one message per group; the cursor is stored with the next turn anyway).
        Otherwise a done line, not fsync'd: handlers are idempotent, so one lost to a power
        loss costs one more run; the done line of a held record joins the next group write."""
        held = op_id in self.group.held_ops
        if not (held and self.outbox.drop_held(op_id)):
            self.outbox.done(op_id, iso(self.ports.clock.now()), durable=False, defer=held)
            if held:
                self.group.later()
        self.records.pending.pop(op_id, None)
        self.records.retry_at.pop(op_id, None)
        self.group.held_ops.discard(op_id)
        self.records.done_count += 1

    def due_at(self) -> float | None:
        """The earliest retry of a failed record (others are sent as soon as a slot frees), or
        the next look at records withheld by the cluster fence."""
        waiting = [at for op_id, at in self.records.retry_at.items() if op_id in self.records.pending and op_id not in self.records.running]
        if self.records.withheld:  # looked at again later (the fence may allow them by then)
            waiting.append(self.ports.clock.monotonic() + self.ports.settings.cluster.cluster_fenced_retry_seconds)
        return min(waiting) if waiting else None

    def real_due_at(self) -> float | None:
        """The group fsync of the records appended without one."""
        return self.group.sync_due

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        if self.group.sync_due is not None and time.monotonic() >= self.group.sync_due:
            self.group.sync()
        if self.records.pending:
            self._dispatch_ready()

    def flush(self) -> None:
        """The group fsync now (on Flush and at stop)."""
        self.group.sync()

    @handles(ScrubTexts)
    def on_ScrubTexts(self, msg: ScrubTexts) -> None:
        """An erasure: the erased texts go from the file (held lines are written first, so
        none escapes) and from the records kept in memory."""
        self.group.sync()
        changed = self.outbox.scrub(msg.texts)
        gone = {t.strip() for t in msg.texts}
        for op_id, (op_type, payload, attempts) in list(self.records.pending.items()):
            scrubbed, hit = scrub_value(payload, msg.texts)
            if hit:
                self.records.pending[op_id] = (op_type, scrubbed if isinstance(scrubbed, dict) else {}, attempts)
        for op_id, turns in list(self.records.fresh_turns.items()):
            self.records.fresh_turns[op_id] = [t for t in turns if t.text.strip() not in gone]
        if changed:
            self.log.info("erasure: %d outbox records scrubbed", changed)
        if msg.reply is not None:
            msg.reply.ok(msg.reply_value)

    @handles(OutboxState)
    def on_OutboxState(self, msg: OutboxState) -> None:
        if msg.reply is None:
            return
        msg.reply.ok(
            {
                "pending": len(self.records.pending),
                "running": len(self.records.running),
                "parked": len(self.records.parked),
                "done": self.records.done_count,
                "dead": self.records.dead_count,
            }
        )


class OutboxRecords:
    """The records in memory: each pending one's (type, payload, attempts), those running
    or parked in a handler's batch, their retry times, a fresh record's turns until its
    first run, and how many finished or were dead-lettered since the load."""

    def __init__(self) -> None:
        # op_id -> (type, payload, attempts)
        self.pending: dict[str, tuple[str, Mapping[str, object], int]] = {}
        self.running: set[str] = set()
        self.parked: set[str] = set()  # pending, held in a handler's batch
        self.retry_at: dict[str, float] = {}
        self.fresh_turns: dict[str, list[Turn]] = {}  # op_id -> Enqueue.turns, until its first run
        self.done_count = 0
        self.dead_count = 0
        self.withheld = False  # pending records kept back: their shard may not be written yet


class RecordedRows:
    """The time-index row ranges of the post-turn records in the file (finished ones
    too): RecentActor re-enqueues the rows after its cursor at load, and a range already
    recorded must not run twice. Compaction drops finished records, so everything up to
    the highest row seen (``floor``) is then taken as recorded."""

    def __init__(self) -> None:
        self.known: set[tuple[int, int]] = set()
        self.floor = 0


class GroupCommit:
    """The group fsync of outbox.ndjson: the acknowledgements waiting for it, the
    unfinished records whose pending line is held, and when it is due."""

    def __init__(self, ports: LayerPorts, outbox: Outbox, sync_seconds: float) -> None:
        self.ports = ports
        self.outbox = outbox
        self.sync_seconds = sync_seconds
        self.unsynced: list[OutboxAck] = []  # acknowledgements waiting for the group fsync
        self.held_ops: set[str] = set()  # unfinished records whose pending line was held
        self.sync_due: float | None = None  # time.monotonic() of that fsync

    def later(self) -> None:
        """Arm the group fsync (if it is not armed yet)."""
        if self.sync_due is None:
            self.sync_due = time.monotonic() + self.sync_seconds

    def sync(self) -> None:
        """Write the held lines and fsync outbox.ndjson when lines wait for it, then
        acknowledge their records."""
        if self.unsynced or self.sync_due is not None or self.outbox.held:
            self.outbox.sync()
            self.release()

    def release(self) -> None:
        """Every appended line is durable: acknowledge the records that waited for it."""
        acks, self.unsynced, self.sync_due = self.unsynced, [], None
        if acks:
            self.ports.send(RECENT, OutboxAcks(acks=acks))


def _rows(payload: Mapping[str, object]) -> tuple[int, int] | None:
    """The (first, last) time-index rows a post-turn payload covers; None without rows."""
    rows = payload.get("rows")
    if isinstance(rows, list) and len(rows) == 2 and all(isinstance(r, int) for r in rows):
        return rows[0], rows[1]
    return None
