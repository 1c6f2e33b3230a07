"""The plain objects the layer actors are thin over, exercised without actors: the
post-turn cursor, the session runs replayed at load, the stored-tail overlap and the
extraction wait (the timer's deadline for batch extraction)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.extraction import ExtractionQueue
from nekomem.domain.post_turn import POST_TURN_CURSOR, PostTurnCursor, session_runs
from nekomem.domain.recent_window import repeated_prefix
from nekomem.domain.turns import Turn

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
S = LongTermSettings()


def test_cursor_moves_only_over_a_leading_run_of_acknowledged_records() -> None:
    cursor = PostTurnCursor(4)
    assert cursor.update() is None  # nothing moved since it was loaded
    for last in (6, 9, 11):
        cursor.sent(last)
    cursor.acked(9)  # acknowledged out of order: 6 is still open
    assert cursor.row == 4 and cursor.update() is None
    cursor.acked(6)
    assert cursor.row == 9
    assert cursor.update() == {POST_TURN_CURSOR: 9}
    assert cursor.update() is None  # handed out once
    cursor.acked(11)
    assert cursor.update() == {POST_TURN_CURSOR: 11}


def test_cursor_remembers_an_ack_that_arrives_before_its_row_leads() -> None:
    cursor = PostTurnCursor(0)
    cursor.acked(3)  # nothing sent yet: the cursor stays
    assert cursor.row == 0 and cursor.update() is None
    cursor.sent(3)
    cursor.sent(5)
    assert cursor.row == 0  # sending alone moves nothing
    cursor.acked(5)  # 3's earlier ack counts once 3 leads
    assert cursor.row == 5
    assert cursor.update() == {POST_TURN_CURSOR: 5}


class _Row(msgspec.Struct, frozen=True):
    id: int
    session_id: str | None


def test_session_runs_keep_order_and_cut_at_each_change() -> None:
    rows = [_Row(1, "a"), _Row(2, "a"), _Row(3, "b"), _Row(4, None), _Row(5, None), _Row(6, "a")]
    runs = session_runs(rows)
    assert [[r.id for r in run] for run in runs] == [[1, 2], [3], [4, 5], [6]]
    assert session_runs([]) == []


def test_repeated_prefix_finds_the_longest_overlap_by_role_and_text() -> None:
    stored = [Turn("human", "hi"), Turn("ai", "hello"), Turn("human", "again")]
    new = [Turn("ai", "hello"), Turn("human", "again"), Turn("ai", "new")]
    assert repeated_prefix(stored, new) == 2
    assert repeated_prefix(stored, [Turn("human", "again")]) == 1
    assert repeated_prefix(stored, [Turn("ai", "again")]) == 0  # same text, other role
    assert repeated_prefix([], new) == 0
    assert repeated_prefix(stored, []) == 0


def _op(i: int, users: int = 1) -> tuple[str, list[Turn]]:
    return f"op{i}", [t for n in range(users) for t in (Turn("human", f"u{i}.{n}"), Turn("ai", "ok"))]


def test_extraction_wait_matches_the_trigger_it_waits_for() -> None:
    q = ExtractionQueue(S)
    assert q.wait_seconds(T0, 0.0) is None  # nothing queued
    q.add(*_op(0), T0)
    # First run: the idle rule, counted from the last activity.
    wait = q.wait_seconds(T0, 0.0)
    assert wait == S.fact_extract_idle_seconds
    assert q.due(T0 + timedelta(seconds=wait)) == "idle"
    assert q.due(T0 + timedelta(seconds=wait - 1)) is None
    # A closed gate pushes the deadline out; never earlier than the trigger.
    assert q.wait_seconds(T0, 60.0) == 60.0
    # After a check the interval rule (no burst tail): idle no longer counts.
    q.take("idle")
    q.checked(T0)
    q.add(*_op(1), T0 + timedelta(seconds=1))
    later = T0 + timedelta(seconds=2)
    wait = q.wait_seconds(later, 0.0)
    assert wait == S.fact_extract_interval_minutes * 60 - 2
    assert q.due(later + timedelta(seconds=wait)) == "interval"


def test_extraction_wait_is_the_gate_once_the_count_is_reached() -> None:
    q = ExtractionQueue(S)
    q.add(*_op(0, users=S.fact_extract_every_n_turns), T0)
    assert q.due(T0) == "count"
    assert q.wait_seconds(T0, 0.0) == 0.0
    assert q.wait_seconds(T0, 7.5) == 7.5


def test_extraction_wait_ignores_records_without_user_turns() -> None:
    q = ExtractionQueue(S)
    q.add("op0", [Turn("ai", "only the character spoke")], T0)
    assert q.wait_seconds(T0, 0.0) is None
    assert q.due(T0 + timedelta(hours=1)) is None
