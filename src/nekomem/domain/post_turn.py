"""The post-turn cursor: which stored turns already have their post-turn work record.

RecentActor answers ``/cache`` once the turns are in the time index and sends their
post-turn record to the outbox afterwards. The cursor (a time-index row id) moves over a
record only once the outbox has acknowledged it (the record is in its file, or its work
finished before it was written) *and* every record sent before it, so at
load every row after the stored cursor is enqueued again (the outbox drops ranges it
already holds). This object is that bookkeeping in memory; the actor stores
:meth:`PostTurnCursor.update` with its next time-index transaction.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Protocol, TypeVar

POST_TURN_CURSOR = "post_turn"  # time-index cursor: rows up to here have an outbox record or finished work


class PostTurnCursor:
    """The cursor row, the rows sent in order and the acknowledgements ahead of an older
    one (plain, no I/O)."""

    def __init__(self, saved: int) -> None:
        self.row = saved  # rows up to here have an acknowledged record
        self.saved = saved  # the value last handed out by :meth:`update`
        self._sent: collections.deque[int] = collections.deque()  # last rows, in send order
        self._acked: set[int] = set()

    def sent(self, last_row: int) -> None:
        """A record covering rows up to ``last_row`` went to the outbox."""
        self._sent.append(last_row)

    def acked(self, last_row: int) -> None:
        """The outbox holds the record ending at ``last_row`` (or has finished its work);
        the cursor moves over every leading record that is acknowledged, and no further."""
        self._acked.add(last_row)
        while self._sent and self._sent[0] in self._acked:
            self._acked.discard(self._sent[0])
            self.row = max(self.row, self._sent.popleft())

    def update(self) -> dict[str, int] | None:
        """The cursor to store when it moved since the last call (then counted as saved),
        else None."""
        if self.row == self.saved:
            return None
        self.saved = self.row
        return {POST_TURN_CURSOR: self.row}


class _Row(Protocol):
    @property
    def session_id(self) -> str | None: ...


R = TypeVar("R", bound=_Row)


def session_runs(rows: Sequence[R]) -> list[list[R]]:
    """``rows`` cut into runs of consecutive rows of one session, in order (each run is
    enqueued again as one post-turn record)."""
    runs: list[list[R]] = []
    for row in rows:
        if runs and runs[-1][0].session_id == row.session_id:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs
