"""Time expressions to event-time windows, and distances to a window.

``parse_time_window(text, now)`` returns a :class:`TimeWindow` — a half-open interval
``[start, end)`` (start inclusive, **end exclusive**) of aware datetimes in ``now``'s time
zone — or None when the text is not understood. Never raises on text.

Grammar, after NFKC normalisation and case folding:

- ISO: ``2026`` (year), ``2026-05`` (month), ``2026-05-01`` (day), ``2026-05-01T14`` or
  ``2026-05-01 14`` (hour), ``2026-W18`` (ISO week), a full timestamp with minutes
  (``2026-05-01T14:30:00+09:00``; an offset is converted to ``now``'s zone, a naive one is
  read in it) floored to its hour, one hour long. Values that overflow (``9999-12``) → None.
- Ranges: ``a/b`` or ``a..b`` (both sides must parse, else None), ``a~b``, ``a〜b``,
  ``from a to b``, ``between a and b``, ``a until b``, ``a到b``, ``从a到b``, ``a至b``,
  ``aからbまで``: the union ``[min(start), max(end))``; an end that names a month but no
  year takes the other end's year ("between August 11 and August 15 2023",
  "2023年8月11日から8月15日まで"; a year earlier or later when the range would otherwise
  run backwards). Day ranges in one month: ``August 11-15, 2023``, ``11 to 15 August``.
  Open ranges ``since a``,
  ``a以来``, ``a以降``, ``aから``, ``自a以来`` run from a's start to the end of today (or
  a's end, whichever is later).
- Days: today, yesterday, the day before yesterday, tomorrow, the day after tomorrow;
  今日/本日, 昨日, 一昨日/おととい, 一昨々日, 明日, 明後日; 今天, 昨天, 前天, 大前天, 明天, 后天.
- Parts of a day: this morning/afternoon/evening, tonight, last night, yesterday morning...;
  今朝, 昨夜/昨晩/ゆうべ, 今夜/今晩, 昨日の夜...; 今早, 昨晚, 今晚, 昨天晚上, 今天下午...
  (morning 05-12, noon 11-14, afternoon 12-18, evening 17-24, night 18-06 next day).
- Calendar weeks (starting Monday), months and years: this/last/next week|month|year,
  the week|month|year before last, earlier this week; 今週/先週/先々週/来週, 今月/先月/
  先々月/来月, 今年/去年/昨年/一昨年/来年; 本周/这周/上周/上星期/上个礼拜/上上周/下周,
  这个月/本月/上个月/上上个月/下个月, 今年/去年/前年/明年. Weekends: last/this weekend,
  (the) weekend = the latest one that has begun; 先週末/今週末/週末; 上周末/这周末/周末.
- "N units ago" (hour, day, week, month, year; N in digits, English words or kanji):
  the calendar hour/day/week/month/year that contains that moment: 3 days ago, a week
  ago; 3日前, 2週間前, 3ヶ月前, 1年前, 5時間前; 三天前, 两周前, 3个月前, 2年前, 5小时前.
- Rolling periods: past/last N days|weeks|months|years, the past week; 過去3日, ここ1週間,
  最近3日; 最近3天, 过去一周, 近两个月: from the start of the day N units ago to the end of
  today (hours: from the hour N hours ago to the end of the current hour).
- Months: (in) March, March 2025, March 5(th)(, 2025) (also "December 1,2023"), 5 March, last/this/next March;
  3月, 2025年3月, 3月5日/3月5号, 去年の3月, 去年三月, 今月5日: a month or day without a
  year is the most recent one not in the future ("last March": the most recent before the
  current month). 2025年 is the year.
- Relative to another time X (:mod:`nekomem.recall.timeanchored`): the week/day/month/
  weekend/Friday before X, two weeks before X, 3 days prior to X (the named period, on to
  the end of X's first day); the week/Friday/... after X; the week of X; the first/
  second/.../last week of X; the beginning/middle/end/first half/second half of X; early/
  mid/late X (thirds; of a year: January-April, May-August, September-December).
- Weekdays: monday (the most recent Monday, today included), last monday (the most recent
  before today), this/next monday (in the current/next week); 月曜日/先週の金曜日/来週の月曜;
  周一/星期天/上周五/上星期三/下周一.

Leading "in/on/during/over/at/around/the" and trailing の/に/は/頃/ごろ/的/的时候 are ignored.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo

import msgspec

from nekomem.recall import timeanchored as anchored
from nekomem.recall.timecalendar import Calendar, Span, aware
from nekomem.recall.timerules import _LEAD_WORDS, _RULES, _TRAIL_PARTICLES


class TimeWindow(msgspec.Struct, frozen=True):
    """The half-open window ``[start, end)``: ``start`` inclusive, ``end`` exclusive (aware)."""

    start: datetime
    end: datetime

    def contains(self, ts: datetime) -> bool:
        """True if the instant ``ts`` is in ``[start, end)`` (a naive ``ts`` is read in start's zone)."""
        ts = aware(ts, self.start.tzinfo).astimezone(timezone.utc)
        return self.start <= ts < self.end

    def overlaps(self, start: datetime, end: datetime | None = None) -> bool:
        """True if the event ``[start, end]`` (both inclusive; ``end`` defaults to ``start``)
        overlaps the window: ``start < window.end and end >= window.start``."""
        s, e = _interval(start, end, self.start.tzinfo)
        return s < self.end and e >= self.start


def distance_to_window(ts: datetime, window: TimeWindow, ts_end: datetime | None = None) -> float:
    """Seconds between the event ``[ts, ts_end]`` (or the instant ``ts``) and ``window``.

    0.0 when they overlap (see :meth:`TimeWindow.overlaps`); otherwise the gap to the
    nearest edge. An event starting exactly at the exclusive ``end`` is outside at
    distance 0.0 (use :func:`proximity_key` to rank it after the ones inside). Naive
    datetimes are read in the window's zone.
    """
    s, e = _interval(ts, ts_end, window.start.tzinfo)
    if s < window.end and e >= window.start:
        return 0.0
    # Timestamps, not wall-clock subtraction: same-zone aware datetimes subtract naively.
    if e < window.start:
        return window.start.timestamp() - e.timestamp()
    return s.timestamp() - window.end.timestamp()


def proximity_key(ts: datetime, window: TimeWindow, ts_end: datetime | None = None) -> tuple[int, float, float]:
    """Sort key for "nearest the window first": inside before outside, then distance,
    then the later event first."""
    s, _ = _interval(ts, ts_end, window.start.tzinfo)
    inside = window.overlaps(ts, ts_end)
    return (0 if inside else 1, distance_to_window(ts, window, ts_end), -s.timestamp())


def parse_time_window(text: str, now: datetime) -> TimeWindow | None:
    """The window ``text`` names, resolved against ``now`` in ``now``'s time zone.

    A naive ``now`` is taken as system local time. Returns None for empty, unknown or
    out-of-range expressions, for ones longer than MAX_CHARS and for ones nesting deeper
    than MAX_DEPTH levels; never raises on text. The cost is bounded by both: each anchor
    is parsed once.
    """
    if not isinstance(text, str):
        return None
    if now.tzinfo is None:
        now = now.astimezone()
    raw = " ".join(unicodedata.normalize("NFKC", text).split())
    raw = raw.strip(_EDGE_PUNCT)
    if raw.endswith(".") and not raw.endswith(".."):
        raw = raw[:-1]  # a sentence's full stop, not half of a ".." range
    if not raw:
        return None
    if len(raw) > MAX_CHARS:
        return None
    try:
        found = _parse_spec(raw, _Parse(Calendar(now)))
    except (ValueError, OverflowError, _TooDeep):
        return None
    return None if found is None else TimeWindow(found[0], found[1])


# --------------------------------------------------------------------------- internals

_EDGE_PUNCT = " \t\"'“”‘’「」『』()（）[]【】?!,;:。、，？！；："


def _interval(start: datetime, end: datetime | None, tz: tzinfo | None) -> tuple[datetime, datetime]:
    """The event as a UTC interval, swapped if reversed (UTC so that comparisons with the
    window are exact instants, not same-zone wall-clock comparisons)."""
    s = aware(start, tz).astimezone(timezone.utc)
    e = s if end is None else aware(end, tz).astimezone(timezone.utc)
    return (e, s) if e < s else (s, e)


# ---- ranges -----------------------------------------------------------------------------

_STRICT_SEPARATORS = ("/", "..")
_LOOSE_RANGES = (
    re.compile(r"between (.+?) and (.+)"),
    re.compile(r"(?:from )?(.+?) (?:to|until|till|through|thru|-) (.+)"),
    re.compile(r"(.+?) ?[~〜] ?(.+)"),
    re.compile(r"(?:从|從|自)?(.+?)(?:到|至)(.+)"),
    re.compile(r"(.+?)から(.+?)(?:まで)?"),
)
_OPEN_RANGES = (
    re.compile(r"since (.+)"),
    re.compile(r"(?:自从|自從|自|从|從)(.+?)(?:以来|以來|开始|開始|起)"),
    re.compile(r"(.+?)(?:以来|以來|以降|から|之后|之後|开始|開始|起)"),
)


# Hard ceilings of the parser, whoever calls it (the HTTP route refuses longer or deeper
# expressions earlier, with a 422: ServerSettings.time_max_chars / time_max_relations).
MAX_CHARS = 1000
MAX_DEPTH = 32

# What makes an expression nest: one of these per level ("the day before X", "Xの前日").
_RELATION = re.compile(r"\b(?:before|after|prior to|of|since|until|till|from|between)\b|[の的之前后後翌次以从從自]")


def relation_count(text: str) -> int:
    """How many relation words ``text`` holds: a linear-time bound on how deeply it can
    nest (each level of "the day before X" / "Xの前日" needs one)."""
    return sum(1 for _ in _RELATION.finditer(unicodedata.normalize("NFKC", text).casefold()))


class _TooDeep(Exception):
    """The expression nests deeper than MAX_DEPTH (answered as not understood)."""


class _Parse:
    """One parse: the calendar, the span found for each text tried so far (each anchor is
    parsed once, however many readings reach it, so the work stays linear in the number of
    levels), and the current nesting depth."""

    __slots__ = ("c", "depth", "seen")

    def __init__(self, c: Calendar) -> None:
        self.c = c
        self.depth = 0
        self.seen: dict[str, Span | None] = {}


def _parse_spec(raw: str, p: _Parse) -> Span | None:
    c = p.c
    text = raw.casefold()
    for sep in _STRICT_SEPARATORS:
        if sep in text:
            parts = text.split(sep)
            if len(parts) != 2:
                return None
            return _union(_single(parts[0], c), _single(parts[1], c))
    single = _one(text, p)
    if single is not None:
        return single
    for pattern in _LOOSE_RANGES:
        m = pattern.fullmatch(text)
        if m:
            found = _range(m[1], m[2], p)
            if found is not None:
                return found
    for pattern in _OPEN_RANGES:
        m = pattern.fullmatch(text)
        if m:
            first = _one(m[1], p)
            if first is not None:
                return first[0], max(first[1], c.at(c.today + timedelta(days=1)))
    return None


def _union(a: Span | None, b: Span | None) -> Span | None:
    if a is None or b is None:
        return None
    return min(a[0], b[0]), max(a[1], b[1])


def _range(left: str, right: str, p: _Parse) -> Span | None:
    """The union of a range's two ends; an end that names a month but no year takes the
    year of the other end when that one names a year (:func:`timeanchored.year_borrowed`)."""
    a, b = _one(left, p), _one(right, p)
    if a is None or b is None:
        return None
    if anchored.names_month_without_year(left) and anchored.names_year(right):
        a = anchored.year_borrowed(left, b, True, lambda t: _one(t, p)) or a
    elif anchored.names_month_without_year(right) and anchored.names_year(left):
        b = anchored.year_borrowed(right, a, False, lambda t: _one(t, p)) or b
    return _union(a, b)


def _one(text: str, p: _Parse) -> Span | None:
    """One time: a rule of :mod:`timerules`, or a time relative to another one
    (:mod:`timeanchored`: "the week before X", "the week of X", "the second week of X",
    "the end of X", "early X"). Each text is parsed once per parse (``p.seen``); raises
    _TooDeep beyond MAX_DEPTH levels."""
    if text in p.seen:
        return p.seen[text]
    if p.depth >= MAX_DEPTH:
        raise _TooDeep
    p.depth += 1
    try:
        found = p.seen[text] = _one_uncached(text, p)
    finally:
        p.depth -= 1
    return found


def _one_uncached(text: str, p: _Parse) -> Span | None:
    c = p.c
    found = _single(text, c)
    if found is not None:
        return found
    text = _LEAD_WORDS.sub("", text.strip(_EDGE_PUNCT))
    m = anchored.ANCHORED.fullmatch(text)
    if m:
        anchor = _one(m[4], p)
        return None if anchor is None else anchored.anchored(m[1], m[2], m[3], anchor, c)
    for count, unit, direction, anchor_text in anchored.cjk_anchored(text):
        anchor = _one(anchor_text, p)
        if anchor is not None:
            return anchored.anchored(count, unit, direction, anchor, c)
    for pattern, build in _PARTS:
        m = pattern.fullmatch(text)
        if m:
            anchor = _one(m[1] if pattern in _ANCHOR_FIRST else m[2], p)
            return None if anchor is None else build(m, anchor, c)
    return None


_PARTS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], Span, Calendar], Span]], ...] = (
    (anchored.WEEK_OF, lambda m, anchor, c: anchored.week_of(anchor, c)),
    (anchored.CJK_WEEK_OF, lambda m, anchor, c: anchored.week_of(anchor, c)),
    (anchored.NTH_WEEK, lambda m, anchor, c: anchored.nth_week(m[1], anchor, c)),
    (anchored.PART_OF, lambda m, anchor, c: anchored.part_of(m[1], anchor, c)),
    (anchored.EARLY_LATE, lambda m, anchor, c: anchored.part_of(m[1], anchor, c)),
)


_ANCHOR_FIRST = (anchored.WEEK_OF, anchored.CJK_WEEK_OF)


def _single(text: str, c: Calendar) -> Span | None:
    text = text.strip(_EDGE_PUNCT)
    candidates = [text]
    stripped = _strip_edges(text)
    if stripped != text:
        candidates.append(stripped)
    for candidate in candidates:
        for pattern, handler in _RULES:
            m = pattern.fullmatch(candidate)
            if m:
                return handler(m, c)
    return None


def _strip_edges(text: str) -> str:
    text = _LEAD_WORDS.sub("", text)
    for _ in range(2):
        for particle in _TRAIL_PARTICLES:
            if text.endswith(particle) and len(text) > len(particle):
                text = text[: -len(particle)]
                break
    return text.strip()
