"""Reflections: synthesis ids, lifecycle, feedback, disputation, surfacing, time rules."""

from __future__ import annotations

import hashlib
import random
from datetime import datetime, timedelta, timezone

import pytest

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import ResolvedSignal, net_score
from nekomem.domain.prompts.longterm import check_feedback_messages, synthesize_reflection_messages
from nekomem.domain.records import Fact, Reflection, SurfacedEntry, reflection_id, to_iso
from nekomem.domain.reflections import (
    TransitionError,
    add_reflection,
    age_out_terminal,
    apply_disputed,
    apply_feedback,
    apply_rebuttals,
    apply_resolved_signals,
    archive_sweep,
    build_reflection,
    clear_synthesis_backoff,
    confirm,
    confirm_by_user,
    contains_negative_keyword,
    disputation_context,
    evidence_confirmations,
    followup_candidates,
    interpret_feedback,
    is_mentioned,
    is_past_for_render,
    is_suppressed,
    mark_promoted,
    promotable,
    rebuttal_batch,
    rebuttal_window_start,
    record_feedback,
    record_mention,
    record_reply_mentions,
    record_surfaced,
    record_synthesis_failure,
    refresh_suppression,
    reset_confirmed_at,
    synthesis_allowed,
    synthesis_batch,
    time_driven_confirmations,
    time_driven_promotable,
    transition,
)
from nekomem.domain.turns import Turn

S = LongTermSettings()
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
words = lambda s: len(s.split())  # noqa: E731


def fact(i: int, importance: int = 6, **kw) -> Fact:
    base = dict(id=f"fact_{i:02d}", text=f"fact number {i}", importance=importance, created_at=to_iso(T0 + timedelta(minutes=i)))
    base.update(kw)
    return Fact(**base)


def ref(rid: str = "ref_a", **kw) -> Reflection:
    base = dict(id=rid, text="Master likes tea", created_at=to_iso(T0))
    base.update(kw)
    return Reflection(**base)


# --- synthesis ---------------------------------------------------------------------------


def test_reflection_id_is_a_hash_of_sorted_ids() -> None:
    digest = hashlib.sha256(b"fact_a\x00fact_b\x00").hexdigest()[:16]
    assert reflection_id(["fact_b", "fact_a"]) == "ref_" + digest
    assert reflection_id(["fact_a", "fact_b"]) == "ref_" + digest


def test_synthesis_needs_five_eligible_facts() -> None:
    facts = [fact(i) for i in range(4)] + [fact(9, importance=4), fact(10, absorbed=True)]
    assert synthesis_batch(facts, S) is None
    assert synthesis_batch(facts + [fact(5)], S) is not None


def test_synthesis_batch_caps_at_twenty_and_is_order_independent() -> None:
    facts = [fact(i, importance=5 + (i % 3)) for i in range(25)]
    batch = synthesis_batch(facts, S)
    assert batch is not None and len(batch.facts) == 20
    assert all(f.importance >= 6 for f in batch.facts[:16])
    # importance 5 facts fill the rest, oldest first: ids 0, 3 of the importance-5 ones (i % 3 == 0)
    assert [f.id for f in batch.facts[-4:]] == ["fact_00", "fact_03", "fact_06", "fact_09"]
    assert batch.source_fact_ids == sorted(batch.source_fact_ids)
    shuffled = list(facts)
    random.Random(4).shuffle(shuffled)
    again = synthesis_batch(shuffled, S)
    assert again is not None and again.reflection_id == batch.reflection_id and again.backoff_key == batch.backoff_key
    # a new low-ranked fact does not change the capped batch id, but resets the backoff key
    more = synthesis_batch(facts + [fact(40, importance=5)], S)
    assert more is not None and more.reflection_id == batch.reflection_id and more.backoff_key != batch.backoff_key


def test_synthesis_backoff_dead_letters_then_self_heals() -> None:
    backoff: dict = {}
    for _ in range(5):
        assert synthesis_allowed(backoff, "k", T0, S)
        backoff = record_synthesis_failure(backoff, "k", T0)
    assert not synthesis_allowed(backoff, "k", T0 + timedelta(hours=4, minutes=59), S)
    assert synthesis_allowed(backoff, "k", T0 + timedelta(hours=5), S)
    assert clear_synthesis_backoff(backoff, "k") == {}


def _batch():
    facts = [fact(i) for i in range(4)] + [fact(7, importance=10)]
    batch = synthesis_batch(facts, S)
    assert batch is not None
    return batch


def test_build_reflection_from_output() -> None:
    batch = _batch()
    out = {
        "reflection": {
            "text": "Master studies late at night",
            "entity": "MASTER",
            "time_scope": "state",
            "event_start_at": "2024-02-20",
            "event_end_at": None,
        }
    }
    r = build_reflection(out, batch, T0, S, words)
    assert r is not None
    assert r.id == batch.reflection_id and r.status == "pending" and r.entity == "master"
    assert r.reinforcement == pytest.approx(0.8) and r.rein_last_signal_at == to_iso(T0)  # seed for importance 10
    assert r.next_eligible_at == to_iso(T0 + timedelta(minutes=30))
    assert r.temporal_scope == "state" and r.event_end_at == r.event_start_at == "2024-02-20T00:00:00+00:00"
    assert r.schema_version == 2 and r.source_fact_ids == batch.source_fact_ids


def test_build_reflection_validation() -> None:
    batch = _batch()
    assert build_reflection({"reflection": None}, batch, T0, S, words) is None
    assert build_reflection({"reflection": {"text": "  ", "entity": "master", "time_scope": "pattern"}}, batch, T0, S, words) is None
    odd = build_reflection(
        {
            "reflection": {
                "text": "x",
                "entity": "cat",
                "time_scope": "pattern",
                "event_start_at": "2024-01-01",
                "event_end_at": "2024-01-05",
            }
        },
        batch,
        T0,
        S,
        words,
    )
    assert odd is not None and odd.entity == "relationship" and odd.event_end_at is None
    long_text = " ".join(["w"] * 151)
    long = build_reflection({"reflection": {"text": long_text, "entity": "neko", "time_scope": "episode"}}, batch, T0, S, words)
    assert long is not None and long.temporal_scope is None and long.text == long_text


def test_add_reflection_is_idempotent() -> None:
    batch = _batch()
    r = build_reflection({"reflection": {"text": "x", "entity": "master", "time_scope": "pattern"}}, batch, T0, S, words)
    refs, added = add_reflection([], r)
    refs, added_again = add_reflection(refs, r)
    assert added and not added_again and len(refs) == 1


# --- transitions and feedback -------------------------------------------------------------


def test_transitions_are_compare_and_swap() -> None:
    r = confirm(ref(), T0)
    assert r.status == "confirmed" and r.confirmed_at == to_iso(T0)
    with pytest.raises(TransitionError):
        confirm(r, T0)
    with pytest.raises(TransitionError):
        mark_promoted(ref(), T0)  # pending cannot be promoted
    with pytest.raises(TransitionError):
        transition(ref(status="denied"), "confirmed", T0)
    assert mark_promoted(r, T0).promoted_at == to_iso(T0)


def test_feedback_drives_confirmation_and_promotability() -> None:
    r = ref(reinforcement=0.8, rein_last_signal_at=to_iso(T0))  # seed of an importance-10 batch
    r = apply_feedback(r, "confirmed", T0, S)
    refs, changed = evidence_confirmations([r], T0, S)
    assert changed == ["ref_a"] and refs[0].status == "confirmed"
    assert promotable(refs, T0, S) == []
    again = apply_feedback(refs[0], "confirmed", T0, S)
    assert net_score(again, T0, S) == pytest.approx(2.8)
    assert promotable([again], T0, S) == [again]


def test_denied_feedback_denies_and_ignored_lowers() -> None:
    denied = apply_feedback(ref(status="confirmed"), "denied", T0, S)
    assert denied.status == "denied" and denied.disputation == 1.0 and denied.denied_reason == "user_denied"
    ignored = apply_feedback(ref(), "ignored", T0, S)
    assert ignored.status == "pending" and ignored.reinforcement == pytest.approx(-0.2)
    promoted = apply_feedback(ref(status="promoted"), "denied", T0, S)
    assert promoted.status == "promoted" and promoted.disputation == 1.0
    with pytest.raises(ValueError):
        apply_feedback(ref(), "maybe", T0, S)


def test_direct_confirm_moves_pending_to_confirmed() -> None:
    r = confirm_by_user(ref(), T0, S)
    assert r.status == "confirmed" and r.reinforcement == 1.0


def test_interpret_and_record_feedback() -> None:
    got = interpret_feedback(
        {
            "feedback": [
                {"reflection_id": "ref_a", "feedback": "confirmed"},
                {"reflection_id": "ref_a", "feedback": "denied"},
                {"reflection_id": "ref_x", "feedback": "denied"},
            ]
        },
        ["ref_a", "ref_b"],
    )
    assert got == [("ref_a", "confirmed")]
    surfaced = [
        SurfacedEntry(reflection_id="ref_a", text="t", surfaced_at=to_iso(T0)),
        SurfacedEntry(reflection_id="ref_b", text="u", surfaced_at=to_iso(T0), feedback="denied"),
    ]
    out = record_feedback(surfaced, "ref_a", "ignored", T0)
    assert out[0].feedback == "ignored" and out[0].feedback_at == to_iso(T0)
    out = record_feedback(out, "ref_a", "confirmed", T0)
    assert out[0].feedback == "ignored"  # only null / confirmed / auto_confirmed can be overwritten
    assert record_feedback(out, "ref_b", "confirmed", T0)[1].feedback == "denied"


def test_check_feedback_prompt_lists_ids() -> None:
    body = check_feedback_messages([("ref_a", "Master likes tea")], [Turn("human", "I hate tea now")], master_name="Alex", ai_name="Neko")[
        1
    ]["content"]
    assert "[ref_a] Master likes tea" in body and "Alex | I hate tea now" in body


# --- disputation --------------------------------------------------------------------------


def test_negative_keywords_and_context() -> None:
    assert contains_negative_keyword(["Please STOP talking about my ex"], S)
    assert contains_negative_keyword(["别再说这个了"], S)
    assert not contains_negative_keyword(["I love talking about cats"], S)
    turns = [Turn("human", str(i)) if i % 2 == 0 else Turn("ai", str(i)) for i in range(10)]
    assert [t.text for t in disputation_context(turns, S)] == ["4", "6", "8"]


def test_keyword_rebut_adds_disputation() -> None:
    refs, changed = apply_disputed([ref(), ref("ref_b")], ["ref_b"], T0, S)
    assert changed == ["ref_b"] and refs[1].disputation == 1.0 and refs[0].disputation == 0.0


def test_rebuttal_batch_caps_and_keeps_same_timestamp_cluster() -> None:
    rows = [Turn("human", f"m{i}", ts=f"2024-03-01T12:{i:02d}:00+00:00") for i in range(19)]
    rows += [Turn("ai", "reply", ts="2024-03-01T12:19:00+00:00")]
    rows += [Turn("human", f"c{i}", ts="2024-03-01T12:30:00+00:00") for i in range(3)]
    rows += [Turn("human", "later", ts="2024-03-01T12:40:00+00:00")]
    batch = rebuttal_batch(rows, S)
    assert len(batch.messages) == 22 and batch.messages[-1].text == "c2"
    assert batch.advance_to == "2024-03-01T12:30:00+00:00"
    only_ai = rebuttal_batch([Turn("ai", "x", ts="2024-03-01T13:00:00+00:00")], S)
    assert only_ai.messages == [] and only_ai.advance_to == "2024-03-01T13:00:00+00:00"
    assert rebuttal_window_start(None, T0, S) == T0 - timedelta(hours=1)


def test_rebuttal_denies_confirmed_only() -> None:
    refs, changed = apply_rebuttals(
        [ref(status="confirmed"), ref("ref_b"), ref("ref_c", status="confirmed")],
        [("ref_a", "denied"), ("ref_b", "denied"), ("ref_c", "ignored")],
        T0,
    )
    assert changed == ["ref_a"] and [r.status for r in refs] == ["denied", "pending", "confirmed"]
    assert refs[0].denied_reason == "user_rebuttal"


# --- surfacing and mentions -----------------------------------------------------------------


def test_followup_candidates_filters() -> None:
    refs = [
        ref("ref_ok", text="one"),
        ref("ref_cool", text="two", next_eligible_at=to_iso(T0 + timedelta(minutes=1))),
        ref("ref_neg", text="three", disputation=1.0),
        ref("ref_dup", text="ONE  "),
        ref("ref_conf", text="four", status="confirmed"),
    ]
    assert [r.id for r in followup_candidates(refs, T0, S, random.Random(1))] == ["ref_ok"]


def test_followup_sampling_picks_three_distinct() -> None:
    refs = [ref(f"ref_{i}", text=f"topic {i}", reinforcement=float(i) / 10) for i in range(8)]
    for seed in range(5):
        picked = followup_candidates(refs, T0, S, random.Random(seed))
        assert len(picked) == 3 and len({r.id for r in picked}) == 3
    top = followup_candidates(refs, T0, LongTermSettings(reflection_followup_weighted=False), random.Random(0))
    assert [r.id for r in top] == ["ref_7", "ref_6", "ref_5"]


def test_record_surfaced_pushes_cooldown_and_resets_feedback() -> None:
    refs = [ref(), ref("ref_b")]
    surfaced = [SurfacedEntry(reflection_id="ref_a", text="old", surfaced_at="2024-01-01T00:00:00+00:00", feedback="ignored")]
    new_refs, new_surfaced = record_surfaced(refs, surfaced, ["ref_a", "ref_b", "ref_zz"], T0, S)
    assert all(r.next_eligible_at == to_iso(T0 + timedelta(minutes=30)) for r in new_refs)
    assert [(s.reflection_id, s.feedback, s.surfaced_at) for s in new_surfaced] == [
        ("ref_a", None, to_iso(T0)),
        ("ref_b", None, to_iso(T0)),
    ]


def test_mentions_more_than_twice_in_five_hours_suppress() -> None:
    r = ref(status="confirmed")
    for h in (0, 2, 4):
        r = record_mention(r, T0 + timedelta(hours=h), S)
    assert r.suppress and r.suppressed_at == to_iso(T0 + timedelta(hours=4))
    assert is_suppressed(r, T0 + timedelta(hours=8, minutes=59), S)
    lifted = refresh_suppression(r, T0 + timedelta(hours=9), S)
    assert not lifted.suppress and lifted.recent_mentions == []


def test_mentions_spread_out_do_not_suppress() -> None:
    r = ref(status="confirmed")
    for h in (0, 3, 6):
        r = record_mention(r, T0 + timedelta(hours=h), S)
    assert not r.suppress and len(r.recent_mentions) == 2


def test_reply_mentions_only_touch_confirmed() -> None:
    assert is_mentioned("Want some tea today?", "Master likes tea", ["Master"])
    assert not is_mentioned("Master, hello!", "Master likes tea", ["Master"])
    refs = [ref(status="confirmed"), ref("ref_p")]
    out, ids = record_reply_mentions(refs, "more tea?", T0, S, ["Master"])
    assert ids == ["ref_a"] and out[1].recent_mentions == []


# --- time scopes and the time-driven fallback ------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "age_days", "past"),
    [
        ("state", 8, True),
        ("state", 6, False),
        ("episode", 4, True),
        ("episode", 2, False),
        ("pattern", 100, False),
        (None, 100, False),
        ("past", 0, True),
        ("ongoing", 100, False),
    ],
)
def test_stale_rules(scope, age_days, past) -> None:
    r = ref(status="confirmed", temporal_scope=scope, event_start_at=to_iso(T0 - timedelta(days=age_days)))
    assert is_past_for_render(r, T0, S) is past


def test_stale_anchor_prefers_end_time() -> None:
    r = ref(
        status="confirmed",
        temporal_scope="state",
        event_start_at=to_iso(T0 - timedelta(days=30)),
        event_end_at=to_iso(T0 - timedelta(days=1)),
    )
    assert not is_past_for_render(r, T0, S)


def test_time_driven_confirm_then_promote() -> None:
    refs = [
        ref("ref_old", created_at=to_iso(T0 - timedelta(days=7))),
        ref("ref_young", created_at=to_iso(T0 - timedelta(days=6, hours=23))),
        ref("ref_c", status="confirmed", confirmed_at=to_iso(T0 - timedelta(days=7))),
        ref("ref_c2", status="confirmed", confirmed_at=to_iso(T0 - timedelta(days=6))),
    ]
    out, changed = time_driven_confirmations(refs, T0, S)
    assert changed == ["ref_old"] and out[0].auto_confirmed and out[0].confirmed_at == to_iso(T0)
    assert [r.id for r in time_driven_promotable(out, T0, S)] == ["ref_c"]
    # the one confirmed in this pass waits 7 more days
    assert [r.id for r in time_driven_promotable(out, T0 + timedelta(days=7), S)] == ["ref_old", "ref_c", "ref_c2"]


def test_reset_confirmed_at() -> None:
    refs = [ref(status="confirmed", confirmed_at="2023-01-01T00:00:00+00:00"), ref("ref_b")]
    out, count = reset_confirmed_at(refs, T0)
    assert count == 1 and out[0].confirmed_at == to_iso(T0) and out[1].confirmed_at is None
    assert time_driven_promotable(out, T0 + timedelta(days=6), S) == []


# --- archive ---------------------------------------------------------------------------------


def test_archive_sweep_over_distinct_days() -> None:
    refs = [
        ref("ref_neg", disputation=5.0, disp_last_signal_at=to_iso(T0)),
        ref("ref_pos", reinforcement=1.0),
        ref("ref_merged", status="merged", disputation=5.0),
    ]
    for day in range(13):
        for tick in range(3):  # several sweeps a day count once
            sweep = archive_sweep(refs, T0 + timedelta(days=day, hours=tick), S)
            refs = sweep.kept
    assert {r.id: r.sub_zero_days for r in refs} == {"ref_neg": 13, "ref_pos": 0, "ref_merged": 0}
    sweep = archive_sweep(refs, T0 + timedelta(days=13), S)
    assert [r.id for r in sweep.archived] == ["ref_neg"] and sweep.archived[0].status == "archived"
    assert sweep.archived[0].archived_at == to_iso(T0 + timedelta(days=13))
    assert [r.id for r in sweep.kept] == ["ref_pos", "ref_merged"]


def test_age_out_terminal() -> None:
    refs = [
        ref("ref_p", status="promoted", promoted_at=to_iso(T0 - timedelta(days=31))),
        ref("ref_d", status="denied", denied_at=to_iso(T0 - timedelta(days=29))),
        ref("ref_m", status="merged", created_at=to_iso(T0 - timedelta(days=300))),
    ]
    kept, moved = age_out_terminal(refs, T0, S)
    assert [r.id for r in moved] == ["ref_p"] and [r.id for r in kept] == ["ref_d", "ref_m"]


def test_synthesis_prompt_includes_related_block() -> None:
    messages = synthesize_reflection_messages([fact(1)], [fact(2)], now=T0, master_name="Alex", ai_name="Neko", settings=S)
    assert "RELATED HISTORY" in messages[1]["content"] and "(importance: 6" in messages[1]["content"]
    assert (
        "RELATED HISTORY>>>"
        not in synthesize_reflection_messages([fact(1)], now=T0, master_name="A", ai_name="N", settings=S)[1]["content"]
    )


def test_map_evidence_signals_apply_to_reflections() -> None:
    refs = [ref(status="confirmed"), ref("ref_b", status="confirmed")]
    sigs = [
        ResolvedSignal("fact_1", "reflection", "ref_a", "master", "reinforce"),
        ResolvedSignal("fact_2", "reflection", "ref_a", "master", "reinforce"),
        ResolvedSignal("fact_3", "reflection", "ref_a", "master", "reinforce"),
        ResolvedSignal("fact_1", "persona", "ref_b", "master", "negate"),  # not a reflection target
        ResolvedSignal("fact_4", "reflection", "ref_b", "master", "negate"),
    ]
    out, changed = apply_resolved_signals(refs, sigs, T0, S)
    assert changed == ["ref_a", "ref_b"]
    assert out[0].reinforcement == pytest.approx(2.0)  # 0.5 + 0.5 + 1.0
    assert out[1].disputation == pytest.approx(1.0)
