"""Year-less dates inside a query: the latest such date that has memories.

"When did we go camping in June?" resolves (``timerules``) to the latest June up to now.
When nothing is remembered in that June, the speaker most likely meant an earlier one, so
the time hint tries the same calendar window one year earlier, then two, ... and keeps
the first that holds memories. Only a query that names a month and no year gets this:
"yesterday", "last week" or "in June 2023" mean exactly what they say.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from nekomem.recall.timeanchored import names_month_without_year
from nekomem.recall.timewindow import TimeWindow

__all__ = ["earlier_years", "latest_remembered", "names_month_without_year"]


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
