"""Which journal rows a long-term memory covers: the ``mined_rows`` table of time_indexed.db.

A row is *covered* once an extraction of facts over it finished (path A, a post-turn record
or a batch of the fact backlog, whatever it yielded: the model has seen the turn, and what
it judged worth keeping is a fact now). Every other row (not mined yet, its extraction
failed, is backed off or was given up, the fact backlog while no model is configured, a
server without any model) is *uncovered*, and recall searches it beside the long-term
entries (:mod:`nekomem.recall.turn_leg`).

The table holds disjoint inclusive row-id ranges ``(first, last)``, merged on every write,
so it stays a handful of rows: extraction finishes records out of order (a failed record is
retried while later ones succeed), which a single "mined through" cursor could not say
without either hiding the failed turns or showing every turn after them. RecentActor, the
journal's only writer, writes it when the fact actor reports a record mined
(``TurnsMined``); recall reads it read-only.

The table is created at the first load of a journal by a nekomem that tracks coverage.
Rows stored before then are taken as covered when their post-turn work was recorded,
except the fact backlog's range (see :func:`seed_ranges`): older servers did not say
which of them were mined, and showing every old turn again would flood recall.
"""

from __future__ import annotations

from collections.abc import Iterable

MINED_TABLE = "mined_rows"
MINED_SCHEMA = f"CREATE TABLE IF NOT EXISTS {MINED_TABLE} (first INTEGER PRIMARY KEY, last INTEGER NOT NULL)"

Span = tuple[int, int]


def merge_ranges(ranges: Iterable[Span]) -> list[Span]:
    """Inclusive ranges merged where they overlap or touch, ordered; empty or inverted
    ranges (``last < first``) are dropped."""
    ordered = sorted((int(a), int(b)) for a, b in ranges if int(b) >= int(a))
    out: list[Span] = []
    for first, last in ordered:
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def uncovered_spans(mined: Iterable[Span], top: int) -> list[Span]:
    """The inclusive row-id ranges in ``1..top`` that no range of ``mined`` holds, newest
    first."""
    gaps: list[Span] = []
    nxt = 1
    for first, last in merge_ranges(mined):
        if first > nxt:
            gaps.append((nxt, min(first - 1, top)))
        nxt = max(nxt, last + 1)
        if nxt > top:
            break
    if nxt <= top:
        gaps.append((nxt, top))
    return [g for g in reversed(gaps) if g[1] >= g[0]]


def seed_ranges(recorded_through: int, backlog_from: int, backlog_to: int) -> list[Span]:
    """The ranges taken as covered when coverage starts on an existing journal: rows up to
    ``recorded_through`` (the post-turn cursor) outside the fact backlog
    ``(backlog_from, backlog_to]``."""
    if recorded_through <= 0:
        return []
    if backlog_to <= backlog_from:
        return [(1, recorded_through)]
    return merge_ranges([(1, min(backlog_from, recorded_through)), (backlog_to + 1, recorded_through)])
