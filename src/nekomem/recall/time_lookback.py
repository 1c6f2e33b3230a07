"""Year-less dates inside a query: the latest such date that has memories.

"When did we go camping in June?" resolves (``timerules``) to the latest June up to now.
When nothing is remembered in that June, the speaker most likely meant an earlier one, so
the time hint tries the same calendar window one year earlier, then two, ... and keeps
the first that holds memories. Only a query that names a month and no year gets this:
"yesterday", "last week" or "in June 2023" mean exactly what they say.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from nekomem.recall.timewindow import TimeWindow

_MONTH = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\b|\d{1,2}\s*月",
    re.I,
)
_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)|年")
_FULL_MONTHS = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)


def names_month_without_year(text: str) -> bool:
    """Whether ``text`` names a calendar month ("June", "Aug 15th", 6月) and no year."""
    if _YEAR.search(text):
        return False
    for match in _MONTH.finditer(text):
        word = match.group().lower()
        if "月" in word or word in _FULL_MONTHS:
            return True
    return False


def earlier_years(window: TimeWindow, years: int) -> Iterator[TimeWindow]:
    """``window`` moved back by 1, 2, ... ``years`` calendar years (a year where a bound
    does not exist, such as 29 February, is skipped)."""
    for back in range(1, years + 1):
        try:
            yield TimeWindow(window.start.replace(year=window.start.year - back), window.end.replace(year=window.end.year - back))
        except ValueError:
            continue


def latest_remembered(window: TimeWindow, years: int, ids_in: Callable[[TimeWindow], set[str] | None]) -> set[str] | None:
    """The ids ``ids_in`` finds in the latest of ``window``'s earlier years that has any
    (at most ``years`` back); None when none has."""
    for earlier in earlier_years(window, years):
        found = ids_in(earlier)
        if found:
            return found
    return None
