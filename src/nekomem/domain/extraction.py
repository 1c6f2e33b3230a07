"""The batch of turns waiting for fact extraction (path A, powerful memory on).

Each outbox record (one request's turns) joins the queue when it arrives and leaves it
only inside an extraction batch; the record stays open in the outbox until that batch
succeeded, so a crash replays it. A batch is due on the reference's triggers (see
:func:`nekomem.domain.facts.extraction_due`): ``fact_extract_every_n_turns`` user turns, or
``fact_extract_interval_minutes`` since the last check, or idle before the first check.

One rule is added: the *tail of a burst*. Turns are evaluated as they arrive (the
reference polls every 40 s and so usually takes a burst whole), so a count-triggered batch
can leave the last turns of a burst behind; those are taken once the conversation has been
idle ``fact_extract_idle_seconds``, instead of waiting for the interval. A turn that arrives
after such a pause starts a new stretch and waits for the normal triggers.

A batch that fails goes back to the queue (the actor retries it after a backoff), so a model
outage delays extraction but loses no turn. A batch holds at most
``fact_extract_max_batch_user_turns`` user turns (whole records; a
record with more is taken alone), so a long backlog is extracted in bounded calls.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from nekomem.config.longterm import LongTermSettings
from nekomem.domain import facts as fl
from nekomem.domain.turns import Turn

Op = tuple[str, list[Turn]]


def user_turns(turns: list[Turn]) -> int:
    return sum(1 for t in turns if t.role == "human")


class ExtractionQueue:
    """Records waiting for a batch extraction, and the trigger state (plain, no I/O)."""

    def __init__(self, settings: LongTermSettings) -> None:
        self.s = settings
        self.ops: list[Op] = []
        self.last_check_at: datetime | None = None
        self.last_activity_at: datetime | None = None
        self.burst_tail = False
        # Records of the fact backlog (turns stored before a model): due at once, one
        # batch at a time (the sender hands out the next when one is mined).
        self.backlog: set[str] = set()

    @property
    def user_turns(self) -> int:
        return sum(user_turns(ts) for _op, ts in self.ops)

    def __contains__(self, op_id: str) -> bool:
        return any(op == op_id for op, _ in self.ops)

    def add(self, op_id: str, turns: list[Turn], now: datetime, *, backlog: bool = False) -> bool:
        """Queue one record that arrived at ``now``; False when it is already queued. A
        ``backlog`` record (old turns) is due at once and is no conversation activity."""
        if op_id in self:
            return False
        if backlog:
            self.backlog.add(op_id)
            self.ops.append((op_id, turns))
            return True
        idle = timedelta(seconds=self.s.fact_extract_idle_seconds)
        if self.last_activity_at is not None and now - self.last_activity_at >= idle:
            self.burst_tail = False  # the burst ended before this turn
        self.ops.append((op_id, turns))
        self.last_activity_at = now
        return True

    def due(self, now: datetime) -> str | None:
        """The trigger that makes a batch due now (``count``, ``interval``, ``idle``,
        ``burst_tail``, ``backlog``), or None."""
        pending = self.user_turns
        if pending <= 0:
            return None
        s = self.s
        if pending >= s.fact_extract_every_n_turns:
            return "count"
        if self.last_check_at is not None and now - self.last_check_at >= timedelta(minutes=s.fact_extract_interval_minutes):
            return "interval"
        if fl.extraction_due(pending, self.last_check_at, self.last_activity_at, now, s):
            return "idle"
        idle = self.last_activity_at is None or now - self.last_activity_at >= timedelta(seconds=s.fact_extract_idle_seconds)
        if self.burst_tail and idle:
            return "burst_tail"
        if self._backlog_queued():
            return "backlog"
        return None

    def _backlog_queued(self) -> bool:
        return bool(self.backlog) and any(op in self.backlog for op, _ in self.ops)

    def finished(self, op_id: str) -> None:
        """The record ``op_id`` was extracted (it is no longer a queued backlog record)."""
        self.backlog.discard(op_id)

    def wait_seconds(self, now: datetime, gate_wait: float) -> float | None:
        """Seconds from ``now`` until :meth:`due` gives a trigger and the extraction gate
        (open in ``gate_wait`` seconds) lets it run: 0 or less means now; None when no
        user turn waits."""
        pending = self.user_turns
        if not self.ops or pending <= 0:
            return None
        s = self.s
        if pending >= s.fact_extract_every_n_turns or self._backlog_queued():
            return gate_wait
        waits: list[float] = []
        if self.last_check_at is not None:
            waits.append((self.last_check_at + timedelta(minutes=s.fact_extract_interval_minutes) - now).total_seconds())
        if self.last_check_at is None or not s.fact_extract_idle_requires_first_run or self.burst_tail:
            idle_from = self.last_activity_at or now
            waits.append((idle_from + timedelta(seconds=s.fact_extract_idle_seconds) - now).total_seconds())
        return max(gate_wait, min(waits)) if waits else None

    def take(self, trigger: str) -> list[Op]:
        """Remove and return the next batch (oldest records first, bounded; see module)."""
        limit = self.s.fact_extract_max_batch_user_turns
        batch: list[Op] = []
        count = 0
        while self.ops:
            n = user_turns(self.ops[0][1])
            if batch and count + n > limit:
                break
            batch.append(self.ops.pop(0))
            count += n
        self.burst_tail = trigger == "count"
        return batch

    def drop_texts(self, texts: list[str]) -> int:
        """An erasure: the waiting turns whose text is one of ``texts`` leave the queue
        (their records stay, with the other turns); returns how many went."""
        gone = {t.strip() for t in texts}
        dropped = 0
        kept: list[Op] = []
        for op_id, turns in self.ops:
            left = [t for t in turns if t.text.strip() not in gone]
            dropped += len(turns) - len(left)
            kept.append((op_id, left))
        self.ops = kept
        return dropped

    def put_back(self, batch: list[Op], trigger: str = "") -> None:
        """Return a batch that could not be submitted or failed, ahead of the newer
        records; a burst tail (or a count batch's leftovers) stays one."""
        known = {op for op, _ in self.ops}
        self.ops = [op for op in batch if op[0] not in known] + self.ops
        self.burst_tail = self.burst_tail or trigger in ("count", "burst_tail")

    def checked(self, now: datetime) -> None:
        """A batch was extracted: the interval trigger counts from ``now``."""
        self.last_check_at = now
