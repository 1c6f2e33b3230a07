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
  ``aからbまで``: the union ``[min(start), max(end))``. Open ranges ``since a``,
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
- Months: (in) March, March 2025, March 5(th)(, 2025), 5 March, last/this/next March;
  3月, 2025年3月, 3月5日/3月5号, 去年の3月, 去年三月, 今月5日: a month or day without a
  year is the most recent one not in the future ("last March": the most recent before the
  current month). 2025年 is the year.
- Weekdays: monday (the most recent Monday, today included), last monday (the most recent
  before today), this/next monday (in the current/next week); 月曜日/先週の金曜日/来週の月曜;
  周一/星期天/上周五/上星期三/下周一.

Leading "in/on/during/over/at/around/the" and trailing の/に/は/頃/ごろ/的/的时候 are ignored.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from datetime import date, datetime, timedelta, timezone, tzinfo

import msgspec


class TimeWindow(msgspec.Struct, frozen=True):
    """The half-open window ``[start, end)``: ``start`` inclusive, ``end`` exclusive (aware)."""

    start: datetime
    end: datetime

    def contains(self, ts: datetime) -> bool:
        """True if the instant ``ts`` is in ``[start, end)`` (a naive ``ts`` is read in start's zone)."""
        ts = _aware(ts, self.start.tzinfo).astimezone(timezone.utc)
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
    out-of-range expressions; never raises on text.
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
    try:
        found = _parse_spec(raw, _Clock(now))
    except (ValueError, OverflowError):
        return None
    return None if found is None else TimeWindow(found[0], found[1])


# --------------------------------------------------------------------------- internals

_Span = tuple[datetime, datetime]
_EDGE_PUNCT = " \t\"'“”‘’「」『』()（）[]【】?!,;:。、，？！；："


def _aware(ts: datetime, tz: tzinfo | None) -> datetime:
    return ts.replace(tzinfo=tz) if ts.tzinfo is None else ts


def _interval(start: datetime, end: datetime | None, tz: tzinfo | None) -> tuple[datetime, datetime]:
    """The event as a UTC interval, swapped if reversed (UTC so that comparisons with the
    window are exact instants, not same-zone wall-clock comparisons)."""
    s = _aware(start, tz).astimezone(timezone.utc)
    e = s if end is None else _aware(end, tz).astimezone(timezone.utc)
    return (e, s) if e < s else (s, e)


class _Clock:
    """``now`` and calendar arithmetic in its zone (windows built from wall-clock dates)."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.tz = now.tzinfo
        self.today = now.date()

    def at(self, day: date, hour: int = 0) -> datetime:
        day = day + timedelta(days=hour // 24)
        return datetime(day.year, day.month, day.day, hour % 24, tzinfo=self.tz)

    def days(self, first: date, count: int = 1) -> _Span:
        return self.at(first), self.at(first + timedelta(days=count))

    def day(self, offset: int) -> _Span:
        return self.days(self.today + timedelta(days=offset))

    def monday(self, week_offset: int) -> date:
        return self.today - timedelta(days=self.today.weekday()) + timedelta(weeks=week_offset)

    def week(self, offset: int) -> _Span:
        return self.days(self.monday(offset), 7)

    def weekend(self, offset: int) -> _Span:
        return self.days(self.monday(offset) + timedelta(days=5), 2)

    def month_of(self, year: int, month: int) -> _Span:
        nxt = (year + 1, 1) if month == 12 else (year, month + 1)
        return self.at(date(year, month, 1)), self.at(date(nxt[0], nxt[1], 1))

    def shift_month(self, offset: int) -> tuple[int, int]:
        index = self.today.year * 12 + self.today.month - 1 + offset
        return index // 12, index % 12 + 1

    def month(self, offset: int) -> _Span:
        return self.month_of(*self.shift_month(offset))

    def year_of(self, year: int) -> _Span:
        return self.at(date(year, 1, 1)), self.at(date(year + 1, 1, 1))

    def hour_span(self, instant: datetime) -> _Span:
        local = instant.astimezone(self.tz).replace(minute=0, second=0, microsecond=0)
        end = (local.astimezone(timezone.utc) + timedelta(hours=1)).astimezone(self.tz)
        return local, end

    def hours_ago(self, count: int) -> datetime:
        return (self.now.astimezone(timezone.utc) - timedelta(hours=count)).astimezone(self.tz)

    def units_back(self, unit: str, count: int) -> date:
        """The date ``count`` units before today (months clamp the day to the month's end)."""
        if unit == "day":
            return self.today - timedelta(days=count)
        if unit == "week":
            return self.today - timedelta(weeks=count)
        years, months = (count, 0) if unit == "year" else divmod(count, 12)
        y, m = self.today.year - years, self.today.month - months
        if m < 1:
            y, m = y - 1, m + 12
        day = self.today.day
        while True:
            try:
                return date(y, m, day)
            except ValueError:
                day -= 1

    def ago(self, unit: str, count: int) -> _Span:
        if unit == "hour":
            return self.hour_span(self.hours_ago(count))
        if unit == "day":
            return self.day(-count)
        if unit == "week":
            return self.week(-count)
        if unit == "month":
            return self.month(-count)
        return self.year_of(self.today.year - count)

    def rolling(self, unit: str, count: int) -> _Span:
        if unit == "hour":
            return self.hour_span(self.hours_ago(count))[0], self.hour_span(self.now)[1]
        return self.at(self.units_back(unit, count)), self.at(self.today + timedelta(days=1))

    def recent_month_day(self, month: int, day: int | None, strictly_before: bool = False) -> _Span:
        """The most recent month (or month-day) not in the future (or before this month)."""
        year = self.today.year
        if day is None:
            if month > self.today.month or (strictly_before and month == self.today.month):
                year -= 1
            return self.month_of(year, month)
        if (month, day) > (self.today.month, self.today.day):
            year -= 1
        return self.days(date(year, month, day))


# ---- vocabularies ----------------------------------------------------------------------

_EN_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "a couple of": 2, "couple of": 2,
}
_CJK_DIGITS = {"〇": 0, "零": 0, "一": 1, "二": 2, "两": 2, "兩": 2, "三": 3, "四": 4,
               "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CJK_NUM = "[0-9〇零一二两兩三四五六七八九十百]+"
_CJK_YEAR = "(?:\\d{4}|[〇零一二三四五六七八九]{4})"
_EN_NUM = "(?:\\d+|" + "|".join(sorted(map(re.escape, _EN_NUMBERS), key=len, reverse=True)) + ")"


def _number(token: str) -> int:
    """Digits, an English number word or a CJK numeral as an int. Raises ValueError."""
    token = token.strip()
    if token.isdigit():
        return int(token)
    if token in _EN_NUMBERS:
        return _EN_NUMBERS[token]
    if not token or any(ch not in _CJK_DIGITS and ch not in "十百" for ch in token):
        raise ValueError(token)
    if "十" not in token and "百" not in token:
        return int("".join(str(_CJK_DIGITS[ch]) for ch in token))
    total, current = 0, 0
    for ch in token:
        if ch in _CJK_DIGITS:
            current = _CJK_DIGITS[ch]
        else:
            total += (current or 1) * (10 if ch == "十" else 100)
            current = 0
    return total + current


_DAY_WORDS: dict[str, int] = {
    "today": 0, "earlier today": 0, "yesterday": -1, "day before yesterday": -2,
    "tomorrow": 1, "day after tomorrow": 2,
    "今日": 0, "本日": 0, "きょう": 0, "昨日": -1, "きのう": -1, "一昨日": -2, "おととい": -2,
    "おとつい": -2, "一昨々日": -3, "一昨昨日": -3, "さきおととい": -3, "明日": 1, "あした": 1,
    "あす": 1, "明後日": 2, "あさって": 2,
    "今天": 0, "今儿": 0, "昨天": -1, "昨儿": -1, "前天": -2, "大前天": -3, "明天": 1,
    "后天": 2, "後天": 2,
}
# Parts of a day as [start hour, end hour) from the day's midnight (night runs past 24).
_DAY_PARTS: dict[str, tuple[int, int]] = {
    "morning": (5, 12), "noon": (11, 14), "afternoon": (12, 18), "evening": (17, 24), "night": (18, 30),
}
_PART_WORDS: dict[str, str] = {
    "morning": "morning", "afternoon": "afternoon", "evening": "evening", "night": "night",
    "朝": "morning", "午前": "morning", "昼": "noon", "午後": "afternoon", "夕方": "evening",
    "夜": "night", "晩": "night",
    "早上": "morning", "早晨": "morning", "上午": "morning", "中午": "noon", "下午": "afternoon",
    "傍晚": "evening", "晚上": "night", "夜里": "night", "夜裡": "night", "夜晚": "night",
}
_PART_SHORTCUTS: dict[str, tuple[int, str]] = {
    "this morning": (0, "morning"), "this afternoon": (0, "afternoon"),
    "this evening": (0, "evening"), "tonight": (0, "night"), "last night": (-1, "night"),
    "今朝": (0, "morning"), "今夜": (0, "night"), "今晩": (0, "night"), "昨夜": (-1, "night"),
    "昨晩": (-1, "night"), "ゆうべ": (-1, "night"), "夕べ": (-1, "night"),
    "今早": (0, "morning"), "今晨": (0, "morning"), "今晚": (0, "night"), "昨晚": (-1, "night"),
}
_WEEK_WORDS = {"今週": 0, "先週": -1, "先々週": -2, "先先週": -2, "来週": 1}
_MONTH_WORDS = {"今月": 0, "先月": -1, "先々月": -2, "先先月": -2, "来月": 1}
_YEAR_WORDS = {"今年": 0, "去年": -1, "昨年": -1, "一昨年": -2, "おととし": -2, "前年": -2,
               "大前年": -3, "来年": 1, "明年": 1}
_ZH_REL = {"上上": -2, "上": -1, "这": 0, "這": 0, "本": 0, "下": 1}
_EN_REL = {"this": 0, "last": -1, "previous": -1, "next": 1}
_EN_UNITS = {"hour": "hour", "hr": "hour", "day": "day", "week": "week", "month": "month", "year": "year"}
_JA_UNITS = {"時間": "hour", "日": "day", "日間": "day", "週間": "week", "週": "week", "ヶ月": "month",
             "か月": "month", "カ月": "month", "ケ月": "month", "箇月": "month", "ヵ月": "month",
             "年": "year", "年間": "year"}
_ZH_UNITS = {"小时": "hour", "小時": "hour", "个小时": "hour", "個小時": "hour", "天": "day",
             "日": "day", "周": "week", "週": "week", "星期": "week", "个星期": "week",
             "個星期": "week", "礼拜": "week", "个礼拜": "week", "禮拜": "week", "个月": "month",
             "個月": "month", "年": "year"}
_EN_MONTHS = {name: i + 1 for i, names in enumerate((
    ("january", "jan"), ("february", "feb"), ("march", "mar"), ("april", "apr"), ("may",),
    ("june", "jun"), ("july", "jul"), ("august", "aug"), ("september", "sep", "sept"),
    ("october", "oct"), ("november", "nov"), ("december", "dec"))) for name in names}
_EN_WEEKDAYS = {name: i for i, names in enumerate((
    ("monday", "mon"), ("tuesday", "tue", "tues"), ("wednesday", "wed"),
    ("thursday", "thu", "thur", "thurs"), ("friday", "fri"), ("saturday", "sat"),
    ("sunday", "sun"))) for name in names}
_JA_WEEKDAYS = {ch: i for i, ch in enumerate("月火水木金土日")}
_ZH_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6, "七": 6}

_LEAD_WORDS = re.compile(r"^(?:(?:in|on|during|over|at|around|about|for|of|the|back in)\s+)+")
_TRAIL_PARTICLES = ("のとき", "の時", "の頃", "の間", "頃", "ごろ", "ころ", "くらい", "ぐらい",
                    "の", "に", "は", "で", "的时候", "的時候", "那天", "那时", "左右", "的")


def _alt(words: Iterable[str]) -> str:
    return "|".join(sorted(map(re.escape, words), key=len, reverse=True))


# ---- rules ------------------------------------------------------------------------------

_Rule = tuple[re.Pattern[str], Callable[[re.Match[str], _Clock], _Span | None]]
_RULES: list[_Rule] = []


def _rule(pattern: str) -> Callable[[Callable[[re.Match[str], _Clock], _Span | None]], Callable[[re.Match[str], _Clock], _Span | None]]:
    def register(fn: Callable[[re.Match[str], _Clock], _Span | None]) -> Callable[[re.Match[str], _Clock], _Span | None]:
        _RULES.append((re.compile(pattern), fn))
        return fn
    return register


@_rule(r"(\d{4})")
def _iso_year(m: re.Match[str], c: _Clock) -> _Span:
    return c.year_of(int(m[1]))


@_rule(r"(\d{4})-(\d{1,2})")
def _iso_month(m: re.Match[str], c: _Clock) -> _Span:
    return c.month_of(int(m[1]), int(m[2]))


@_rule(r"(\d{4})-(\d{1,2})-(\d{1,2})")
def _iso_day(m: re.Match[str], c: _Clock) -> _Span:
    return c.days(date(int(m[1]), int(m[2]), int(m[3])))


@_rule(r"(\d{4})-(\d{1,2})-(\d{1,2})[t ](\d{1,2})")
def _iso_hour(m: re.Match[str], c: _Clock) -> _Span:
    hour = int(m[4])
    if hour > 23:
        raise ValueError("hour out of range")
    return c.hour_span(datetime(int(m[1]), int(m[2]), int(m[3]), hour, tzinfo=c.tz))


@_rule(r"(\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:z|[+-]\d{2}(?::?\d{2})?)?)")
def _iso_timestamp(m: re.Match[str], c: _Clock) -> _Span:
    stamp = datetime.fromisoformat(m[1].upper().replace(",", "."))
    return c.hour_span(_aware(stamp, c.tz))


@_rule(r"(\d{4})-?w(\d{1,2})")
def _iso_week(m: re.Match[str], c: _Clock) -> _Span:
    return c.days(date.fromisocalendar(int(m[1]), int(m[2]), 1), 7)


@_rule(f"({_alt(_DAY_WORDS)})")
def _day_word(m: re.Match[str], c: _Clock) -> _Span:
    return c.day(_DAY_WORDS[m[1]])


@_rule(f"({_alt(_PART_SHORTCUTS)})")
def _part_shortcut(m: re.Match[str], c: _Clock) -> _Span:
    offset, part = _PART_SHORTCUTS[m[1]]
    return _part_of(c, c.today + timedelta(days=offset), part)


@_rule(f"({_alt(_DAY_WORDS)}) ?の? ?({_alt(_PART_WORDS)})")
def _day_part(m: re.Match[str], c: _Clock) -> _Span:
    return _part_of(c, c.today + timedelta(days=_DAY_WORDS[m[1]]), _PART_WORDS[m[2]])


def _part_of(c: _Clock, day: date, part: str) -> _Span:
    first, last = _DAY_PARTS[part]
    return c.at(day, first), c.at(day, last)


# English calendar periods.
@_rule(r"(this|last|previous|next|earlier this) (week|month|year|weekend)")
def _en_period(m: re.Match[str], c: _Clock) -> _Span:
    offset = 0 if m[1] == "earlier this" else _EN_REL[m[1]]
    return _period(c, m[2], offset)


@_rule(r"(week|month|year|weekend) before last")
def _en_before_last(m: re.Match[str], c: _Clock) -> _Span:
    return _period(c, m[1], -2)


@_rule(r"(?:week ?end)")
def _en_weekend(m: re.Match[str], c: _Clock) -> _Span:
    return _latest_weekend(c)


def _period(c: _Clock, unit: str, offset: int) -> _Span:
    if unit == "week":
        return c.week(offset)
    if unit == "weekend":
        return c.weekend(offset)
    if unit == "month":
        return c.month(offset)
    return c.year_of(c.today.year + offset)


def _latest_weekend(c: _Clock) -> _Span:
    return c.weekend(0 if c.today.weekday() >= 5 else -1)


@_rule(f"({_EN_NUM}) ({_alt(_EN_UNITS)})s? ago")
def _en_ago(m: re.Match[str], c: _Clock) -> _Span:
    return c.ago(_EN_UNITS[m[2]], _number(m[1]))


@_rule(f"(?:past|last|previous) (?:({_EN_NUM}) )?({_alt(_EN_UNITS)})s?")
def _en_rolling(m: re.Match[str], c: _Clock) -> _Span | None:
    # "last week/month/year" without a number are calendar periods (matched earlier).
    return c.rolling(_EN_UNITS[m[2]], _number(m[1]) if m[1] else 1)


_EN_MONTH_ALT = _alt(_EN_MONTHS)
_ORD = r"(\d{1,2})(?:st|nd|rd|th)?"


@_rule(f"(last|this|next)? ?({_EN_MONTH_ALT})")
def _en_month(m: re.Match[str], c: _Clock) -> _Span:
    month = _EN_MONTHS[m[2]]
    if m[1] == "this":
        return c.month_of(c.today.year, month)
    if m[1] == "next":
        year = c.today.year if month > c.today.month else c.today.year + 1
        return c.month_of(year, month)
    return c.recent_month_day(month, None, strictly_before=m[1] == "last")


@_rule(f"({_EN_MONTH_ALT}),? (\\d{{4}})")
def _en_month_year(m: re.Match[str], c: _Clock) -> _Span:
    return c.month_of(int(m[2]), _EN_MONTHS[m[1]])


@_rule(f"({_EN_MONTH_ALT}) {_ORD}(?:,? (\\d{{4}}))?")
def _en_month_day(m: re.Match[str], c: _Clock) -> _Span:
    return _month_day(c, _EN_MONTHS[m[1]], int(m[2]), m[3])


@_rule(f"{_ORD} (?:of )?({_EN_MONTH_ALT})(?:,? (\\d{{4}}))?")
def _en_day_month(m: re.Match[str], c: _Clock) -> _Span:
    return _month_day(c, _EN_MONTHS[m[2]], int(m[1]), m[3])


def _month_day(c: _Clock, month: int, day: int, year: str | None) -> _Span:
    if year:
        return c.days(date(int(year), month, day))
    return c.recent_month_day(month, day)


@_rule(f"(last|this|next)? ?({_alt(_EN_WEEKDAYS)})")
def _en_weekday(m: re.Match[str], c: _Clock) -> _Span:
    wd = _EN_WEEKDAYS[m[2]]
    if m[1] == "this":
        return c.days(c.monday(0) + timedelta(days=wd))
    if m[1] == "next":
        return c.days(c.monday(1) + timedelta(days=wd))
    back = (c.today.weekday() - wd) % 7
    if m[1] == "last" and back == 0:
        back = 7
    return c.days(c.today - timedelta(days=back))


# Japanese calendar periods.
@_rule(f"({_alt(_WEEK_WORDS)})")
def _ja_week(m: re.Match[str], c: _Clock) -> _Span:
    return c.week(_WEEK_WORDS[m[1]])


@_rule(f"({_alt(_WEEK_WORDS)})末")
def _ja_weekend(m: re.Match[str], c: _Clock) -> _Span:
    return c.weekend(_WEEK_WORDS[m[1]])


@_rule(r"(?:週末|周末)")
def _cjk_weekend(m: re.Match[str], c: _Clock) -> _Span:
    return _latest_weekend(c)


@_rule(f"({_alt(_MONTH_WORDS)})")
def _ja_month(m: re.Match[str], c: _Clock) -> _Span:
    return c.month(_MONTH_WORDS[m[1]])


@_rule(f"({_alt(_YEAR_WORDS)})")
def _cjk_year(m: re.Match[str], c: _Clock) -> _Span:
    return c.year_of(c.today.year + _YEAR_WORDS[m[1]])


@_rule(f"({_CJK_NUM}) ?({_alt(_JA_UNITS)})前")
def _ja_ago(m: re.Match[str], c: _Clock) -> _Span:
    return c.ago(_JA_UNITS[m[2]], _number(m[1]))


@_rule(f"(?:過去|ここ|最近|この) ?({_CJK_NUM}) ?({_alt(_JA_UNITS)})間?")
def _ja_rolling(m: re.Match[str], c: _Clock) -> _Span:
    return c.rolling(_JA_UNITS[m[2]], _number(m[1]))


@_rule(f"({_alt(_WEEK_WORDS)})?の?([月火水木金土日])曜日?")
def _ja_weekday(m: re.Match[str], c: _Clock) -> _Span:
    return _weekday_in(c, _JA_WEEKDAYS[m[2]], _WEEK_WORDS[m[1]] if m[1] else None)


def _weekday_in(c: _Clock, wd: int, week_offset: int | None) -> _Span:
    if week_offset is None:
        return c.days(c.today - timedelta(days=(c.today.weekday() - wd) % 7))
    return c.days(c.monday(week_offset) + timedelta(days=wd))


# Chinese calendar periods.
_ZH_WEEK = "(?:周|週|星期|礼拜|禮拜)"


@_rule(f"({_alt(_ZH_REL)})(?:个|個)?{_ZH_WEEK}")
def _zh_week(m: re.Match[str], c: _Clock) -> _Span:
    return c.week(_ZH_REL[m[1]])


@_rule(f"({_alt(_ZH_REL)})(?:个|個)?(?:周末|週末)")
def _zh_weekend(m: re.Match[str], c: _Clock) -> _Span:
    return c.weekend(_ZH_REL[m[1]])


@_rule(f"({_alt(_ZH_REL)})(?:个|個)?月")
def _zh_month(m: re.Match[str], c: _Clock) -> _Span:
    return c.month(_ZH_REL[m[1]])


@_rule(f"({_CJK_NUM}) ?({_alt(_ZH_UNITS)})(?:以)?前")
def _zh_ago(m: re.Match[str], c: _Clock) -> _Span:
    return c.ago(_ZH_UNITS[m[2]], _number(m[1]))


@_rule(f"(?:最近|过去|過去|近|这|這) ?({_CJK_NUM}) ?({_alt(_ZH_UNITS)})(?:里|裡|内|內|以来)?")
def _zh_rolling(m: re.Match[str], c: _Clock) -> _Span:
    return c.rolling(_ZH_UNITS[m[2]], _number(m[1]))


@_rule(f"({_alt(_ZH_REL)})?(?:个|個)?{_ZH_WEEK}([一二三四五六日天七])")
def _zh_weekday(m: re.Match[str], c: _Clock) -> _Span:
    return _weekday_in(c, _ZH_WEEKDAYS[m[2]], _ZH_REL[m[1]] if m[1] else None)


# CJK dates: 2025年3月5日, 3月5号, 去年の3月, 今月5日, 2025年.
@_rule(f"(?:({_alt(_YEAR_WORDS)})の?|({_CJK_YEAR}) ?年)? ?({_CJK_NUM}) ?月(?: ?({_CJK_NUM}) ?[日号號])?")
def _cjk_month_day(m: re.Match[str], c: _Clock) -> _Span:
    month = _number(m[3])
    day = _number(m[4]) if m[4] else None
    if m[1] or m[2]:
        year = c.today.year + _YEAR_WORDS[m[1]] if m[1] else _number(m[2])
        return c.month_of(year, month) if day is None else c.days(date(year, month, day))
    return c.recent_month_day(month, day)


@_rule(f"({_CJK_YEAR}) ?年")
def _cjk_year_number(m: re.Match[str], c: _Clock) -> _Span:
    return c.year_of(_number(m[1]))


@_rule(f"({_alt(_MONTH_WORDS)}|(?:{_alt(_ZH_REL)})(?:个|個)?月)の? ?({_CJK_NUM}) ?[日号號]")
def _cjk_day_of_month(m: re.Match[str], c: _Clock) -> _Span:
    word = m[1]
    if word in _MONTH_WORDS:
        offset = _MONTH_WORDS[word]
    else:
        offset = _ZH_REL[re.match(_alt(_ZH_REL), word)[0]]  # type: ignore[index]
    year, month = c.shift_month(offset)
    return c.days(date(year, month, _number(m[2])))


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


def _parse_spec(raw: str, c: _Clock) -> _Span | None:
    text = raw.casefold()
    for sep in _STRICT_SEPARATORS:
        if sep in text:
            parts = text.split(sep)
            if len(parts) != 2:
                return None
            return _union(_single(parts[0], c), _single(parts[1], c))
    single = _single(text, c)
    if single is not None:
        return single
    for pattern in _LOOSE_RANGES:
        m = pattern.fullmatch(text)
        if m:
            found = _union(_single(m[1], c), _single(m[2], c))
            if found is not None:
                return found
    for pattern in _OPEN_RANGES:
        m = pattern.fullmatch(text)
        if m:
            first = _single(m[1], c)
            if first is not None:
                return first[0], max(first[1], c.at(c.today + timedelta(days=1)))
    return None


def _union(a: _Span | None, b: _Span | None) -> _Span | None:
    if a is None or b is None:
        return None
    return min(a[0], b[0]), max(a[1], b[1])


def _single(text: str, c: _Clock) -> _Span | None:
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
