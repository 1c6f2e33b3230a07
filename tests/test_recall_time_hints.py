"""Time expressions inside whole questions (``query_time_hint``): the span found, its window
and the text left to search. The questions are shaped like LoCoMo's temporal ones."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pytest

from nekomem.config.recall import RecallSettings
from nekomem.recall.query_text import query_time_hint

NOW = datetime(2026, 12, 1, 10, tzinfo=timezone.utc)
S = RecallSettings()

# (question, first day, day after the last, the text left to search)
HINTS = [
    ("Where was John between August 11 and August 15 2023?", "2023-08-11", "2023-08-16", "Where was John"),
    ("Where was John on August 11-15, 2023?", "2023-08-11", "2023-08-16", "Where was John"),
    (
        "Where was the forest picture shared by John on December 1,2023 taken?",
        "2023-12-01",
        "2023-12-02",
        "Where was the forest picture shared by John taken?",
    ),
    ("Where was Tim in the week before 16 November 2023?", "2023-11-09", "2023-11-17", "Where was Tim"),
    (
        "What did John do the week before August 3, 2023 involving his kids?",
        "2023-07-27",
        "2023-08-04",
        "What did John do involving his kids?",
    ),
    (
        "What is the name of the puppy she got two weeks before August 11, 2023?",
        "2023-07-28",
        "2023-08-12",
        "What is the name of the puppy she got",
    ),
    ("What did Maria participate in last weekend before April 10, 2023?", "2023-04-08", "2023-04-11", "What did Maria participate"),
    (
        "What was shown on the big screen on the Sunday before October 25, 2022?",
        "2022-10-23",
        "2022-10-26",
        "What was shown on the big screen",
    ),
    ("Which country was Tim visiting in the second week of November?", "2026-11-08", "2026-11-15", "Which country was Tim visiting"),
    ("Which tournament did Nate win in the beginning of November 2022?", "2022-11-01", "2022-11-11", "Which tournament did Nate win"),
    ("去年の8月11日から8月15日まで何をしていた?", "2025-08-11", "2025-08-16", "何をしていた?"),
    ("2023年8月11日到8月15日你在哪里", "2023-08-11", "2023-08-16", "你在哪里"),
    ("2023年6月9日の前の週に何を食べた?", "2023-06-02", "2023-06-10", "に何を食べた?"),
    ("8月3日の翌日はどこへ行った?", "2026-08-04", "2026-08-05", "はどこへ行った?"),
    ("2023年6月9日的前一周我去了哪里", "2023-06-02", "2023-06-10", "我去了哪里"),
    ("5月1日的第二天你做了什么", "2026-05-02", "2026-05-03", "你做了什么"),
]


@pytest.mark.parametrize(("question", "first", "end", "rest"), HINTS, ids=[h[0][:40] for h in HINTS])
def test_the_whole_time_expression_is_found(question: str, first: str, end: str, rest: str) -> None:
    window, left = query_time_hint(question, NOW, S.recall_query_time_max_tokens, S.recall_query_time_max_attempts)
    assert window is not None
    assert (window.start.date(), window.end.date()) == (date.fromisoformat(first), date.fromisoformat(end))
    assert left == rest


def test_a_relative_phrase_without_an_anchor_is_not_a_time() -> None:
    # "the week before" names no time; "may" alone is the verb.
    assert query_time_hint("What did she do the week before?", NOW, 6, 200) == (None, "What did she do the week before?")
    assert query_time_hint("I may see you the day before", NOW, 6, 200) == (None, "I may see you the day before")
