"""Time expressions on a fixed clock (Tuesday 2026-12-01 10:00, in UTC and in Asia/Tokyo)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from nekomem.recall.timewindow import TimeWindow, distance_to_window, parse_time_window, proximity_key

ZONES = [timezone.utc, ZoneInfo("Asia/Tokyo")]


def at(text: str, tz: object) -> datetime:
    """'2026-11-30' or '2026-11-30T18' as an aware wall-clock time in ``tz``."""
    day, _, hour = text.partition("T")
    y, m, d = map(int, day.split("-"))
    return datetime(y, m, d, int(hour or 0), tzinfo=tz)  # type: ignore[arg-type]


# (expression, start, end exclusive) with now = Tuesday 2026-12-01 10:00 local.
EXPECTED = [
    # ISO
    ("2026-05-01T14", "2026-05-01T14", "2026-05-01T15"),
    ("2026-05-01 14", "2026-05-01T14", "2026-05-01T15"),
    ("2026-05-01", "2026-05-01", "2026-05-02"),
    ("2026-05", "2026-05-01", "2026-06-01"),
    ("2026", "2026-01-01", "2027-01-01"),
    ("2026-05-01T14:35:10", "2026-05-01T14", "2026-05-01T15"),
    ("2026-W18", "2026-04-27", "2026-05-04"),
    ("2026-05-01/2026-05-07", "2026-05-01", "2026-05-08"),
    ("2026-05-07/2026-05-01", "2026-05-01", "2026-05-08"),
    ("2026-05-01..2026-05-07", "2026-05-01", "2026-05-08"),
    ("2026-05-01T09/2026-05-01T18", "2026-05-01T09", "2026-05-01T19"),
    ("2026-04..2026-05-03", "2026-04-01", "2026-05-04"),
    ("２０２６－０５－０１", "2026-05-01", "2026-05-02"),
    # English
    ("today", "2026-12-01", "2026-12-02"),
    ("Today?", "2026-12-01", "2026-12-02"),
    ("earlier today", "2026-12-01", "2026-12-02"),
    ("yesterday", "2026-11-30", "2026-12-01"),
    ("the day before yesterday", "2026-11-29", "2026-11-30"),
    ("day before yesterday", "2026-11-29", "2026-11-30"),
    ("tomorrow", "2026-12-02", "2026-12-03"),
    ("this morning", "2026-12-01T05", "2026-12-01T12"),
    ("this afternoon", "2026-12-01T12", "2026-12-01T18"),
    ("tonight", "2026-12-01T18", "2026-12-02T06"),
    ("last night", "2026-11-30T18", "2026-12-01T06"),
    ("yesterday evening", "2026-11-30T17", "2026-12-01"),
    ("this week", "2026-11-30", "2026-12-07"),
    ("earlier this week", "2026-11-30", "2026-12-07"),
    ("last week", "2026-11-23", "2026-11-30"),
    ("the previous week", "2026-11-23", "2026-11-30"),
    ("during last week", "2026-11-23", "2026-11-30"),
    ("the week before last", "2026-11-16", "2026-11-23"),
    ("next week", "2026-12-07", "2026-12-14"),
    ("this month", "2026-12-01", "2027-01-01"),
    ("last month", "2026-11-01", "2026-12-01"),
    ("the month before last", "2026-10-01", "2026-11-01"),
    ("this year", "2026-01-01", "2027-01-01"),
    ("last year", "2025-01-01", "2026-01-01"),
    ("last weekend", "2026-11-28", "2026-11-30"),
    ("over the weekend", "2026-11-28", "2026-11-30"),
    ("this weekend", "2026-12-05", "2026-12-07"),
    ("in March", "2026-03-01", "2026-04-01"),
    ("march", "2026-03-01", "2026-04-01"),
    ("in December", "2026-12-01", "2027-01-01"),
    ("last December", "2025-12-01", "2026-01-01"),
    ("March 2025", "2025-03-01", "2025-04-01"),
    ("March 5th", "2026-03-05", "2026-03-06"),
    ("on the 5th of March", "2026-03-05", "2026-03-06"),
    ("December 25", "2025-12-25", "2025-12-26"),
    ("march 5, 2024", "2024-03-05", "2024-03-06"),
    ("3 days ago", "2026-11-28", "2026-11-29"),
    ("three days ago", "2026-11-28", "2026-11-29"),
    ("a couple of days ago", "2026-11-29", "2026-11-30"),
    ("a week ago", "2026-11-23", "2026-11-30"),
    ("2 weeks ago", "2026-11-16", "2026-11-23"),
    ("2 months ago", "2026-10-01", "2026-11-01"),
    ("a year ago", "2025-01-01", "2026-01-01"),
    ("3 hours ago", "2026-12-01T07", "2026-12-01T08"),
    ("past 3 days", "2026-11-28", "2026-12-02"),
    ("the past week", "2026-11-24", "2026-12-02"),
    ("last 2 months", "2026-10-01", "2026-12-02"),
    ("monday", "2026-11-30", "2026-12-01"),
    ("on Tuesday", "2026-12-01", "2026-12-02"),
    ("friday", "2026-11-27", "2026-11-28"),
    ("last tuesday", "2026-11-24", "2026-11-25"),
    ("this friday", "2026-12-04", "2026-12-05"),
    ("from yesterday to today", "2026-11-30", "2026-12-02"),
    ("between 2026-05-01 and 2026-05-03", "2026-05-01", "2026-05-04"),
    ("since last week", "2026-11-23", "2026-12-02"),
    # English: a range end without a year takes the other end's year.
    ("between August 11 and August 15 2023", "2023-08-11", "2023-08-16"),
    ("from August 11 2023 to August 15", "2023-08-11", "2023-08-16"),
    ("between December 20 and January 5 2024", "2023-12-20", "2024-01-06"),
    ("from November 2023 to February", "2023-11-01", "2024-03-01"),
    ("August 11-15, 2023", "2023-08-11", "2023-08-16"),
    ("11–15 Aug 2023", "2023-08-11", "2023-08-16"),
    ("between 11 and 15 August 2023", "2023-08-11", "2023-08-16"),
    ("August 11 to 15", "2026-08-11", "2026-08-16"),
    # English: a year after a bare comma.
    ("December 1,2023", "2023-12-01", "2023-12-02"),
    ("1 December,2023", "2023-12-01", "2023-12-02"),
    ("December,2023", "2023-12-01", "2024-01-01"),
    # English: relative to another time. "Before" runs on to the end of the anchor's day.
    ("the week before 9 June 2023", "2023-06-02", "2023-06-10"),
    ("the week before June 9, 2023", "2023-06-02", "2023-06-10"),
    ("in the week before 16 November 2023", "2023-11-09", "2023-11-17"),
    ("two weeks before August 11, 2023", "2023-07-28", "2023-08-12"),
    ("the day before 2026-05-10", "2026-05-09", "2026-05-11"),
    ("3 days prior to 2026-05-10", "2026-05-07", "2026-05-11"),
    ("the Sunday before October 25, 2022", "2022-10-23", "2022-10-26"),
    ("the Friday before 14 August 2023", "2023-08-11", "2023-08-15"),
    ("last weekend before April 10, 2023", "2023-04-08", "2023-04-11"),
    ("the weekend before 16 July 2023", "2023-07-08", "2023-07-17"),
    ("two weekends before 17 July 2023", "2023-07-08", "2023-07-18"),
    ("the month before June 2023", "2023-05-01", "2023-06-02"),
    ("the year before 2025", "2024-01-01", "2025-01-02"),
    ("the week before last week", "2026-11-16", "2026-11-24"),
    ("the week after 9 June 2023", "2023-06-10", "2023-06-17"),
    ("three days after 2026-05-01", "2026-05-04", "2026-05-05"),
    ("the Friday after 2026-05-01", "2026-05-08", "2026-05-09"),
    ("the weekend after 2026-05-01", "2026-05-02", "2026-05-04"),
    ("the month after March 2026", "2026-04-01", "2026-05-01"),
    ("the week of 23 August 2023", "2023-08-21", "2023-08-28"),
    # Japanese and Chinese: relative to another time (anchor first).
    ("2023年6月9日の前の週", "2023-06-02", "2023-06-10"),
    ("2023年8月11日の2週間前", "2023-07-28", "2023-08-12"),
    ("2026年5月10日の前日", "2026-05-09", "2026-05-11"),
    ("2026年5月10日の3日前", "2026-05-07", "2026-05-11"),
    ("2023年7月16日の前の週末", "2023-07-08", "2023-07-17"),
    ("2023年6月9日の翌週", "2023-06-10", "2023-06-17"),
    ("2026年5月1日の翌日", "2026-05-02", "2026-05-03"),
    ("2023年8月23日の週", "2023-08-21", "2023-08-28"),
    ("2023年6月9日的前一周", "2023-06-02", "2023-06-10"),
    ("2023年6月9日之前的一周", "2023-06-02", "2023-06-10"),
    ("2026年5月10日前三天", "2026-05-07", "2026-05-11"),
    ("2026年5月1日后两天", "2026-05-03", "2026-05-04"),
    ("2026年3月之后一个月", "2026-04-01", "2026-05-01"),
    ("2026年5月1日的第二天", "2026-05-02", "2026-05-03"),
    ("2023年8月23日那周", "2023-08-21", "2023-08-28"),
    # English: parts of a period.
    ("the second week of November", "2026-11-08", "2026-11-15"),
    ("the last week of February 2024", "2024-02-23", "2024-03-01"),
    ("the beginning of November 2022", "2022-11-01", "2022-11-11"),
    ("mid-November 2022", "2022-11-11", "2022-11-21"),
    ("the end of June 2023", "2023-06-21", "2023-07-01"),
    ("early 2023", "2023-01-01", "2023-05-01"),
    ("late last year", "2025-09-01", "2026-01-01"),
    ("the first half of 2022", "2022-01-01", "2022-07-01"),
    ("late yesterday", "2026-11-30", "2026-12-01"),
    # Japanese
    ("今日", "2026-12-01", "2026-12-02"),
    ("昨日", "2026-11-30", "2026-12-01"),
    ("昨日の", "2026-11-30", "2026-12-01"),
    ("一昨日", "2026-11-29", "2026-11-30"),
    ("おととい", "2026-11-29", "2026-11-30"),
    ("今朝", "2026-12-01T05", "2026-12-01T12"),
    ("昨夜", "2026-11-30T18", "2026-12-01T06"),
    ("昨日の夜", "2026-11-30T18", "2026-12-01T06"),
    ("先週", "2026-11-23", "2026-11-30"),
    ("今週", "2026-11-30", "2026-12-07"),
    ("先々週", "2026-11-16", "2026-11-23"),
    ("先週末", "2026-11-28", "2026-11-30"),
    ("先月", "2026-11-01", "2026-12-01"),
    ("今月", "2026-12-01", "2027-01-01"),
    ("去年", "2025-01-01", "2026-01-01"),
    ("昨年", "2025-01-01", "2026-01-01"),
    ("今年", "2026-01-01", "2027-01-01"),
    ("3日前", "2026-11-28", "2026-11-29"),
    ("３日前", "2026-11-28", "2026-11-29"),
    ("三日前", "2026-11-28", "2026-11-29"),
    ("2週間前", "2026-11-16", "2026-11-23"),
    ("3ヶ月前", "2026-09-01", "2026-10-01"),
    ("1年前", "2025-01-01", "2026-01-01"),
    ("5時間前", "2026-12-01T05", "2026-12-01T06"),
    ("過去3日", "2026-11-28", "2026-12-02"),
    ("3月", "2026-03-01", "2026-04-01"),
    ("12月", "2026-12-01", "2027-01-01"),
    ("3月5日", "2026-03-05", "2026-03-06"),
    ("2025年3月5日", "2025-03-05", "2025-03-06"),
    ("2025年", "2025-01-01", "2026-01-01"),
    ("去年の3月", "2025-03-01", "2025-04-01"),
    ("今月5日", "2026-12-05", "2026-12-06"),
    ("金曜日", "2026-11-27", "2026-11-28"),
    ("先週の金曜日", "2026-11-27", "2026-11-28"),
    ("来週の月曜", "2026-12-07", "2026-12-08"),
    ("昨日から今日まで", "2026-11-30", "2026-12-02"),
    ("5月1日〜5月3日", "2026-05-01", "2026-05-04"),
    ("2023年8月11日から8月15日まで", "2023-08-11", "2023-08-16"),
    ("去年の8月11日から8月15日まで", "2025-08-11", "2025-08-16"),
    ("2023年12月20日から1月5日まで", "2023-12-20", "2024-01-06"),
    ("先週から", "2026-11-23", "2026-12-02"),
    # Chinese
    ("今天", "2026-12-01", "2026-12-02"),
    ("昨天", "2026-11-30", "2026-12-01"),
    ("前天", "2026-11-29", "2026-11-30"),
    ("大前天", "2026-11-28", "2026-11-29"),
    ("昨晚", "2026-11-30T18", "2026-12-01T06"),
    ("今天下午", "2026-12-01T12", "2026-12-01T18"),
    ("上周", "2026-11-23", "2026-11-30"),
    ("上星期", "2026-11-23", "2026-11-30"),
    ("上个星期", "2026-11-23", "2026-11-30"),
    ("上礼拜", "2026-11-23", "2026-11-30"),
    ("上週", "2026-11-23", "2026-11-30"),
    ("上上周", "2026-11-16", "2026-11-23"),
    ("本周", "2026-11-30", "2026-12-07"),
    ("这周", "2026-11-30", "2026-12-07"),
    ("这个星期", "2026-11-30", "2026-12-07"),
    ("上周末", "2026-11-28", "2026-11-30"),
    ("上个月", "2026-11-01", "2026-12-01"),
    ("上上个月", "2026-10-01", "2026-11-01"),
    ("这个月", "2026-12-01", "2027-01-01"),
    ("本月", "2026-12-01", "2027-01-01"),
    ("去年", "2025-01-01", "2026-01-01"),
    ("前年", "2024-01-01", "2025-01-01"),
    ("三天前", "2026-11-28", "2026-11-29"),
    ("3天前", "2026-11-28", "2026-11-29"),
    ("两周前", "2026-11-16", "2026-11-23"),
    ("两个星期前", "2026-11-16", "2026-11-23"),
    ("3个月前", "2026-09-01", "2026-10-01"),
    ("十二个月前", "2025-12-01", "2026-01-01"),
    ("5小时前", "2026-12-01T05", "2026-12-01T06"),
    ("最近3天", "2026-11-28", "2026-12-02"),
    ("过去一周", "2026-11-24", "2026-12-02"),
    ("3月", "2026-03-01", "2026-04-01"),
    ("三月", "2026-03-01", "2026-04-01"),
    ("去年三月", "2025-03-01", "2025-04-01"),
    ("3月5号", "2026-03-05", "2026-03-06"),
    ("十二月二十五日", "2025-12-25", "2025-12-26"),
    ("周一", "2026-11-30", "2026-12-01"),
    ("星期天", "2026-11-29", "2026-11-30"),
    ("上周五", "2026-11-27", "2026-11-28"),
    ("下周一", "2026-12-07", "2026-12-08"),
    ("上周的", "2026-11-23", "2026-11-30"),
    ("昨天到今天", "2026-11-30", "2026-12-02"),
    ("从上周到昨天", "2026-11-23", "2026-12-01"),
    ("自上周以来", "2026-11-23", "2026-12-02"),
    ("2023年8月11日到8月15日", "2023-08-11", "2023-08-16"),
    ("从8月11日到2023年8月15日", "2023-08-11", "2023-08-16"),
]


@pytest.mark.parametrize("tz", ZONES, ids=["UTC", "Tokyo"])
@pytest.mark.parametrize(("text", "start", "end"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_expressions_on_a_fixed_clock(text: str, start: str, end: str, tz: object) -> None:
    now = datetime(2026, 12, 1, 10, 0, tzinfo=tz)  # type: ignore[arg-type]
    window = parse_time_window(text, now)
    assert window is not None
    assert (window.start, window.end) == (at(start, tz), at(end, tz))
    assert window.start.tzinfo is tz and window.end.tzinfo is tz
    assert window.start.utcoffset() == now.utcoffset()


UNPARSABLE = [
    "",
    "   ",
    "hello",
    "ramen",
    "someday",
    "the future",
    "3/5",
    "a/b",
    "2026-05-01/nonsense",
    "2026-05-01/2026-05-02/2026-05-03",
    "2026..",
    "9999-12-31",
    "9999-12",
    "9999",
    "2026-13",
    "2026-02-30",
    "2026-05-01T25",
    "2026-W60",
    "最近",
    "いつか",
    "以前",
    "很久以前",
    "3月前",
    "february 30",
    "32 march",
    "the week before",
    "の前の週",
    "何かの前の週",
    "的前一周",
    "two weeks before nonsense",
    "zero days before 2026-05-01",
    "the fifth week of february 2026",
    "august 15-11, 2023",
]


@pytest.mark.parametrize("text", UNPARSABLE)
def test_unparsable_gives_none(text: str) -> None:
    assert parse_time_window(text, datetime(2026, 12, 1, 10, tzinfo=timezone.utc)) is None


def test_non_string_gives_none() -> None:
    assert parse_time_window(None, datetime(2026, 12, 1, tzinfo=timezone.utc)) is None  # type: ignore[arg-type]


def test_most_recent_month_not_in_the_future() -> None:
    feb = datetime(2026, 2, 10, 9, tzinfo=timezone.utc)
    for text in ("in March", "3月", "三月"):
        window = parse_time_window(text, feb)
        assert window is not None and window.start == datetime(2025, 3, 1, tzinfo=timezone.utc)
    this_month = parse_time_window("february", feb)
    assert this_month is not None and this_month.start == datetime(2026, 2, 1, tzinfo=timezone.utc)
    last = parse_time_window("last february", feb)
    assert last is not None and last.start == datetime(2025, 2, 1, tzinfo=timezone.utc)


def test_timestamps_with_offsets_are_converted_to_the_clock_zone() -> None:
    tokyo = ZoneInfo("Asia/Tokyo")
    now = datetime(2026, 12, 1, 10, tzinfo=tokyo)
    window = parse_time_window("2026-05-01T14:30:00Z", now)
    assert window is not None
    assert window.start == datetime(2026, 5, 1, 23, tzinfo=tokyo)
    assert window.end - window.start == timedelta(hours=1)
    india = parse_time_window("2026-05-01T14:30+05:30", datetime(2026, 12, 1, tzinfo=timezone.utc))
    assert india is not None and india.start == datetime(2026, 5, 1, 9, tzinfo=timezone.utc)


def test_the_day_follows_the_clock_zone() -> None:
    # 20:00 UTC on Dec 1 is already Dec 2 in Tokyo.
    instant = datetime(2026, 12, 1, 20, tzinfo=timezone.utc)
    tokyo = ZoneInfo("Asia/Tokyo")
    utc_today = parse_time_window("today", instant)
    tokyo_today = parse_time_window("today", instant.astimezone(tokyo))
    assert utc_today is not None and tokyo_today is not None
    assert utc_today.start == datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert tokyo_today.start == datetime(2026, 12, 2, tzinfo=tokyo)


def test_days_across_a_dst_change_have_their_real_length() -> None:
    ny = ZoneInfo("America/New_York")
    window = parse_time_window("yesterday", datetime(2026, 11, 2, 10, tzinfo=ny))  # DST ended Nov 1
    assert window is not None
    assert window.end.timestamp() - window.start.timestamp() == 25 * 3600
    assert window.start.utcoffset() == timedelta(hours=-4) and window.end.utcoffset() == timedelta(hours=-5)


def test_naive_now_is_read_as_local_time() -> None:
    window = parse_time_window("today", datetime(2026, 12, 1, 10))
    assert window is not None and window.start.tzinfo is not None
    assert window.start.date() == datetime(2026, 12, 1).date()


# --------------------------------------------------------------------------- distances

UTC = timezone.utc
WIN = TimeWindow(datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 2, tzinfo=UTC))


def test_overlap_is_half_open() -> None:
    assert WIN.overlaps(datetime(2026, 5, 1, tzinfo=UTC))
    assert WIN.overlaps(datetime(2026, 5, 1, 23, 59, tzinfo=UTC))
    assert not WIN.overlaps(datetime(2026, 5, 2, tzinfo=UTC))
    assert WIN.overlaps(datetime(2026, 4, 30, tzinfo=UTC), datetime(2026, 5, 1, tzinfo=UTC))
    assert WIN.overlaps(datetime(2026, 5, 3, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC))  # reversed
    assert not WIN.overlaps(datetime(2026, 4, 29, tzinfo=UTC), datetime(2026, 4, 30, tzinfo=UTC))
    assert WIN.contains(datetime(2026, 5, 1, 12, tzinfo=UTC)) and not WIN.contains(WIN.end)


def test_distance_to_window() -> None:
    assert distance_to_window(datetime(2026, 5, 1, 12, tzinfo=UTC), WIN) == 0.0
    assert distance_to_window(datetime(2026, 4, 30, 23, tzinfo=UTC), WIN) == 3600.0
    assert distance_to_window(datetime(2026, 5, 2, 2, tzinfo=UTC), WIN) == 7200.0
    assert distance_to_window(WIN.end, WIN) == 0.0
    assert distance_to_window(datetime(2026, 4, 20, tzinfo=UTC), WIN, datetime(2026, 4, 30, 22, tzinfo=UTC)) == 7200.0
    # Other zones and naive times (read in the window's zone).
    tokyo = ZoneInfo("Asia/Tokyo")
    assert distance_to_window(datetime(2026, 5, 2, 10, tzinfo=tokyo), WIN) == 3600.0
    assert distance_to_window(datetime(2026, 5, 2, 1), WIN) == 3600.0


def test_proximity_key_orders_inside_then_nearest_then_latest() -> None:
    events = {
        "right_edge": datetime(2026, 5, 2, tzinfo=UTC),
        "inside_early": datetime(2026, 5, 1, 1, tzinfo=UTC),
        "inside_late": datetime(2026, 5, 1, 20, tzinfo=UTC),
        "before_1h": datetime(2026, 4, 30, 23, tzinfo=UTC),
        "after_3h": datetime(2026, 5, 2, 3, tzinfo=UTC),
    }
    order = sorted(events, key=lambda name: proximity_key(events[name], WIN))
    assert order == ["inside_late", "inside_early", "right_edge", "before_1h", "after_3h"]
