"""Facts: normalising, dedup, duplicate judgments, schedule, archive."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.fact_dedup import apply_duplicate_decisions, dedup_new_facts, enqueue_pairs, paraphrase_pairs
from nekomem.domain.facts import (
    archive_split,
    clamp_importance,
    extraction_due,
    extraction_window_start,
    jaccard,
    known_pool,
    mark_absorbed,
    normalize_extraction,
    normalize_fact,
    self_disclosure_due,
    self_disclosure_window_start,
    signal_batch,
    text_keywords,
    trim_to_user_span,
)
from nekomem.domain.prompts.longterm import extract_facts_messages, judge_duplicates_messages
from nekomem.domain.records import Fact, fact_hash, fact_id, to_iso
from nekomem.domain.turns import Turn

S = LongTermSettings()
T0 = datetime(2024, 3, 1, 12, 30, 5, tzinfo=timezone.utc)


def fact(fid: str, text: str, **kw) -> Fact:
    base = dict(id=fid, text=text, hash=fact_hash(text), created_at=to_iso(T0))
    base.update(kw)
    return Fact(**base)


def test_fact_id_and_hash_follow_the_reference_scheme() -> None:
    digest = hashlib.sha256(b"Master likes tea").hexdigest()
    assert fact_hash("  Master likes tea \n") == digest[:16]
    assert fact_id(T0, "Master likes tea") == "fact_20240301123005_" + digest[:8]


@pytest.mark.parametrize(("raw", "expected"), [(12, 10), (0, 1), (-3, 1), ("7", 7), ("abc", 5), (None, 5), (6.6, 7)])
def test_importance_clamp(raw, expected) -> None:
    assert clamp_importance(raw, S) == expected


def test_normalize_fact_fields_and_event_times() -> None:
    f = normalize_fact(
        {
            "text": "  Master has an exam  ",
            "importance": 11,
            "entity": "Dragon",
            "event_start_at": "2024-03-05",
            "event_end_at": "2024-03-04",
        },
        now=T0,
        source="user_observation",
        settings=S,
    )
    assert f is not None
    assert f.text == "Master has an exam" and f.importance == 10 and f.entity == "master"
    assert f.event_start_at == "2024-03-05T00:00:00+00:00"
    assert f.event_end_at is None  # end before start is dropped
    assert f.signal_processed is False and f.absorbed is False and f.created_at == to_iso(T0)
    bad = normalize_fact({"text": "x", "event_start_at": "next tuesday"}, now=T0, source="ai_disclosure", settings=S)
    assert bad is not None and bad.event_start_at == to_iso(T0) and bad.signal_processed is True
    assert normalize_fact({"text": "   "}, now=T0, source="user_observation", settings=S) is None


def test_normalize_extraction_accepts_structs_and_drops_same_text() -> None:
    out = normalize_extraction(
        {"facts": [{"text": "a b"}, {"text": "a b "}, {"text": ""}, {"text": "c d", "entity": "neko"}]},
        now=T0,
        source="user_observation",
        settings=S,
    )
    assert [(f.text, f.entity) for f in out] == [("a b", "master"), ("c d", "neko")]


def test_exact_dedup_skips_and_upgrades_ai_disclosure() -> None:
    existing = [fact("fact_old", "Neko likes fish", source="ai_disclosure", entity="neko")]
    new = normalize_extraction(
        {"facts": [{"text": "Neko likes fish ", "entity": "neko"}, {"text": "Master is tired"}, {"text": "Master is tired"}]},
        now=T0,
        source="user_observation",
        settings=S,
    )
    out = dedup_new_facts(new, existing, S)
    assert [f.text for f in out.accepted] == ["Master is tired"]
    assert [(f.id, f.source, f.signal_processed) for f in out.upgraded] == [("fact_old", "user_observation", False)]
    assert out.skipped_exact[0][1] == "fact_old"


def test_exact_dedup_never_downgrades() -> None:
    existing = [fact("fact_old", "Master is tired", source="user_observation")]
    new = normalize_extraction({"facts": [{"text": "Master is tired"}]}, now=T0, source="ai_disclosure", settings=S)
    out = dedup_new_facts(new, existing, S)
    assert out.accepted == [] and out.upgraded == []


def test_lexical_near_duplicates() -> None:
    assert text_keywords("主人喜欢猫") == {"主人", "人喜", "喜欢", "欢猫", "主人喜", "人喜欢", "喜欢猫"}
    assert jaccard(text_keywords("Master likes cats"), text_keywords("Master likes dogs")) == pytest.approx(0.5)
    existing = [fact("fact_1", "Master likes green tea very much.")]
    new = [
        fact("fact_2", "master likes GREEN tea very much!"),  # same token set -> near duplicate
        fact("fact_3", "Master likes black coffee very much."),
        fact("fact_4", "Master likes green tea very much.", entity="neko", hash="other"),  # other entity
    ]
    out = dedup_new_facts(new, existing, S)
    assert [f.id for f in out.accepted] == ["fact_3", "fact_4"]
    assert out.skipped_near == [(new[0].hash, "fact_1")]


def test_paraphrase_pairs_threshold_cap_and_bucket() -> None:
    new = fact("fact_new", "Master adores cats")
    others = [
        (fact("f1", "a"), 0.84),
        (fact("f2", "b"), 0.85),
        (fact("f3", "c"), 0.95),
        (fact("f4", "d"), 0.90),
        (
            fact("f5", "e"),
            0.99,
        ),
        (fact("f6", "f", absorbed=True), 0.99),
        (fact("f7", "g", entity="neko"), 0.99),
        (new, 1.0),
    ]
    pairs = paraphrase_pairs(new, others, T0, S)
    assert [(p.existing_id, p.cosine) for p in pairs] == [("f5", 0.99), ("f3", 0.95), ("f4", 0.90)]
    queue = enqueue_pairs([], pairs)
    reverse = paraphrase_pairs(fact("f5", "e"), [(new, 0.99)], T0, S)
    assert len(enqueue_pairs(queue, reverse)) == 3


def _queue():
    a = fact("fact_a", "Master likes cats", importance=6, merged_from_ids=["fact_z"])
    b = fact("fact_b", "Master loves cats", importance=9)
    c = fact("fact_c", "Master hates rain", importance=10)
    d = fact("fact_d", "Master dislikes rain", importance=10)
    pairs = paraphrase_pairs(b, [(a, 0.9)], T0, S) + paraphrase_pairs(d, [(c, 0.9)], T0, S)
    return [a, b, c, d], pairs


def test_merge_drops_candidate_and_bumps_existing() -> None:
    facts, queue = _queue()
    out = apply_duplicate_decisions(
        facts,
        queue,
        queue,
        {
            "decisions": [
                {"new_id": "fact_b", "existing_id": "fact_a", "action": "merge", "text": None},
                {"new_id": "fact_b", "existing_id": "fact_a", "action": "keep_both", "text": None},  # first wins
                {"new_id": "fact_d", "existing_id": "fact_c", "action": "merge", "text": "Master hates rainy days"},
            ]
        },
        S,
    )
    by_id = {f.id: f for f in out.facts}
    assert set(by_id) == {"fact_a", "fact_c"}
    assert by_id["fact_a"].importance == 7 and by_id["fact_a"].merged_from_ids == ["fact_z", "fact_b"]
    assert by_id["fact_c"].importance == 10  # capped
    assert by_id["fact_c"].text == "Master hates rainy days" and by_id["fact_c"].hash == fact_hash("Master hates rainy days")
    assert out.queue == [] and out.decided == 2 and sorted(out.removed_ids) == ["fact_b", "fact_d"]


def test_replace_keeps_candidate_with_max_importance_and_chain() -> None:
    facts, queue = _queue()
    out = apply_duplicate_decisions(
        facts,
        queue,
        queue[:1],
        {
            "decisions": [
                {"new_id": "fact_b", "existing_id": "fact_a", "action": "replace", "text": None},
            ]
        },
        S,
    )
    by_id = {f.id: f for f in out.facts}
    assert "fact_a" not in by_id
    assert by_id["fact_b"].importance == 9 and by_id["fact_b"].merged_from_ids == ["fact_a", "fact_z"]
    assert [p.candidate_id for p in out.queue] == ["fact_d"]  # undecided pair stays queued


def test_keep_both_and_vanished_pairs_are_consumed() -> None:
    facts, queue = _queue()
    out = apply_duplicate_decisions(
        [f for f in facts if f.id != "fact_c"],
        queue,
        queue,
        {
            "decisions": [
                {"new_id": "fact_b", "existing_id": "fact_a", "action": "keep_both", "text": None},
                {"new_id": "fact_d", "existing_id": "fact_c", "action": "merge", "text": None},
            ]
        },
        S,
    )
    assert [f.id for f in out.facts] == ["fact_a", "fact_b", "fact_d"]
    assert out.queue == [] and out.removed_ids == []


def test_no_usable_decision_counts_attempts_and_dead_letters() -> None:
    facts, queue = _queue()
    for attempt in range(1, 5):
        out = apply_duplicate_decisions(facts, queue, queue, {"decisions": [{"new_id": "x", "existing_id": "y", "action": "merge"}]}, S)
        queue = out.queue
        assert all(p.resolve_attempts == attempt for p in queue)
    out = apply_duplicate_decisions(facts, queue, queue, {"decisions": []}, S)
    assert out.queue == [] and len(out.dropped_pairs) == 2


def test_judge_duplicates_prompt_shows_both_ids() -> None:
    _, queue = _queue()
    body = judge_duplicates_messages(queue, master_name="Master", ai_name="Neko")[1]["content"]
    assert "new_id: fact_b" in body and "existing_id: fact_a" in body


def test_extraction_trigger() -> None:
    checked = T0 - timedelta(minutes=4)
    active = T0 - timedelta(seconds=2)
    assert extraction_due(10, checked, active, T0, S)
    assert not extraction_due(9, checked, active, T0, S)
    assert extraction_due(1, T0 - timedelta(minutes=5), active, T0, S)
    assert not extraction_due(0, T0 - timedelta(hours=1), None, T0, S)
    # never run: 10 s idle is enough
    assert extraction_due(1, None, T0 - timedelta(seconds=10), T0, S)
    assert not extraction_due(1, None, T0 - timedelta(seconds=9), T0, S)
    # after the first run the idle rule is off by default, on by setting
    assert not extraction_due(1, checked, T0 - timedelta(seconds=30), T0, S)
    assert extraction_due(1, checked, T0 - timedelta(seconds=30), T0, LongTermSettings(fact_extract_idle_requires_first_run=False))


def test_windows_and_cadence() -> None:
    assert extraction_window_start(None, T0, S) == T0 - timedelta(minutes=10)
    assert extraction_window_start(T0 - timedelta(minutes=3), T0, S) == T0 - timedelta(minutes=3)
    assert self_disclosure_window_start(None, T0, S) == T0 - timedelta(minutes=50)
    assert [self_disclosure_due(n, S) for n in (0, 1, 2, 3)] == [False, False, False, True]


def test_trim_to_user_span_and_known_pool() -> None:
    turns = [Turn("ai", "hi"), Turn("human", "a"), Turn("ai", "b"), Turn("human", "c"), Turn("ai", "d")]
    assert [t.text for t in trim_to_user_span(turns, S)] == ["a", "b", "c"]
    assert trim_to_user_span([Turn("ai", "x")], S) == []
    facts = [fact(f"f{i}", f"t{i}", importance=i, created_at=to_iso(T0 + timedelta(minutes=i))) for i in range(1, 6)]
    pool = known_pool(facts, T0 + timedelta(minutes=2), T0, LongTermSettings(fact_self_disclosure_known_pool_max=2))
    assert [f.id for f in pool] == ["f5", "f4"]


def test_signal_batch_order_and_cap() -> None:
    facts = [
        fact("a", "a", importance=5, signal_processed=False, created_at="2024-03-01T10:00:00+00:00"),
        fact("b", "b", importance=9, signal_processed=False, created_at="2024-03-01T11:00:00+00:00"),
        fact("c", "c", importance=9, signal_processed=False, created_at="2024-03-01T09:00:00+00:00"),
        fact("d", "d", importance=10, signal_processed=True),
        fact("e", "e", importance=10, signal_processed=False, source="ai_disclosure"),
    ]
    assert [f.id for f in signal_batch(facts, S)] == ["c", "b", "a"]
    assert [f.id for f in signal_batch(facts, LongTermSettings(evidence_map_max_new_facts=1))] == ["c"]


def test_fact_archive_split_and_cooldown() -> None:
    facts = [
        fact("old_absorbed", "a", absorbed=True, created_at=to_iso(T0 - timedelta(days=8))),
        fact("young_absorbed", "b", absorbed=True, created_at=to_iso(T0 - timedelta(days=6))),
        fact("old_free", "c", absorbed=False, created_at=to_iso(T0 - timedelta(days=30))),
    ]
    assert archive_split(facts, T0, T0 - timedelta(hours=23), S) is None
    kept, archived = archive_split(facts, T0, T0 - timedelta(hours=24), S)
    assert [f.id for f in archived] == ["old_absorbed"]
    assert [f.id for f in kept] == ["young_absorbed", "old_free"]
    assert archive_split(facts, T0, None, S) is not None


def test_mark_absorbed_is_monotonic() -> None:
    facts = [fact("a", "a"), fact("b", "b", absorbed=True)]
    out = mark_absorbed(facts, ["a"])
    assert [f.absorbed for f in out] == [True, True]
    assert out[1] is facts[1]


def test_extract_prompt_carries_the_conversation_and_shape() -> None:
    messages = extract_facts_messages([Turn("human", "I have a cat named Mimi")], now=T0, master_name="Alex", ai_name="Neko")
    assert messages[0]["role"] == "system" and '"facts"' in messages[0]["content"]
    assert "2024-03-01T12:30" in messages[0]["content"]
    assert "Alex | I have a cat named Mimi" in messages[1]["content"]
