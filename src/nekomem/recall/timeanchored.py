"""Times named relative to another time, and year-less range ends (English, Japanese, Chinese).

:mod:`nekomem.recall.timewindow` parses the anchor (any expression it understands) and
calls these with its span:

- ``the week before 9 June 2023``, ``two weeks before X``, ``the day before X``, ``the month
  before X``, ``the Sunday before X``, ``the weekend before X`` (also ``last weekend before
  X``, ``prior to X``): the named period before the anchor's first day. The window runs on
  to the end of the anchor's first day: what happened "the week before X" is mostly told,
  and so remembered, on X itself ("last week I ..."), and a memory keeps the time it was
  told when no other time was extracted for it.
- ``the week after X``, ``three days after X``, ``the Friday after X``: the named period
  after the anchor's last day (nothing of the anchor).
- ``the week of X``: the calendar week (from Monday) holding the anchor's first day.
- Japanese and Chinese, anchor first: ``Xの前の週``, ``Xの3日前``, ``Xの翌日``, ``Xの週``;
  ``X的前一周``, ``X前三天``, ``X之后一个月``, ``X的第二天``, ``X那周`` (day, week, weekend,
  month and year; no weekdays).

Units: day, week (seven days back from the anchor's day, not the calendar week), weekend
(Saturday and Sunday), month and year (calendar ones, shifted from the anchor's), a weekday.

:func:`borrow_year` serves ranges whose one end names a month without a year ("between
August 11 and August 15 2023", "2023年8月11日から8月15日まで"): that end takes the other
end's year, one year earlier or later when it would otherwise end up on the wrong side.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import date, datetime, timedelta

from nekomem.recall.timecalendar import Calendar, Span
from nekomem.recall.timerules import _CJK_NUM, _EN_NUMBERS, _EN_WEEKDAYS, _number

_EN_NUM = "(?:\\d+|" + "|".join(sorted(map(re.escape, _EN_NUMBERS), key=len, reverse=True)) + ")"
_WEEKDAY = "|".join(sorted(map(re.escape, _EN_WEEKDAYS), key=len, reverse=True))
_UNIT = f"day|week ?end|week|month|year|{_WEEKDAY}"
ANCHORED = re.compile(f"(?:(?:the|a|last) )?(?:({_EN_NUM}) )?({_UNIT})s? (before|prior to|after) (.+)")
WEEK_OF = re.compile(r"(?:the )?week of (.+)")


# Japanese and Chinese forms of the same periods (no weekday units): the anchor comes first.
_CJK_UNITS = {
    "週間": "week",
    "週末": "weekend",
    "周末": "weekend",
    "ヶ月": "month",
    "か月": "month",
    "カ月": "month",
    "个月": "month",
    "個月": "month",
    "星期": "week",
    "礼拜": "week",
    "禮拜": "week",
    "日": "day",
    "天": "day",
    "週": "week",
    "周": "week",
    "月": "month",
    "年": "year",
}
_CJK_UNIT = "|".join(sorted(map(re.escape, _CJK_UNITS), key=len, reverse=True))
_CJK_AFTER = {"後", "后", "翌", "次"}
_A, _C, _U = "(?P<anchor>.+?)", f"(?P<count>(?:{_CJK_NUM})?)", f"(?P<unit>{_CJK_UNIT})"
# Each form names the anchor; the count, the unit (default: a day) and the direction word
# (default: after) where it has them.
_CJK_FORMS = tuple(
    re.compile(form)
    for form in (
        f"{_A}の{_C}{_U}(?P<word>前|後)",  # 2023年5月7日の3日前, 5月7日の1週間後, 5月7日の2ヶ月前
        f"{_A}の{_C}(?P<word>前|翌|次|後)の?{_U}",  # 5月7日の前日, の翌週, の前の週, の次の週末
        f"{_A}(?:的|之|以)?(?P<word>前|后|後)的?{_C}{_U}",  # 5月7日的前一周, 前三天, 之后一个月, 之前的一周
        f"{_A}的?(?:第二天|次日|隔天)",  # 5月7日的第二天
    )
)
CJK_WEEK_OF = re.compile(r"(.+?)(?:の週|的?(?:那|这|這)一?(?:个|個)?(?:周|週|星期|礼拜|禮拜))")


def cjk_anchored(text: str) -> list[tuple[str | None, str, str, str]]:
    """The readings of a Japanese or Chinese time relative to another one: (count, unit,
    direction, anchor text) for :func:`anchored`, most specific form first; empty when
    ``text`` is none of them."""
    found: list[tuple[str | None, str, str, str]] = []
    for pattern in _CJK_FORMS:
        m = pattern.fullmatch(text)
        if m is not None:
            parts = m.groupdict()
            unit = _CJK_UNITS[parts["unit"]] if parts.get("unit") else "day"
            direction = "after" if parts.get("word", "後") in _CJK_AFTER else "before"
            found.append((parts.get("count") or None, unit, direction, parts["anchor"]))
    return found


def anchored(count: str | None, unit: str, direction: str, anchor: Span, c: Calendar) -> Span:
    """The period ``count`` (default one) ``unit``s before or after ``anchor`` (see the
    module docstring). Raises ValueError for a count it cannot read or of zero."""
    n = _number(count) if count else 1
    if n < 1:
        raise ValueError("a count of zero")
    unit = unit.replace(" ", "")
    if direction == "after":
        return _after(n, unit, (anchor[1] - timedelta(microseconds=1)).date(), c)
    start = _before(n, unit, anchor[0].date(), c)
    return start, c.at(anchor[0].date() + timedelta(days=1))


def week_of(anchor: Span, c: Calendar) -> Span:
    """The calendar week (Monday to Sunday) that holds the anchor's first day."""
    first = anchor[0].date()
    return c.days(first - timedelta(days=first.weekday()), 7)


def _before(n: int, unit: str, day: date, c: Calendar) -> datetime:
    """The start of the period ``n`` ``unit``s before ``day``."""
    if unit == "day":
        return c.at(day - timedelta(days=n))
    if unit == "week":
        return c.at(day - timedelta(weeks=n))
    if unit == "weekend":
        # The latest weekend over before ``day`` (its Sunday at most the day before).
        eve = day - timedelta(days=1)
        sunday = eve - timedelta(days=(eve.weekday() - 6) % 7)
        return c.at(sunday - timedelta(days=1) - timedelta(weeks=n - 1))
    if unit == "month":
        return c.at(_month_start(day, -n))
    if unit == "year":
        return c.at(date(day.year - n, 1, 1))
    back = (day.weekday() - _EN_WEEKDAYS[unit]) % 7 or 7
    return c.at(day - timedelta(days=back) - timedelta(weeks=n - 1))


def _after(n: int, unit: str, day: date, c: Calendar) -> Span:
    """The period ``n`` ``unit``s after ``day`` (the anchor's last day)."""
    if unit == "day":
        return c.days(day + timedelta(days=n))
    if unit == "week":
        return c.days(day + timedelta(days=1) + timedelta(weeks=n - 1), 7)
    if unit == "weekend":
        saturday = day + timedelta(days=(5 - day.weekday()) % 7 or 7)
        return c.days(saturday + timedelta(weeks=n - 1), 2)
    if unit == "month":
        first = _month_start(day, n)
        return c.month_of(first.year, first.month)
    if unit == "year":
        return c.year_of(day.year + n)
    wd = _EN_WEEKDAYS[unit]
    ahead = (wd - day.weekday()) % 7 or 7
    return c.days(day + timedelta(days=ahead) + timedelta(weeks=n - 1))


def _month_start(day: date, offset: int) -> date:
    index = day.year * 12 + day.month - 1 + offset
    return date(index // 12, index % 12 + 1, 1)


_MONTH = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\b|\d{1,2}\s*月|[〇一二三四五六七八九十]{1,3}\s*月",
    re.I,
)
_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)|年")
_FULL_MONTHS = frozenset(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)


def names_month_without_year(text: str) -> bool:
    """Whether ``text`` names a calendar month ("June", "Aug 15th", 6月, 三月) and no year."""
    if _YEAR.search(text):
        return False
    for match in _MONTH.finditer(text):
        word = match.group().lower()
        if "月" in word or word in _FULL_MONTHS:
            return True
    return False


def names_year(text: str) -> bool:
    """Whether ``text`` names a year (four digits, or with 年: 2023年, 去年)."""
    return bool(_YEAR.search(text))


def borrow_year(text: str, year: int) -> str:
    """``text`` (an end of a range that names a month without a year) with ``year`` added
    where the parser reads it: ``2023年`` before a CJK date, ``2023`` after an English one."""
    if "月" in text:
        return f"{year}年{text}"
    return f"{text} {year}"


def year_borrowed(side: str, other: Span, side_is_start: bool, parse: Callable[[str], Span | None]) -> Span | None:
    """``side`` of a range parsed in the year of ``other`` (the other end's span): the start
    end takes the year of the other's start, one year earlier if it would begin after the
    other; the end end the year of the other's end, one year later if it would finish
    before the other begins. None when ``side`` does not parse with a year added."""
    if side_is_start:
        year = other[0].year
        found = parse(borrow_year(side, year))
        if found is not None and found[0] > other[0]:
            found = parse(borrow_year(side, year - 1))
        return found
    year = (other[1] - timedelta(microseconds=1)).year
    found = parse(borrow_year(side, year))
    if found is not None and found[1] <= other[0]:
        found = parse(borrow_year(side, year + 1))
    return found


# ---- parts of a period ------------------------------------------------------------------

_NTH = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4, "fifth": 5, "5th": 5, "last": -1}
NTH_WEEK = re.compile(f"(?:the )?({'|'.join(_NTH)}) week of (.+)")
_PART_WORDS = {
    "beginning": "early",
    "start": "early",
    "early part": "early",
    "middle": "mid",
    "end": "late",
    "late part": "late",
    "first half": "first half",
    "second half": "second half",
}
PART_OF = re.compile(f"(?:the )?(?:very )?({'|'.join(sorted(_PART_WORDS, key=len, reverse=True))}) of (.+)")
EARLY_LATE = re.compile(r"(early|mid|late)(?:-| |-in-)(.+)")


def nth_week(nth: str, anchor: Span, c: Calendar) -> Span:
    """The ``nth`` seven days of ``anchor`` (a month, mostly) counted from its first day;
    "last" is its last seven days. Raises ValueError when the week does not start inside."""
    first, end = anchor[0].date(), anchor[1].date()
    k = _NTH[nth]
    start = end - timedelta(days=7) if k < 0 else first + timedelta(weeks=k - 1)
    if not first <= start < end:
        raise ValueError("no such week")
    return c.at(start), c.at(min(start + timedelta(days=7), end))


def part_of(part: str, anchor: Span, c: Calendar) -> Span:
    """A part of ``anchor`` in whole days: ``early``/``mid``/``late`` its first, middle and
    last third, or its first / second half (``part`` is a word of PART_OF or EARLY_LATE).
    A span shorter than three days is returned as it is."""
    kind = _PART_WORDS.get(part, part)
    first, end = anchor[0].date(), anchor[1].date()
    if (first.month, first.day, end.month, end.day) == (1, 1, 1, 1) and end.year == first.year + 1:
        # A calendar year splits into months: January-April, May-August, September-December.
        months = {"early": (1, 5), "mid": (5, 9), "late": (9, 13), "first half": (1, 7), "second half": (7, 13)}[kind]
        return c.at(_month_start(first, months[0] - 1)), c.at(_month_start(first, months[1] - 1))
    length = (end - first).days
    if length < 3:
        return anchor
    cuts = {
        "early": (0, round(length / 3)),
        "mid": (round(length / 3), round(2 * length / 3)),
        "late": (round(2 * length / 3), length),
        "first half": (0, length // 2),
        "second half": (length // 2, length),
    }[kind]
    return c.at(first + timedelta(days=cuts[0])), c.at(first + timedelta(days=cuts[1]))
