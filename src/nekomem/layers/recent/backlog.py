"""RecentActor's fact backlog: stored turns no model has mined for facts yet.

Without a model that can extract facts, RecentActor announces stored turns itself and
moves its post-turn cursor over them (no outbox record: it could only be finished
unrun). Those rows are remembered here as the backlog (two time-index cursors, see
:mod:`nekomem.stores.fact_backlog`), which stays put while no model is configured. Once
one is, the backlog goes to the fact actor as ordinary post-turn records marked
``backlog`` (so the outbox's retry backoff and the fact actor's extraction gate apply),
one batch of at most ``fact_backlog_batch_rows`` rows at a time: the next batch is handed
out only when the fact actor reports the previous one mined (``BacklogMined``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nekomem.config.longterm import LongTermSettings
from nekomem.domain import theater
from nekomem.domain.turns import Turn
from nekomem.stores.fact_backlog import BACKLOG_FROM, BACKLOG_TO, BacklogTally
from nekomem.stores.timeindex import TimeIndex


@dataclass(frozen=True)
class BacklogBatch:
    """Rows ``(first - 1, last]`` of the backlog: their turns (theater rows left out) and
    the session of the first row."""

    first: int
    last: int
    turns: list[Turn]
    session_id: str


class FactBacklog:
    """The backlog's range, kept in memory and stored in the time index on every change."""

    def __init__(self, tindex: TimeIndex, settings: LongTermSettings, tally: BacklogTally | None = None, name: str = "") -> None:
        self.tindex = tindex
        self.tally = tally
        self.name = name
        self.enabled = settings.fact_backlog_enabled
        self.batch_rows = settings.fact_backlog_batch_rows
        self.lo = tindex.cursor(BACKLOG_FROM) or 0
        self.hi = tindex.cursor(BACKLOG_TO) or 0
        self.inflight: int | None = None  # the last row of the batch handed out
        self.dirty = False  # extended since the cursors were last stored
        # The stored rows in (lo, hi]: counted at load and after a batch or an erasure,
        # added to by extend (its rows are new and contiguous), so the published count is
        # exact without a query per stored turn.
        self.rows = tindex.count_between(self.lo, self.hi)
        self._publish()

    def remaining(self) -> bool:
        """Whether rows still wait for extraction."""
        return self.hi > self.lo

    def extend(self, first: int, last: int) -> None:
        """Rows ``first..last`` were stored while no model could extract facts. Nothing is
        kept when the backlog is switched off. Stored by :meth:`update`, with the post-turn
        cursor that moved over the same rows (no transaction of its own per turn)."""
        if not self.enabled:
            return
        if not self.remaining():
            self.lo = first - 1
            self.rows = 0
        # Row ids are given in order and only an erasure (which recounts) leaves gaps: the
        # rows newly inside (lo, hi] are the ids after the old end.
        self.rows += max(0, last - max(self.lo, self.hi))
        self.hi = max(self.hi, last)
        self.dirty = True
        self._publish()

    def update(self) -> dict[str, int]:
        """The cursors to store with the next time-index transaction (then counted as
        stored); empty when they did not change."""
        if not self.dirty:
            return {}
        self.dirty = False
        return {BACKLOG_FROM: self.lo, BACKLOG_TO: self.hi}

    def next_batch(self) -> BacklogBatch | None:
        """The next batch to mine, or None (switched off, nothing left, or one batch is
        still being mined). Rows past the end that are all theater are passed over."""
        if not self.enabled or self.inflight is not None:
            return None
        while self.remaining():
            rows = [r for r in self.tindex.rows_after(self.lo, limit=self.batch_rows) if r.id <= self.hi]
            if not rows:
                self.lo = self.hi  # the rows were erased
                break
            turns = [r.turn for r in rows if not theater.is_theater(r.turn)]
            if turns:
                self.inflight = rows[-1].id
                return BacklogBatch(rows[0].id, rows[-1].id, turns, rows[0].session_id or "")
            self.lo = rows[-1].id
        self._save()
        return None

    def mined(self, row: int) -> None:
        """The batch ending at ``row`` was mined (its extraction finished)."""
        if self.inflight is not None and row >= self.inflight:
            self.inflight = None
        self.lo = max(self.lo, min(row, self.hi))
        self._save()

    def recount(self) -> None:
        """Count the rows left again, after rows were deleted (an erasure, a theater
        rebuild): an erased turn no longer waits for extraction."""
        if self.remaining():
            self.rows = self.tindex.count_between(self.lo, self.hi)
            self._publish()

    def _save(self) -> None:
        self.dirty = False
        self.tindex.set_cursors({BACKLOG_FROM: self.lo, BACKLOG_TO: self.hi})
        self.rows = self.tindex.count_between(self.lo, self.hi)
        self._publish()

    def _publish(self) -> None:
        # The one count /health and the memory browser show (nekomem.http.backlog_counts).
        if self.tally is not None:
            self.tally.publish(self.name, self.rows if self.remaining() else 0)
