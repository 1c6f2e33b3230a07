"""The recent window as the journal says it is: the window base plus every later row.

recent.json is rewritten without fsync on each conversation write, so after a power loss it
may come back missing, empty, torn or old. What is durable is time_indexed.db: its rows and
the *window base* (recent.json's content after its last change that was not an append of
rows: a compression's memo, a review, an edit, a cut by the hard cap, an adopted outside
edit; stored durably together with the last row it covers). The window is therefore always
``base + every row after the base`` (then bounded by the hard cap, which only drops the
oldest raw items and so gives the same result applied once or after each append).

:func:`rebuild` compares that with what recent.json holds at load: a file that is one of
the states the window passed through since the base (an old one, after a power loss) is
completed with the rows after it; a file that is none of them was edited from outside while
the server was stopped, and is adopted. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from nekomem.domain.turns import Turn


class Rebuilt(msgspec.Struct, frozen=True):
    """``window``: the window to serve; ``how``: ``base`` (recent.json missing or
    unreadable: base + rows), ``caught_up`` (recent.json was an older state: completed),
    ``current`` (recent.json was up to date) or ``adopted`` (an outside edit: taken as is);
    ``added``: rows appended to what recent.json held."""

    window: list[Turn]
    how: str
    added: int


def _keys(turns: Sequence[Turn]) -> list[tuple[str, str]]:
    return [(t.role, t.text) for t in turns]


def _run_end(found: list[tuple[str, str]], stored: list[tuple[str, str]], start_min: int, end_min: int) -> int | None:
    """The smallest ``j >= end_min`` with ``stored[j - len(found):j] == found`` and the run
    starting at or after ``start_min``; None when there is none. The smallest: a repeated
    text then folds rows in twice at worst, never leaves one out."""
    n = len(found)
    if n == 0:
        return None
    last = found[-1]
    for j in range(max(end_min, start_min + n, n), len(stored) + 1):
        if stored[j - 1] == last and stored[j - n : j] == found:
            return j
    return None


def covered_end(found: Sequence[Turn], stored: Sequence[Turn], base_len: int) -> int | None:
    """If ``found`` (recent.json's items) is a state the window passed through since the
    base, i.e. ``cap(stored[:j])`` for some ``j >= base_len`` where ``stored`` is the base's
    items followed by the rows after it, the ``j`` it ends at; else None.

    The hard cap keeps a leading memo and drops the oldest raw items, so ``found`` is
    ``stored[i:j]``, or ``stored[0]`` (a system memo) followed by ``stored[i:j]``. Items are
    compared by role and text (a row's timestamp is stored in UTC, the window keeps the one
    the client sent).
    """
    if not found:
        return 0 if base_len == 0 else None
    found_keys, stored_keys = _keys(found), _keys(stored)
    end = _run_end(found_keys, stored_keys, 0, base_len)
    if end is None and len(found_keys) > 1 and stored_keys and stored[0].role == "system" and found_keys[0] == stored_keys[0]:
        end = _run_end(found_keys[1:], stored_keys, 1, base_len)
    return end


def rebuild(base: Sequence[Turn], rows: Sequence[Turn], found: Sequence[Turn] | None) -> Rebuilt:
    """The window from the base, the rows stored after it and recent.json's items (None
    when recent.json is missing, empty or unreadable). See the module docstring."""
    stored = [*base, *rows]
    if found is None:
        return Rebuilt(window=stored, how="base", added=len(rows))
    end = covered_end(found, stored, len(base))
    if end is None:
        return Rebuilt(window=list(found), how="adopted", added=0)
    if end == len(stored):
        return Rebuilt(window=list(found), how="current", added=0)
    return Rebuilt(window=[*found, *stored[end:]], how="caught_up", added=len(stored) - end)


def only_dropped(before: Sequence[Turn], after: Sequence[Turn]) -> bool:
    """Whether ``after`` (the hard cap's result) only dropped the oldest raw items of
    ``before``, keeping a leading memo, with no text cut: then applying the cap again at
    load gives the same window, and no new base is needed."""
    n = len(after)
    if n > len(before):
        return False
    if list(before[len(before) - n :]) == list(after):
        return True
    return (
        n >= 1
        and bool(before)
        and before[0] == after[0]
        and before[0].role == "system"
        and list(before[len(before) - n + 1 :]) == list(after[1:])
    )
