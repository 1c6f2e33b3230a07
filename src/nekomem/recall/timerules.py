"""The vocabularies and rules of time expressions (English, Japanese, Chinese): each rule
is a regular expression over the normalised, case-folded text and a function that turns
its match into a span (see :mod:`nekomem.recall.timewindow` for the grammar)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import date, datetime, timedelta

from nekomem.recall.timecalendar import Calendar, Span, aware

# ---- vocabularies ----------------------------------------------------------------------

_EN_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a couple of": 2,
    "couple of": 2,
}
_CJK_DIGITS = {"〇": 0, "零": 0, "一": 1, "二": 2, "两": 2, "兩": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
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
    "today": 0,
    "earlier today": 0,
    "yesterday": -1,
    "day before yesterday": -2,
    "tomorrow": 1,
    "day after tomorrow": 2,
    "今日": 0,
    "本日": 0,
    "きょう": 0,
    "昨日": -1,
    "きのう": -1,
    "一昨日": -2,
    "おととい": -2,
    "おとつい": -2,
    "一昨々日": -3,
    "一昨昨日": -3,
    "さきおととい": -3,
    "明日": 1,
    "あした": 1,
    "あす": 1,
    "明後日": 2,
    "あさって": 2,
    "今天": 0,
    "今儿": 0,
    "昨天": -1,
    "昨儿": -1,
    "前天": -2,
    "大前天": -3,
    "明天": 1,
    "后天": 2,
    "後天": 2,
}
# Parts of a day as [start hour, end hour) from the day's midnight (night runs past 24).
_DAY_PARTS: dict[str, tuple[int, int]] = {
    "morning": (5, 12),
    "noon": (11, 14),
    "afternoon": (12, 18),
    "evening": (17, 24),
    "night": (18, 30),
}
_PART_WORDS: dict[str, str] = {
    "morning": "morning",
    "afternoon": "afternoon",
    "evening": "evening",
    "night": "night",
    "朝": "morning",
    "午前": "morning",
    "昼": "noon",
    "午後": "afternoon",
    "夕方": "evening",
    "夜": "night",
    "晩": "night",
    "早上": "morning",
    "早晨": "morning",
    "上午": "morning",
    "中午": "noon",
    "下午": "afternoon",
    "傍晚": "evening",
    "晚上": "night",
    "夜里": "night",
    "夜裡": "night",
    "夜晚": "night",
}
_PART_SHORTCUTS: dict[str, tuple[int, str]] = {
    "this morning": (0, "morning"),
    "this afternoon": (0, "afternoon"),
    "this evening": (0, "evening"),
    "tonight": (0, "night"),
    "last night": (-1, "night"),
    "今朝": (0, "morning"),
    "今夜": (0, "night"),
    "今晩": (0, "night"),
    "昨夜": (-1, "night"),
    "昨晩": (-1, "night"),
    "ゆうべ": (-1, "night"),
    "夕べ": (-1, "night"),
    "今早": (0, "morning"),
    "今晨": (0, "morning"),
    "今晚": (0, "night"),
    "昨晚": (-1, "night"),
}
_WEEK_WORDS = {"今週": 0, "先週": -1, "先々週": -2, "先先週": -2, "来週": 1}
_MONTH_WORDS = {"今月": 0, "先月": -1, "先々月": -2, "先先月": -2, "来月": 1}
_YEAR_WORDS = {"今年": 0, "去年": -1, "昨年": -1, "一昨年": -2, "おととし": -2, "前年": -2, "大前年": -3, "来年": 1, "明年": 1}
_ZH_REL = {"上上": -2, "上": -1, "这": 0, "這": 0, "本": 0, "下": 1}
_EN_REL = {"this": 0, "last": -1, "previous": -1, "next": 1}
_EN_UNITS = {"hour": "hour", "hr": "hour", "day": "day", "week": "week", "month": "month", "year": "year"}
_JA_UNITS = {
    "時間": "hour",
    "日": "day",
    "日間": "day",
    "週間": "week",
    "週": "week",
    "ヶ月": "month",
    "か月": "month",
    "カ月": "month",
    "ケ月": "month",
    "箇月": "month",
    "ヵ月": "month",
    "年": "year",
    "年間": "year",
}
_ZH_UNITS = {
    "小时": "hour",
    "小時": "hour",
    "个小时": "hour",
    "個小時": "hour",
    "天": "day",
    "日": "day",
    "周": "week",
    "週": "week",
    "星期": "week",
    "个星期": "week",
    "個星期": "week",
    "礼拜": "week",
    "个礼拜": "week",
    "禮拜": "week",
    "个月": "month",
    "個月": "month",
    "年": "year",
}
_EN_MONTHS = {
    name: i + 1
    for i, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        )
    )
    for name in names
}
_EN_WEEKDAYS = {
    name: i
    for i, names in enumerate(
        (
            ("monday", "mon"),
            ("tuesday", "tue", "tues"),
            ("wednesday", "wed"),
            ("thursday", "thu", "thur", "thurs"),
            ("friday", "fri"),
            ("saturday", "sat"),
            ("sunday", "sun"),
        )
    )
    for name in names
}
_JA_WEEKDAYS = {ch: i for i, ch in enumerate("月火水木金土日")}
_ZH_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6, "七": 6}

_LEAD_WORDS = re.compile(r"^(?:(?:in|on|during|over|at|around|about|for|of|the|back in)\s+)+")
_TRAIL_PARTICLES = (
    "のとき",
    "の時",
    "の頃",
    "の間",
    "頃",
    "ごろ",
    "ころ",
    "くらい",
    "ぐらい",
    "の",
    "に",
    "は",
    "で",
    "的时候",
    "的時候",
    "那天",
    "那时",
    "左右",
    "的",
)


def _alt(words: Iterable[str]) -> str:
    return "|".join(sorted(map(re.escape, words), key=len, reverse=True))


# ---- rules ------------------------------------------------------------------------------

_Rule = tuple[re.Pattern[str], Callable[[re.Match[str], Calendar], Span | None]]
_RULES: list[_Rule] = []


def _rule(pattern: str) -> Callable[[Callable[[re.Match[str], Calendar], Span | None]], Callable[[re.Match[str], Calendar], Span | None]]:
    def register(fn: Callable[[re.Match[str], Calendar], Span | None]) -> Callable[[re.Match[str], Calendar], Span | None]:
        _RULES.append((re.compile(pattern), fn))
        return fn

    return register


@_rule(r"(\d{4})")
def _iso_year(m: re.Match[str], c: Calendar) -> Span:
    return c.year_of(int(m[1]))


@_rule(r"(\d{4})-(\d{1,2})")
def _iso_month(m: re.Match[str], c: Calendar) -> Span:
    return c.month_of(int(m[1]), int(m[2]))


@_rule(r"(\d{4})-(\d{1,2})-(\d{1,2})")
def _iso_day(m: re.Match[str], c: Calendar) -> Span:
    return c.days(date(int(m[1]), int(m[2]), int(m[3])))


@_rule(r"(\d{4})-(\d{1,2})-(\d{1,2})[t ](\d{1,2})")
def _iso_hour(m: re.Match[str], c: Calendar) -> Span:
    hour = int(m[4])
    if hour > 23:
        raise ValueError("hour out of range")
    return c.hour_span(datetime(int(m[1]), int(m[2]), int(m[3]), hour, tzinfo=c.tz))


@_rule(r"(\d{4}-\d{2}-\d{2}[t ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:z|[+-]\d{2}(?::?\d{2})?)?)")
def _iso_timestamp(m: re.Match[str], c: Calendar) -> Span:
    stamp = datetime.fromisoformat(m[1].upper().replace(",", "."))
    return c.hour_span(aware(stamp, c.tz))


@_rule(r"(\d{4})-?w(\d{1,2})")
def _iso_week(m: re.Match[str], c: Calendar) -> Span:
    return c.days(date.fromisocalendar(int(m[1]), int(m[2]), 1), 7)


@_rule(f"({_alt(_DAY_WORDS)})")
def _day_word(m: re.Match[str], c: Calendar) -> Span:
    return c.day(_DAY_WORDS[m[1]])


@_rule(f"({_alt(_PART_SHORTCUTS)})")
def _part_shortcut(m: re.Match[str], c: Calendar) -> Span:
    offset, part = _PART_SHORTCUTS[m[1]]
    return _part_of(c, c.today + timedelta(days=offset), part)


@_rule(f"({_alt(_DAY_WORDS)}) ?の? ?({_alt(_PART_WORDS)})")
def _day_part(m: re.Match[str], c: Calendar) -> Span:
    return _part_of(c, c.today + timedelta(days=_DAY_WORDS[m[1]]), _PART_WORDS[m[2]])


def _part_of(c: Calendar, day: date, part: str) -> Span:
    first, last = _DAY_PARTS[part]
    return c.at(day, first), c.at(day, last)


# English calendar periods.
@_rule(r"(this|last|previous|next|earlier this) (week|month|year|weekend)")
def _en_period(m: re.Match[str], c: Calendar) -> Span:
    offset = 0 if m[1] == "earlier this" else _EN_REL[m[1]]
    return _period(c, m[2], offset)


@_rule(r"(week|month|year|weekend) before last")
def _en_before_last(m: re.Match[str], c: Calendar) -> Span:
    return _period(c, m[1], -2)


@_rule(r"(?:week ?end)")
def _en_weekend(m: re.Match[str], c: Calendar) -> Span:
    return _latest_weekend(c)


def _period(c: Calendar, unit: str, offset: int) -> Span:
    if unit == "week":
        return c.week(offset)
    if unit == "weekend":
        return c.weekend(offset)
    if unit == "month":
        return c.month(offset)
    return c.year_of(c.today.year + offset)


def _latest_weekend(c: Calendar) -> Span:
    return c.weekend(0 if c.today.weekday() >= 5 else -1)


@_rule(f"({_EN_NUM}) ({_alt(_EN_UNITS)})s? ago")
def _en_ago(m: re.Match[str], c: Calendar) -> Span:
    return c.ago(_EN_UNITS[m[2]], _number(m[1]))


@_rule(f"(?:past|last|previous) (?:({_EN_NUM}) )?({_alt(_EN_UNITS)})s?")
def _en_rolling(m: re.Match[str], c: Calendar) -> Span | None:
    # "last week/month/year" without a number are calendar periods (matched earlier).
    return c.rolling(_EN_UNITS[m[2]], _number(m[1]) if m[1] else 1)


_EN_MONTH_ALT = _alt(_EN_MONTHS)
_ORD = r"(\d{1,2})(?:st|nd|rd|th)?"
# Before a year: a space, a comma and a space, or a bare comma ("December 1,2023").
_YEAR_SEP = r"(?:,? |,)"


@_rule(f"(last|this|next)? ?({_EN_MONTH_ALT})")
def _en_month(m: re.Match[str], c: Calendar) -> Span:
    month = _EN_MONTHS[m[2]]
    if m[1] == "this":
        return c.month_of(c.today.year, month)
    if m[1] == "next":
        year = c.today.year if month > c.today.month else c.today.year + 1
        return c.month_of(year, month)
    return c.recent_month_day(month, None, strictly_before=m[1] == "last")


@_rule(f"({_EN_MONTH_ALT}){_YEAR_SEP}(\\d{{4}})")
def _en_month_year(m: re.Match[str], c: Calendar) -> Span:
    return c.month_of(int(m[2]), _EN_MONTHS[m[1]])


@_rule(f"({_EN_MONTH_ALT}) {_ORD}(?:{_YEAR_SEP}(\\d{{4}}))?")
def _en_month_day(m: re.Match[str], c: Calendar) -> Span:
    return _month_day(c, _EN_MONTHS[m[1]], int(m[2]), m[3])


@_rule(f"{_ORD} (?:of )?({_EN_MONTH_ALT})(?:{_YEAR_SEP}(\\d{{4}}))?")
def _en_day_month(m: re.Match[str], c: Calendar) -> Span:
    return _month_day(c, _EN_MONTHS[m[2]], int(m[1]), m[3])


_DAY_RANGE_SEP = r" ?(?:-|–|to|and|through|thru|until|till) ?"


@_rule(f"(?:between |from )?({_EN_MONTH_ALT}) {_ORD}{_DAY_RANGE_SEP}{_ORD}(?:{_YEAR_SEP}(\\d{{4}}))?")
def _en_month_day_range(m: re.Match[str], c: Calendar) -> Span:
    return _day_range(c, _EN_MONTHS[m[1]], int(m[2]), int(m[3]), m[4])


@_rule(f"(?:between |from )?{_ORD}{_DAY_RANGE_SEP}{_ORD} (?:of )?({_EN_MONTH_ALT})(?:{_YEAR_SEP}(\\d{{4}}))?")
def _en_day_range_month(m: re.Match[str], c: Calendar) -> Span:
    return _day_range(c, _EN_MONTHS[m[3]], int(m[1]), int(m[2]), m[4])


def _day_range(c: Calendar, month: int, first: int, last: int, year: str | None) -> Span:
    """Days ``first`` to ``last`` (both included) of one month ("August 11-15, 2023"); without
    a year, of the most recent such month whose first day is not in the future."""
    if last < first:
        raise ValueError("a day range runs backwards")
    start = c.days(date(int(year), month, first))[0] if year else c.recent_month_day(month, first)[0]
    return start, c.days(date(start.year, month, last))[1]


def _month_day(c: Calendar, month: int, day: int, year: str | None) -> Span:
    if year:
        return c.days(date(int(year), month, day))
    return c.recent_month_day(month, day)


@_rule(f"(last|this|next)? ?({_alt(_EN_WEEKDAYS)})")
def _en_weekday(m: re.Match[str], c: Calendar) -> Span:
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
def _ja_week(m: re.Match[str], c: Calendar) -> Span:
    return c.week(_WEEK_WORDS[m[1]])


@_rule(f"({_alt(_WEEK_WORDS)})末")
def _ja_weekend(m: re.Match[str], c: Calendar) -> Span:
    return c.weekend(_WEEK_WORDS[m[1]])


@_rule(r"(?:週末|周末)")
def _cjk_weekend(m: re.Match[str], c: Calendar) -> Span:
    return _latest_weekend(c)


@_rule(f"({_alt(_MONTH_WORDS)})")
def _ja_month(m: re.Match[str], c: Calendar) -> Span:
    return c.month(_MONTH_WORDS[m[1]])


@_rule(f"({_alt(_YEAR_WORDS)})")
def _cjk_year(m: re.Match[str], c: Calendar) -> Span:
    return c.year_of(c.today.year + _YEAR_WORDS[m[1]])


@_rule(f"({_CJK_NUM}) ?({_alt(_JA_UNITS)})前")
def _ja_ago(m: re.Match[str], c: Calendar) -> Span:
    return c.ago(_JA_UNITS[m[2]], _number(m[1]))


@_rule(f"(?:過去|ここ|最近|この) ?({_CJK_NUM}) ?({_alt(_JA_UNITS)})間?")
def _ja_rolling(m: re.Match[str], c: Calendar) -> Span:
    return c.rolling(_JA_UNITS[m[2]], _number(m[1]))


@_rule(f"({_alt(_WEEK_WORDS)})?の?([月火水木金土日])曜日?")
def _ja_weekday(m: re.Match[str], c: Calendar) -> Span:
    return _weekday_in(c, _JA_WEEKDAYS[m[2]], _WEEK_WORDS[m[1]] if m[1] else None)


def _weekday_in(c: Calendar, wd: int, week_offset: int | None) -> Span:
    if week_offset is None:
        return c.days(c.today - timedelta(days=(c.today.weekday() - wd) % 7))
    return c.days(c.monday(week_offset) + timedelta(days=wd))


# Chinese calendar periods.
_ZH_WEEK = "(?:周|週|星期|礼拜|禮拜)"


@_rule(f"({_alt(_ZH_REL)})(?:个|個)?{_ZH_WEEK}")
def _zh_week(m: re.Match[str], c: Calendar) -> Span:
    return c.week(_ZH_REL[m[1]])


@_rule(f"({_alt(_ZH_REL)})(?:个|個)?(?:周末|週末)")
def _zh_weekend(m: re.Match[str], c: Calendar) -> Span:
    return c.weekend(_ZH_REL[m[1]])


@_rule(f"({_alt(_ZH_REL)})(?:个|個)?月")
def _zh_month(m: re.Match[str], c: Calendar) -> Span:
    return c.month(_ZH_REL[m[1]])


@_rule(f"({_CJK_NUM}) ?({_alt(_ZH_UNITS)})(?:以)?前")
def _zh_ago(m: re.Match[str], c: Calendar) -> Span:
    return c.ago(_ZH_UNITS[m[2]], _number(m[1]))


@_rule(f"(?:最近|过去|過去|近|这|這) ?({_CJK_NUM}) ?({_alt(_ZH_UNITS)})(?:里|裡|内|內|以来)?")
def _zh_rolling(m: re.Match[str], c: Calendar) -> Span:
    return c.rolling(_ZH_UNITS[m[2]], _number(m[1]))


@_rule(f"({_alt(_ZH_REL)})?(?:个|個)?{_ZH_WEEK}([一二三四五六日天七])")
def _zh_weekday(m: re.Match[str], c: Calendar) -> Span:
    return _weekday_in(c, _ZH_WEEKDAYS[m[2]], _ZH_REL[m[1]] if m[1] else None)


# CJK dates: 2025年3月5日, 3月5号, 去年の3月, 今月5日, 2025年.
@_rule(f"(?:({_alt(_YEAR_WORDS)})の?|({_CJK_YEAR}) ?年)? ?({_CJK_NUM}) ?月(?: ?({_CJK_NUM}) ?[日号號])?")
def _cjk_month_day(m: re.Match[str], c: Calendar) -> Span:
    month = _number(m[3])
    day = _number(m[4]) if m[4] else None
    if m[1] or m[2]:
        year = c.today.year + _YEAR_WORDS[m[1]] if m[1] else _number(m[2])
        return c.month_of(year, month) if day is None else c.days(date(year, month, day))
    return c.recent_month_day(month, day)


@_rule(f"({_CJK_YEAR}) ?年")
def _cjk_year_number(m: re.Match[str], c: Calendar) -> Span:
    return c.year_of(_number(m[1]))


@_rule(f"({_alt(_MONTH_WORDS)}|(?:{_alt(_ZH_REL)})(?:个|個)?月)の? ?({_CJK_NUM}) ?[日号號]")
def _cjk_day_of_month(m: re.Match[str], c: Calendar) -> Span:
    word = m[1]
    if word in _MONTH_WORDS:
        offset = _MONTH_WORDS[word]
    else:
        offset = _ZH_REL[re.match(_alt(_ZH_REL), word)[0]]  # type: ignore[index]
    year, month = c.shift_month(offset)
    return c.days(date(year, month, _number(m[2])))
