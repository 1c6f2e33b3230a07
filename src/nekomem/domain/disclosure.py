"""Path B (AI self-disclosure) bookkeeping: the persisted cursor and the window rules.

The reference reads, every few path-A passes, the raw conversation from its last path-B
check up to the newest message path A has processed (at most 200 rows, oldest first), so
path B only sees what path A has seen. This module holds that state, plain and without
I/O (FactActor stores it in ``self_disclosure.json``):

- ``checked_ts``/``checked_row``: the last journal row a pass covered, as a position in
  (timestamp, row id) order, so rows sharing a timestamp are neither repeated nor skipped;
- ``seen_from``/``seen_until``: the oldest and newest turn path A has processed (the
  oldest only matters before the first pass, see :func:`window_start`);
- ``last_pass_at``: when the last pass finished (the known-facts pool counts from it);
- ``failures``: failed passes of the current window in a row.

A backlog longer than one window is read in several passes, each continuing where the
last stopped. Unlike the reference, a window is not trimmed to the span between its first
and last user message: the AI turns at its edges would never be offered (the next window
starts after them); a window without any user message is still skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.turns import Turn, parse_timestamp


class DisclosureCursor(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The persisted path-B state (see the module docstring). Timestamps are canonical UTC
    ISO strings as the journal stores them, so they compare as strings."""

    checked_ts: str | None = None
    checked_row: int = 0
    seen_from: str | None = None
    seen_until: str | None = None
    last_pass_at: str | None = None
    failures: int = 0


class DisclosureWindow(msgspec.Struct, frozen=True):
    """One pass: the turns to offer (empty: skip the call), the position the cursor moves
    to once the pass is done, and whether rows remain before ``seen_until``."""

    turns: list[Turn]
    advance_ts: str
    advance_row: int
    more: bool


def note_path_a(cursor: DisclosureCursor, stamps: Sequence[str]) -> DisclosureCursor:
    """The cursor after path A processed turns with these (canonical) timestamps."""
    if not stamps:
        return cursor
    low, high = min(stamps), max(stamps)
    seen_from = cursor.seen_from
    if cursor.checked_ts is None and (seen_from is None or low < seen_from):
        seen_from = low
    seen_until = high if cursor.seen_until is None or high > cursor.seen_until else cursor.seen_until
    if seen_from == cursor.seen_from and seen_until == cursor.seen_until:
        return cursor
    return msgspec.structs.replace(cursor, seen_from=seen_from, seen_until=seen_until)


def lagging(cursor: DisclosureCursor) -> bool:
    """True when path A has processed turns no path-B pass has covered yet."""
    if cursor.seen_until is None:
        return False
    return cursor.checked_ts is None or cursor.seen_until > cursor.checked_ts


def window_start(cursor: DisclosureCursor, settings: LongTermSettings) -> tuple[datetime, int]:
    """Where the next pass starts reading: after the cursor's row, or on a cold start (no
    pass yet) at the reference's lookback before the newest processed turn, moved back to
    the oldest turn path A processed since (so a first pass misses nothing path A saw).
    The row id is exclusive (-1 on a cold start: the start itself is included). Raises
    ValueError when there is nothing processed yet."""
    if cursor.checked_ts is not None:
        return parse_timestamp(cursor.checked_ts), cursor.checked_row
    if cursor.seen_until is None:
        raise ValueError("path A has processed nothing yet")
    lookback = parse_timestamp(cursor.seen_until) - timedelta(minutes=settings.fact_self_disclosure_cold_start_lookback_minutes)
    if cursor.seen_from is not None:
        lookback = min(lookback, parse_timestamp(cursor.seen_from))
    return lookback, -1


def plan_window(rows: Sequence[tuple[int, Turn]], limit: int) -> DisclosureWindow | None:
    """The pass over ``rows`` (id, turn with its stored timestamp) read after the cursor,
    in order, at most ``limit + 1`` of them (one more than a window tells whether more
    remain). None when there are no rows. A window without a user message, or without an
    AI message, offers nothing (the cursor still moves over it)."""
    if not rows:
        return None
    window = list(rows[:limit])
    last_id, last_turn = window[-1]
    turns = [t for _id, t in window]
    useful = any(t.role == "human" for t in turns) and any(t.role == "ai" for t in turns)
    return DisclosureWindow(turns=turns if useful else [], advance_ts=last_turn.ts, advance_row=last_id, more=len(rows) > limit)


def after_pass(cursor: DisclosureCursor, window: DisclosureWindow, now_iso: str) -> DisclosureCursor:
    """The cursor after a pass over ``window`` finished (or was given up)."""
    return msgspec.structs.replace(cursor, checked_ts=window.advance_ts, checked_row=window.advance_row, last_pass_at=now_iso, failures=0)
