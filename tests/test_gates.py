"""TaskGate, backoff_delay and the extraction queue: the plain state behind the gates of
background model tasks (issue 8, items 1 and 2)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.extraction import ExtractionQueue
from nekomem.domain.gates import TaskGate, backoff_delay
from nekomem.domain.turns import Turn

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
S = LongTermSettings()


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_delay(60, n, 3600) for n in range(1, 9)] == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert backoff_delay(60, 10_000, 3600) == 3600  # no overflow on a huge failure count
    assert backoff_delay(5, 0, 300) == 5


def test_gate_blocks_in_flight_interval_backoff_and_an_answered_input() -> None:
    gate = TaskGate(min_interval=40, backoff_base=60, backoff_max=600)
    assert gate.blocked(0, "a") is None
    gate.start("a")
    assert gate.blocked(1, "b") == "in_flight"
    gate.answered_at(10)
    assert gate.blocked(49, "b") == "min_interval"
    assert gate.blocked(50, "a") == "unchanged"  # the model already answered this input
    assert gate.blocked(50, "b") is None
    assert gate.blocked(50) is None  # no fingerprint: never "unchanged"
    gate.start("b")
    assert gate.failed_at(100) == 60
    assert gate.blocked(159, "b") == "backoff"
    assert gate.blocked(160, "b") is None  # a failed input may be asked again
    gate.start("b")
    assert gate.failed_at(200) == 120
    gate.start("b")
    gate.answered_at(400)
    assert gate.failures == 0 and gate.calls == 4
    gate.forget_input()
    assert gate.blocked(440, "b") is None


def test_pool_full_leaves_nothing_in_flight() -> None:
    gate = TaskGate(0, 1, 1)
    gate.start("x")
    gate.not_started()
    assert gate.blocked(0, "x") is None


def turn(role: str, text: str) -> Turn:
    return Turn(role=role, text=text, ts=T0.isoformat())  # type: ignore[arg-type]


def op(i: int, users: int = 1) -> tuple[str, list[Turn]]:
    return f"op{i}", [t for n in range(users) for t in (turn("human", f"u{i}.{n}"), turn("ai", "ok"))]


def test_count_trigger_then_the_tail_of_the_burst_on_idle() -> None:
    q = ExtractionQueue(S)
    for i in range(12):
        assert q.add(*op(i), T0)
        if i == 9:
            assert q.due(T0) == "count"
            assert [o for o, _ in q.take("count")] == [f"op{n}" for n in range(10)]
            q.checked(T0)
    assert not q.add(*op(11), T0)  # already queued
    assert q.due(T0 + timedelta(seconds=9)) is None
    assert q.due(T0 + timedelta(seconds=S.fact_extract_idle_seconds)) == "burst_tail"
    assert [o for o, _ in q.take("burst_tail")] == ["op10", "op11"]
    # After the tail, a lone turn waits for the count or the interval (reference rule).
    later = T0 + timedelta(minutes=1)
    q.checked(later)
    q.add(*op(20), later)
    assert q.due(later + timedelta(seconds=30)) is None
    assert q.due(later + timedelta(minutes=S.fact_extract_interval_minutes)) == "interval"


def test_a_turn_after_a_pause_is_not_part_of_the_burst() -> None:
    q = ExtractionQueue(S)
    for i in range(10):
        q.add(*op(i), T0)
    q.take(q.due(T0) or "")
    q.checked(T0)
    pause = T0 + timedelta(seconds=S.fact_extract_idle_seconds + 5)
    q.add(*op(10), pause)
    assert q.due(pause + timedelta(seconds=S.fact_extract_idle_seconds)) is None


def test_batches_are_bounded_and_keep_whole_records() -> None:
    q = ExtractionQueue(LongTermSettings(fact_extract_max_batch_user_turns=5))
    q.add(*op(0, users=3), T0)
    q.add(*op(1, users=3), T0)
    q.add(*op(2, users=9), T0)
    assert [o for o, _ in q.take("idle")] == ["op0"]  # 3 + 3 > 5
    assert [o for o, _ in q.take("idle")] == ["op1"]
    assert [o for o, _ in q.take("idle")] == ["op2"]  # one record over the bound goes alone
    q.put_back([op(7)])
    assert [o for o, _ in q.ops] == ["op7"]


def test_first_run_idle_rule_is_kept() -> None:
    q = ExtractionQueue(S)
    q.add(*op(0), T0)
    assert q.due(T0 + timedelta(seconds=S.fact_extract_idle_seconds)) == "idle"
