"""Calendar arithmetic in the zone of a reference moment, for time expressions: days,
weeks (from Monday), months, years and hours as half-open ``[start, end)`` spans of aware
datetimes (see :mod:`nekomem.recall.timewindow`)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone, tzinfo

Span = tuple[datetime, datetime]


def aware(ts: datetime, tz: tzinfo | None) -> datetime:
    """``ts`` with zone ``tz`` when it has none (an aware ``ts`` is returned as it is)."""
    return ts.replace(tzinfo=tz) if ts.tzinfo is None else ts


class Calendar:
    """``now`` and calendar arithmetic in its zone (windows built from wall-clock dates)."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.tz = now.tzinfo
        self.today = now.date()

    def at(self, day: date, hour: int = 0) -> datetime:
        day = day + timedelta(days=hour // 24)
        return datetime(day.year, day.month, day.day, hour % 24, tzinfo=self.tz)

    def days(self, first: date, count: int = 1) -> Span:
        return self.at(first), self.at(first + timedelta(days=count))

    def day(self, offset: int) -> Span:
        return self.days(self.today + timedelta(days=offset))

    def monday(self, week_offset: int) -> date:
        return self.today - timedelta(days=self.today.weekday()) + timedelta(weeks=week_offset)

    def week(self, offset: int) -> Span:
        return self.days(self.monday(offset), 7)

    def weekend(self, offset: int) -> Span:
        return self.days(self.monday(offset) + timedelta(days=5), 2)

    def month_of(self, year: int, month: int) -> Span:
        nxt = (year + 1, 1) if month == 12 else (year, month + 1)
        return self.at(date(year, month, 1)), self.at(date(nxt[0], nxt[1], 1))

    def shift_month(self, offset: int) -> tuple[int, int]:
        index = self.today.year * 12 + self.today.month - 1 + offset
        return index // 12, index % 12 + 1

    def month(self, offset: int) -> Span:
        return self.month_of(*self.shift_month(offset))

    def year_of(self, year: int) -> Span:
        return self.at(date(year, 1, 1)), self.at(date(year + 1, 1, 1))

    def hour_span(self, instant: datetime) -> Span:
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

    def ago(self, unit: str, count: int) -> Span:
        if unit == "hour":
            return self.hour_span(self.hours_ago(count))
        if unit == "day":
            return self.day(-count)
        if unit == "week":
            return self.week(-count)
        if unit == "month":
            return self.month(-count)
        return self.year_of(self.today.year - count)

    def rolling(self, unit: str, count: int) -> Span:
        if unit == "hour":
            return self.hour_span(self.hours_ago(count))[0], self.hour_span(self.now)[1]
        return self.at(self.units_back(unit, count)), self.at(self.today + timedelta(days=1))

    def recent_month_day(self, month: int, day: int | None, strictly_before: bool = False) -> Span:
        """The most recent month (or month-day) not in the future (or before this month)."""
        year = self.today.year
        if day is None:
            if month > self.today.month or (strictly_before and month == self.today.month):
                year -= 1
            return self.month_of(year, month)
        if (month, day) > (self.today.month, self.today.day):
            year -= 1
        return self.days(date(year, month, day))
