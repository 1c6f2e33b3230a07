"""The fact backlog's cursors in time_indexed.db: the stored turns that no model has
mined for facts yet (path A), because no model that can extract facts was configured
when they arrived.

The backlog is the row range ``(fact_backlog_from, fact_backlog_to]``. Turns stored
without such a model extend it; once a model is configured, RecentActor hands it to the
fact actor in bounded batches and moves ``fact_backlog_from`` over each batch once its
extraction finished (see :mod:`nekomem.layers.recent.backlog`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping
from pathlib import Path

from nekomem.stores.timeindex_read import TimeIndexReader

BACKLOG_FROM = "fact_backlog_from"  # rows up to here are mined (or never needed it)
BACKLOG_TO = "fact_backlog_to"  # the last row stored without a model that extracts facts
BACKLOG_ROWS_KEY = "backlog_rows"  # payload key of a post-turn record that mines backlog rows


def backlog_last_row(payload: Mapping[str, object]) -> int | None:
    """The last row a post-turn record of the backlog covers; None for any other record."""
    rows = payload.get(BACKLOG_ROWS_KEY)
    if isinstance(rows, list) and len(rows) == 2 and isinstance(rows[1], int):
        return rows[1]
    return None


def backlog_remaining(path: Path) -> int:
    """How many journal rows of the database at ``path`` still wait for fact extraction,
    read through a read-only connection (no schema change, no writer lock). 0 when the
    file, the cursor table or the cursors do not exist, or on a read error."""
    if not Path(path).exists():
        return 0
    try:
        with TimeIndexReader.read_only(Path(path)) as reader:
            return reader.rows_between_cursors(BACKLOG_FROM, BACKLOG_TO)
    except sqlite3.Error:
        return 0


class BacklogTally:
    """Rows still waiting in each character's backlog (thread-safe): as its RecentActor
    last published them (exact: at load, on every change), or as read from its journal by
    the browser's listing for a character not loaded since the start. /health and the
    browser both read this (``nekomem.http.backlog_counts``), so they never disagree."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, int] = {}  # a published 0 is kept: it is known

    def publish(self, name: str, rows: int) -> None:
        """The count of ``name``'s owner (its recent actor), replacing any other."""
        with self._lock:
            self._rows[name] = max(0, rows)

    def publish_stored(self, name: str, rows: int) -> int:
        """A count read from ``name``'s journal while it was not loaded: kept unless its
        owner published one meanwhile (then that one is returned)."""
        with self._lock:
            return self._rows.setdefault(name, max(0, rows))

    def known(self, name: str) -> int | None:
        """The count of ``name``, or None when none was published or read."""
        with self._lock:
            return self._rows.get(name)

    def forget(self, name: str) -> None:
        """Drop ``name``'s count (its folder was replaced, removed or renamed)."""
        with self._lock:
            self._rows.pop(name, None)

    def snapshot(self) -> dict[str, int]:
        """Every character with rows left, and how many."""
        with self._lock:
            return {name: rows for name, rows in self._rows.items() if rows > 0}
