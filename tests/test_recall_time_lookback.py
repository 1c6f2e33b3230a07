"""Year-less months in time hints (recall/time_lookback.py and the query plan): which
queries qualify, the earlier windows, and the plan's fallback to the latest remembered year."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from nekomem.config.settings import load_settings
from nekomem.domain.index_entry import IndexEntry
from nekomem.recall.index import RecallIndex
from nekomem.recall.query_plan import plan_query
from nekomem.recall.query_text import LexicalAnalyzer
from nekomem.recall.time_lookback import earlier_years, latest_remembered, names_month_without_year
from nekomem.recall.timewindow import TimeWindow

UTC = timezone.utc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("When did Melanie go camping in June?", True),
        ("What did John get on Aug 15th?", True),
        ("6月に何をした", True),
        ("三月に何をした", True),
        ("十二月二十五日", True),
        ("一个月前", False),
        ("三ヶ月前", False),
        ("When did Melanie go camping in June 2023?", False),
        ("2023年6月に何をした", False),
        ("What did we eat yesterday?", False),
        ("What did we do last week?", False),
        ("Who is Augustine?", False),
    ],
)
def test_which_queries_name_a_month_without_a_year(text: str, expected: bool) -> None:
    assert names_month_without_year(text) is expected


def test_earlier_years_skip_a_missing_leap_day() -> None:
    leap = TimeWindow(datetime(2024, 2, 29, tzinfo=UTC), datetime(2024, 3, 1, tzinfo=UTC))
    starts = [w.start.date().isoformat() for w in earlier_years(leap, 4)]
    assert starts == ["2020-02-29"]  # 2023, 2022 and 2021 have no 29 February
    june = TimeWindow(datetime(2026, 6, 1, tzinfo=UTC), datetime(2026, 7, 1, tzinfo=UTC))
    assert [(w.start.year, w.end.month) for w in earlier_years(june, 2)] == [(2025, 7), (2024, 7)]
    seen: list[int] = []

    def ids_in(window: TimeWindow) -> set[str] | None:
        seen.append(window.start.year)
        return {"x"} if window.start.year == 2023 else None

    assert latest_remembered(june, 5, ids_in) == {"x"} and seen == [2025, 2024, 2023]
    assert latest_remembered(june, 2, ids_in) is None


def make_index(**overrides: object) -> tuple[RecallIndex, object]:
    s = load_settings(None, env={}, overrides=overrides).recall
    index = RecallIndex(s, UTC, LexicalAnalyzer(s, ()))
    index.upsert(
        [
            IndexEntry(id="j23", tier="fact", text="camping by the lake", event_start_at="2023-06-10T10:00:00+00:00"),
            IndexEntry(id="j21", tier="fact", text="camping in the hills", event_start_at="2021-06-12T10:00:00+00:00"),
            IndexEntry(id="a23", tier="fact", text="a pride parade", event_start_at="2023-08-05T10:00:00+00:00"),
        ]
    )
    return index, s


def test_the_plan_falls_back_to_the_latest_remembered_june() -> None:
    index, s = make_index()
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert plan_query("When did we go camping in June?", "", now, index, s, 0.0).hinted == {"j23"}
    assert plan_query("When did we go camping in June 2021?", "", now, index, s, 0.0).hinted == {"j21"}
    assert plan_query("When did we go camping in June 2025?", "", now, index, s, 0.0).hinted is None  # a year: as said
    assert plan_query("What did we do yesterday?", "", now, index, s, 0.0).hinted is None
    off_index, off = make_index(recall_query_time_year_lookback=0)
    assert plan_query("When did we go camping in June?", "", now, off_index, off, 0.0).hinted is None
    near_index, near = make_index(recall_query_time_year_lookback=2)
    assert plan_query("When did we go camping in June?", "", now, near_index, near, 0.0).hinted is None  # 2023 is 3 back
    # The visibility filter applies to every year tried.
    assert plan_query("When did we go camping in June?", "", now, index, s, 0.0, visible={"j21"}).hinted == {"j21"}
