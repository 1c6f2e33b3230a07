"""Recent-memory review: gates in order, prompt, splice of the corrected dialogue, state."""

from __future__ import annotations

import math

import pytest

from nekomem.config.recent import RecentSettings
from nekomem.domain import review as rv
from nekomem.domain.recent_window import tail_fingerprint, window_tokens
from nekomem.domain.review import ReviewState, apply_review, apply_review_detailed, review_gate
from nekomem.domain.tokens import TiktokenCounter, get_counter
from nekomem.domain.turns import Turn

S = RecentSettings()
PREFIX = S.recent_memo_prefix
NOW = 1_000_000.0


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    c = get_counter("o200k_base")
    assert isinstance(c, TiktokenCounter)
    return c


def t(role: str, text: str, i: int) -> Turn:
    return Turn(role=role, text=text, ts=f"2024-05-01T10:00:{i:02d}+00:00")  # type: ignore[arg-type]


def window_of(n: int, memo: bool = False, start: int = 0) -> list[Turn]:
    out = [t("system", PREFIX + "they met yesterday.", 0)] if memo else []
    out += [t("human" if i % 2 == 0 else "ai", f"turn {i}", i) for i in range(start, start + n)]
    return out


def fp(turns: list[Turn]) -> list[str]:
    return tail_fingerprint(turns, S.review_fingerprint_k, S.review_fingerprint_prefix_chars)


# --- gates -------------------------------------------------------------------------------


def gate(state: ReviewState, window: list[Turn], counter: TiktokenCounter, **kw) -> str | None:
    args = dict(now_ts=NOW, last_activity_ts=NOW, switch_on=True, settings=S, counter=counter)
    args.update(kw)
    return review_gate(state, window, **args)  # type: ignore[arg-type]


def test_gates_in_order(counter: TiktokenCounter) -> None:
    """Start with every gate closed and open them one by one: each reports in turn."""
    short = window_of(4)
    long = window_of(20)
    reviewed_at = long[:12]  # the anchor: 4 human turns follow it (indexes 12..19)
    blocked = ReviewState(
        last_review_ts=NOW - 10,
        last_reviewed_tail=fp(reviewed_at),
        output_exhaustion_attempts=3,
        output_exhaustion_min_context_tokens=window_tokens(long, counter),
        output_exhaustion_blocked=True,
        fail_attempts=5,
        fail_fingerprint=fp(long),
    )
    assert gate(blocked, short, counter, in_flight=True, switch_on=False) == rv.GATE_IN_FLIGHT
    assert gate(blocked, short, counter, switch_on=False) == rv.GATE_SWITCH_OFF
    assert gate(blocked, short, counter) == rv.GATE_TOO_SHORT
    assert gate(blocked, long, counter) == rv.GATE_MIN_INTERVAL
    later = NOW + S.review_min_interval_seconds
    assert gate(blocked, long, counter, now_ts=later, last_activity_ts=later) == rv.GATE_FEW_NEW_MESSAGES
    more = [*long, t("human", "one more", 30)]
    assert gate(blocked, more, counter, now_ts=later, last_activity_ts=later) == rv.GATE_OUTPUT_EXHAUSTED
    # The dead letter fingerprint is of `more`; exhaustion reopens for a smaller context.
    dead = ReviewState(
        last_review_ts=NOW - 10,
        last_reviewed_tail=fp(reviewed_at),
        output_exhaustion_attempts=3,
        output_exhaustion_min_context_tokens=window_tokens(more, counter) + 1,
        output_exhaustion_blocked=True,
        fail_attempts=5,
        fail_fingerprint=fp(more),
    )
    assert gate(dead, more, counter, now_ts=later, last_activity_ts=later) == rv.GATE_DEAD_LETTER
    # A changed tail lifts the dead letter, but its bigger context keeps the breaker closed.
    newer = [*more, t("ai", "reply", 31)]
    assert gate(dead, newer, counter, now_ts=later, last_activity_ts=later) == rv.GATE_OUTPUT_EXHAUSTED
    open_state = ReviewState(last_review_ts=NOW - 10, last_reviewed_tail=fp(reviewed_at))
    assert gate(open_state, more, counter, now_ts=later, last_activity_ts=later) is None


def test_history_length_gate_boundary(counter: TiktokenCounter) -> None:
    assert gate(ReviewState(), window_of(S.review_skip_history_len - 1), counter) == rv.GATE_TOO_SHORT
    assert gate(ReviewState(), window_of(S.review_skip_history_len), counter) is None


@pytest.mark.parametrize("ts", [math.nan, math.inf, NOW + 3600.0])
def test_corrupt_review_ts_is_ignored(counter: TiktokenCounter, ts: float) -> None:
    assert gate(ReviewState(last_review_ts=ts), window_of(10), counter) is None


def test_interval_gate_boundary(counter: TiktokenCounter) -> None:
    w = window_of(10)
    st = ReviewState(last_review_ts=NOW - S.review_min_interval_seconds + 1)
    assert gate(st, w, counter) == rv.GATE_MIN_INTERVAL
    st = ReviewState(last_review_ts=NOW - S.review_min_interval_seconds)
    assert gate(st, w, counter) is None


def test_new_message_gate_and_idle_bypass(counter: TiktokenCounter) -> None:
    base = window_of(10)
    st = ReviewState(last_reviewed_tail=fp(base))
    # No new message at all: blocked even after a long idle.
    idle = NOW - S.review_long_idle_bypass_seconds
    assert gate(st, base, counter, last_activity_ts=idle) == rv.GATE_FEW_NEW_MESSAGES
    # 4 new human turns (and AI replies, which do not count): blocked.
    grown = list(base)
    for i in range(4):
        grown += [t("human", f"new {i}", 40 + 2 * i), t("ai", f"re {i}", 41 + 2 * i)]
    assert rv.new_human_messages(grown, st.last_reviewed_tail) == 4
    assert gate(st, grown, counter) == rv.GATE_FEW_NEW_MESSAGES
    # The fifth opens the gate.
    assert gate(st, [*grown, t("human", "fifth", 59)], counter) is None
    # One new message is enough after a long idle, not before.
    one = [*base, t("human", "hello again", 50)]
    assert gate(st, one, counter, last_activity_ts=idle + 1) == rv.GATE_FEW_NEW_MESSAGES
    assert gate(st, one, counter, last_activity_ts=idle) is None
    # An anchor that is no longer in the window counts as unbounded.
    gone = ReviewState(last_reviewed_tail=fp(window_of(5, start=100)))
    assert rv.new_human_messages(base, gone.last_reviewed_tail) is None
    assert gate(gone, base, counter) is None


def test_output_exhaustion_breaker(counter: TiktokenCounter) -> None:
    w = window_of(12)
    tokens = window_tokens(w, counter)
    st = ReviewState()
    for attempt in range(S.review_output_exhaustion_max_attempts):
        assert gate(st, w, counter, now_ts=NOW + 1000 * (attempt + 1)) is None
        st = rv.record_output_exhausted(st, tokens + attempt, NOW + 1000 * (attempt + 1), S)
    assert st.output_exhaustion_blocked and st.output_exhaustion_min_context_tokens == tokens
    later = NOW + 10_000
    assert gate(st, w, counter, now_ts=later) == rv.GATE_OUTPUT_EXHAUSTED
    # Same or bigger context stays blocked; strictly smaller reopens.
    assert gate(st, [*w, t("ai", "more text here", 50)], counter, now_ts=later) == rv.GATE_OUTPUT_EXHAUSTED
    smaller = w[:-1]
    assert window_tokens(smaller, counter) < tokens
    assert gate(st, smaller, counter, now_ts=later) is None
    # A success clears the breaker.
    assert rv.record_success(st, later, fp(w)).output_exhaustion_blocked is False


def test_failure_dead_letter(counter: TiktokenCounter) -> None:
    w = window_of(12)
    st = ReviewState()
    for i in range(S.review_max_fail_attempts):
        assert gate(st, w, counter, now_ts=NOW + 100 * (i + 1)) is None
        st = rv.record_failure(st, w, NOW + 100 * (i + 1), S)
    assert st.fail_attempts == S.review_max_fail_attempts
    assert gate(st, w, counter, now_ts=NOW + 10_000) == rv.GATE_DEAD_LETTER
    # A new tail is reviewable again, and a failure on it restarts the count.
    w2 = [*w, t("human", "new topic", 55)]
    assert gate(st, w2, counter, now_ts=NOW + 10_000) is None
    assert rv.record_failure(st, w2, NOW + 10_001, S).fail_attempts == 1


def test_record_helpers() -> None:
    st = ReviewState(last_review_ts=5.0, last_reviewed_tail=["x"], fail_attempts=2, fail_fingerprint=["y"])
    white = rv.record_white(st)
    assert white.last_reviewed_tail is None and white.last_review_ts == 5.0 and white.fail_attempts == 2
    ok = rv.record_success(st, 9.0, ["a", "b"])
    assert ok == ReviewState(last_review_ts=9.0, last_reviewed_tail=["a", "b"])
    failed = rv.record_failure(st, window_of(3), 7.0, S)
    assert failed.last_review_ts == 7.0 and failed.last_reviewed_tail == ["x"] and failed.fail_attempts == 1


# --- prompt ------------------------------------------------------------------------------


def test_build_review_messages() -> None:
    snap = window_of(3, memo=True)
    msgs = rv.build_review_messages(snap, master_name="Master", character_name="Neko")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[1]["content"] == (f"system: {PREFIX}they met yesterday.\n\nuser: turn 0\n\nassistant: turn 1\n\nuser: turn 2\n\n")
    assert "corrected_dialogue" in msgs[0]["content"] and "Neko" in msgs[0]["content"]
    assert "JSON object only" in msgs[0]["content"]
    no_memo = rv.build_review_messages(window_of(3), master_name="Master", character_name="Neko")
    assert 'do not output any "system"' in no_memo[0]["content"]


# --- apply -------------------------------------------------------------------------------


def as_dialogue(turns: list[Turn]) -> list[dict[str, str]]:
    return [{"role": x.openai_role, "content": x.text} for x in turns]


def test_apply_patches_in_place_and_keeps_appended() -> None:
    snap = window_of(10)
    current = [*snap, t("human", "after cutoff", 50), t("ai", "reply after", 51)]
    corrected = as_dialogue(snap)
    corrected[5] = {"role": "assistant", "content": "turn 5 (fixed)"}
    result = apply_review_detailed(current, snap, corrected, S)
    assert result.status == rv.STATUS_PATCHED
    new = result.window
    assert new is not None and len(new) == len(current)
    assert new[5] == Turn(role="ai", text="turn 5 (fixed)", ts=snap[5].ts)
    assert new[:5] == snap[:5] and new[6:10] == snap[6:10]
    assert new[10:] == current[10:]
    # The cutoff fingerprint points at the reviewed tail, so only the appended turns are new.
    assert result.cutoff_fingerprint == fp(new[:10])
    assert rv.new_human_messages(new, result.cutoff_fingerprint) == 1
    assert apply_review(current, snap, corrected, S) == (new, "patched")


def test_apply_role_mapping() -> None:
    snap = window_of(6)
    corrected = [
        {"role": "user", "content": "a"},
        {"role": "Assistant", "content": "b"},
        {"role": "master", "content": "c"},
        {"role": "Neko", "content": "d"},
        {"role": "system", "content": "e"},  # no memo in the snapshot: becomes human
        {"role": "narrator", "content": "f"},
    ]
    new, status = apply_review(snap, snap, corrected, S, character_name="Neko")
    assert status == "patched" and new is not None
    assert [(x.role, x.text) for x in new] == [
        ("human", "a"),
        ("ai", "b"),
        ("human", "c"),
        ("ai", "d"),
        ("human", "e"),
        ("human", "f"),
    ]
    assert [x.ts for x in new] == [x.ts for x in snap]


def test_apply_memo_normalisation() -> None:
    snap = window_of(6, memo=True)
    body = as_dialogue(snap[1:])
    # A corrected memo without the prefix gets it; two system items become one head memo.
    corrected = [
        {"role": "system", "content": "they met on Monday."},
        *body[:3],
        {"role": "system", "content": "and liked tea."},
        *body[3:],
    ]
    new, status = apply_review(snap, snap, corrected, S)
    assert status == "patched" and new is not None
    assert new[0] == Turn(role="system", text=PREFIX + "they met on Monday.\nand liked tea.", ts=snap[0].ts)
    assert new[1:] == snap[1:]
    assert sum(1 for x in new if x.role == "system") == 1
    # Without a system item the old memo stays.
    new2, _ = apply_review(snap, snap, body, S)
    assert new2 is not None and new2[0] == snap[0] and new2[1:] == snap[1:]


def test_apply_white_when_tail_gone_or_output_empty() -> None:
    snap = window_of(10)
    edited = [*snap[:-1], t("ai", "rewritten by the browser", 9)]
    assert apply_review(edited, snap, as_dialogue(snap), S) == (None, "white")
    assert apply_review(snap, snap, [], S) == (None, "clean")
    junk = ["text", 3, {"role": "user"}, {"role": "user", "content": "   "}, {"content": None}]
    assert apply_review(snap, snap, junk, S) == (None, "clean")


def test_apply_after_concurrent_compression_uses_capacity() -> None:
    snap = window_of(12)
    # Meanwhile the head was compressed: only the newest 9 of the snapshot remain.
    memo = t("system", PREFIX + "earlier things", 0)
    current = [memo, *snap[3:], t("human", "later", 60)]
    corrected = as_dialogue(snap)
    corrected = [{"role": d["role"], "content": d["content"].upper()} for d in corrected]
    new, status = apply_review(current, snap, corrected, S)
    assert status == "patched" and new is not None
    assert new[0] == memo  # the memo outside the capacity is untouched
    assert [x.text for x in new[1:10]] == [x.text.upper() for x in snap[3:]]
    assert new[10] == current[10]


def test_apply_shorter_and_longer_output() -> None:
    snap = window_of(10)
    # Fewer messages than slots: the reviewed slots shrink, order and timestamps from the end.
    shorter = as_dialogue(snap)[:2] + as_dialogue(snap)[4:]
    new, status = apply_review(snap, snap, shorter, S)
    assert status == "patched" and new is not None and len(new) == 8
    assert [x.text for x in new] == [x.text for x in snap[:2] + snap[4:]]
    assert [x.ts for x in new] == [x.ts for x in snap[2:]]
    # More messages than slots: only the last `capacity` are used.
    longer = [{"role": "user", "content": "invented"}] * 3 + as_dialogue(snap)
    new2, _ = apply_review(snap, snap, longer, S)
    assert new2 == snap


def test_nothing_to_correct_holds_the_next_review_until_the_window_changes(counter) -> None:
    """A model that answers an empty corrected_dialogue is not asked again for the same
    window: the interval holds it first, then the window-changed gate (issue 8, item 2)."""
    w = window_of(10)
    st = rv.record_clean(ReviewState(fail_attempts=3, fail_fingerprint=["y"]), w, NOW, S)
    assert st.fail_attempts == 0 and st.last_review_ts == NOW
    assert gate(st, w, counter, now_ts=NOW + 1) == rv.GATE_MIN_INTERVAL
    later = NOW + S.review_min_interval_seconds + 3600
    assert gate(st, w, counter, now_ts=later, last_activity_ts=later) == rv.GATE_FEW_NEW_MESSAGES
    grown = [*w, *(t("human", f"news {i}", 20 + i) for i in range(S.review_min_new_messages))]
    assert gate(st, grown, counter, now_ts=later, last_activity_ts=later) is None


def test_white_with_a_time_waits_the_minimum_interval(counter) -> None:
    st = rv.record_white(ReviewState(last_review_ts=5.0, last_reviewed_tail=["x"]), NOW)
    assert st.last_reviewed_tail is None and st.last_review_ts == NOW
    assert gate(st, window_of(10), counter, now_ts=NOW + 1) == rv.GATE_MIN_INTERVAL
    assert gate(st, window_of(10), counter, now_ts=NOW + S.review_min_interval_seconds) is None
