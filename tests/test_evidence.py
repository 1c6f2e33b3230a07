"""Evidence model: decay on read, weights, the combo rule, tiers, below-zero days."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone

import msgspec
import pytest

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    apply_signal,
    archive_due,
    derive_tier,
    effective_disputation,
    effective_reinforcement,
    merge_evidence,
    net_score,
    observation_pool,
    resolve_disputed,
    resolve_signals,
    seed_reinforcement,
    snapshot,
    track_below_zero,
)
from nekomem.domain.prompts.longterm import cap_observations, map_evidence_messages
from nekomem.domain.records import Fact, Observation, PersonaEntry, Reflection, assign_shards, shard_name, to_iso

S = LongTermSettings()
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)


def ref(**kw) -> Reflection:
    base = dict(id="ref_a", text="Master likes tea", status="confirmed", created_at=to_iso(T0))
    base.update(kw)
    return Reflection(**base)


def test_reinforcement_halves_after_30_days_and_quarters_after_60() -> None:
    r = ref(reinforcement=1.0, rein_last_signal_at=to_iso(T0))
    assert effective_reinforcement(r, T0 + timedelta(days=30), S) == pytest.approx(0.5)
    assert effective_reinforcement(r, T0 + timedelta(days=60), S) == pytest.approx(0.25)
    assert effective_reinforcement(r, T0 + timedelta(days=15), S) == pytest.approx(2**-0.5)


def test_disputation_halves_after_180_days() -> None:
    r = ref(disputation=1.0, disp_last_signal_at=to_iso(T0))
    assert effective_disputation(r, T0 + timedelta(days=180), S) == pytest.approx(0.5)
    assert effective_disputation(r, T0 + timedelta(days=30), S) == pytest.approx(0.5 ** (30 / 180))


def test_net_score_combines_both_sides_with_their_own_clocks() -> None:
    r = ref(reinforcement=2.0, rein_last_signal_at=to_iso(T0), disputation=1.0, disp_last_signal_at=to_iso(T0))
    # after 180 days: rein 2 * 0.5**6 = 0.03125, disp 0.5
    assert net_score(r, T0 + timedelta(days=180), S) == pytest.approx(0.03125 - 0.5)


def test_decay_is_not_written_back_by_reads() -> None:
    r = ref(reinforcement=1.0, rein_last_signal_at=to_iso(T0))
    net_score(r, T0 + timedelta(days=90), S)
    assert r.reinforcement == 1.0


def test_missing_or_future_timestamp_means_no_decay() -> None:
    assert effective_reinforcement(ref(reinforcement=1.0), T0, S) == 1.0
    future = ref(reinforcement=1.0, rein_last_signal_at=to_iso(T0 + timedelta(days=5)))
    assert effective_reinforcement(future, T0, S) == 1.0


def test_half_life_is_a_setting() -> None:
    short = LongTermSettings(evidence_rein_half_life_days=10)
    r = ref(reinforcement=1.0, rein_last_signal_at=to_iso(T0))
    assert effective_reinforcement(r, T0 + timedelta(days=10), short) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("signal", "source", "rein", "disp"),
    [
        ("reinforce", "user_confirm", 1.0, 0.0),
        ("negate", "user_rebut", 0.0, 1.0),
        ("negate", "user_keyword_rebut", 0.0, 1.0),
        ("ignore", "user_ignore", -0.2, 0.0),
        ("reinforce", "user_fact", 0.5, 0.0),
        ("negate", "user_fact", 0.0, 1.0),
    ],
)
def test_signal_weights(signal, source, rein, disp) -> None:
    out = apply_signal(ref(), signal, source, T0, S)
    assert out.reinforcement == pytest.approx(rein)
    assert out.disputation == pytest.approx(disp)


def test_signal_touches_only_its_own_side_and_clock() -> None:
    r = ref(reinforcement=1.0, rein_last_signal_at=to_iso(T0))
    later = T0 + timedelta(days=30)
    out = apply_signal(r, "negate", "user_rebut", later, S)
    assert out.reinforcement == 1.0 and out.rein_last_signal_at == to_iso(T0)
    assert out.disp_last_signal_at == to_iso(later)
    assert net_score(out, later, S) == pytest.approx(0.5 - 1.0)


def test_signal_rebases_the_decayed_value() -> None:
    r = ref(reinforcement=1.0, rein_last_signal_at=to_iso(T0))
    later = T0 + timedelta(days=30)
    out = apply_signal(r, "reinforce", "user_confirm", later, S)
    assert out.reinforcement == pytest.approx(1.5)  # 0.5 left + 1.0
    assert out.rein_last_signal_at == to_iso(later)


def test_ignore_can_make_reinforcement_negative() -> None:
    out = apply_signal(ref(), "ignore", "user_ignore", T0, S)
    out = apply_signal(out, "ignore", "user_ignore", T0, S)
    assert out.reinforcement == pytest.approx(-0.4)


def test_third_inferred_reinforcement_counts_double() -> None:
    r = ref()
    totals = []
    for _ in range(4):
        r = apply_signal(r, "reinforce", "user_fact", T0, S)
        totals.append(r.reinforcement)
    assert totals == pytest.approx([0.5, 1.0, 2.0, 3.0])
    assert r.user_fact_reinforce_count == 4


def test_combo_counter_is_lifetime_and_ignores_other_sources() -> None:
    r = ref()
    r = apply_signal(r, "reinforce", "user_fact", T0, S)
    r = apply_signal(r, "reinforce", "user_confirm", T0, S)  # not counted
    r = apply_signal(r, "negate", "user_fact", T0, S)  # not counted
    assert r.user_fact_reinforce_count == 1
    r = apply_signal(r, "reinforce", "user_fact", T0 + timedelta(days=30), S)
    # 1.5 decayed to 0.75, + 0.5 (second inferred one)
    assert r.reinforcement == pytest.approx(1.25)
    r = apply_signal(r, "reinforce", "user_fact", T0 + timedelta(days=60), S)
    # 1.25 decayed to 0.625, + 1.0 (third inferred one)
    assert r.reinforcement == pytest.approx(1.625)
    assert r.user_fact_reinforce_count == 3


def test_invalid_signal_source_pair_raises() -> None:
    with pytest.raises(ValueError):
        apply_signal(ref(), "negate", "user_confirm", T0, S)
    with pytest.raises(ValueError):
        apply_signal(ref(), "ignore", "user_fact", T0, S)


def test_signals_return_new_records() -> None:
    r = ref()
    out = apply_signal(r, "reinforce", "user_confirm", T0, S)
    assert out is not r and r.reinforcement == 0.0


@pytest.mark.parametrize(
    ("score", "tier"),
    [(2.0, "promoted"), (1.99, "confirmed"), (1.0, "confirmed"), (0.99, "pending"), (-1.99, "pending"), (-2.0, "archive_candidate")],
)
def test_tiers(score, tier) -> None:
    assert derive_tier(score, S) == tier


def test_seed_table() -> None:
    assert [seed_reinforcement(i, S) for i in (10, 9, 8, 7, 6, 1)] == [0.8, 0.6, 0.4, 0.2, 0.0, 0.0]


def protected_entry() -> PersonaEntry:
    return PersonaEntry(id="card_x", text="name: Neko", source="character_card", protected=True, disputation=5.0)


def test_protected_entries_have_infinite_score_and_ignore_signals() -> None:
    p = protected_entry()
    assert net_score(p, T0, S) == math.inf
    assert snapshot(p, T0, S).tier == "promoted"
    assert apply_signal(p, "negate", "user_rebut", T0, S) is p
    assert track_below_zero(p, T0, S) is p
    assert not archive_due(msgspec.structs.replace(p, sub_zero_days=99), S)


def negative() -> Reflection:
    return ref(disputation=3.0, disp_last_signal_at=to_iso(T0))


def test_below_zero_days_count_once_per_calendar_day() -> None:
    r = negative()
    for hour in range(14):
        r = track_below_zero(r, T0 + timedelta(minutes=40 * hour), S)
    assert r.sub_zero_days == 1
    assert not archive_due(r, S)


def test_archive_after_14_distinct_days_below_zero() -> None:
    r = negative()
    for day in range(13):
        r = track_below_zero(r, T0 + timedelta(days=day), S)
    assert r.sub_zero_days == 13 and not archive_due(r, S)
    r = track_below_zero(r, T0 + timedelta(days=13), S)
    assert r.sub_zero_days == 14 and archive_due(r, S)


def test_below_zero_counter_never_goes_down_and_skips_non_negative_days() -> None:
    r = track_below_zero(negative(), T0, S)
    recovered = r
    for _ in range(4):
        recovered = apply_signal(recovered, "reinforce", "user_confirm", T0 + timedelta(days=1), S)
    assert net_score(recovered, T0 + timedelta(days=2), S) > 0
    after = track_below_zero(recovered, T0 + timedelta(days=2), S)
    assert after.sub_zero_days == 1


def test_merge_evidence_takes_max_of_each_side_and_resets_clocks() -> None:
    now = T0 + timedelta(days=30)
    target = PersonaEntry(
        id="p1",
        text="x",
        reinforcement=1.0,
        rein_last_signal_at=to_iso(T0),
        disputation=0.2,
        disp_last_signal_at=to_iso(now),
        sub_zero_days=5,
    )
    other = ref(reinforcement=0.8, rein_last_signal_at=to_iso(now), disputation=0.0)
    merged = merge_evidence(target, other, now, S)
    assert merged.reinforcement == pytest.approx(0.8)  # target decayed to 0.5 < 0.8
    assert merged.disputation == pytest.approx(0.2)
    assert merged.rein_last_signal_at == merged.disp_last_signal_at == to_iso(now)
    assert merged.sub_zero_days == 0


def test_observation_pool_filters_and_orders() -> None:
    refs = [
        ref(id="ref_hi", reinforcement=3.0),
        ref(id="ref_lo", reinforcement=0.5),
        ref(id="ref_neg", disputation=1.0),
        ref(id="ref_pending", status="pending", reinforcement=5.0),
        ref(id="ref_denied", status="denied", reinforcement=5.0),
        ref(id="ref_sup", reinforcement=5.0, suppress=True, suppressed_at=to_iso(T0)),
        ref(id="ref_prom", status="promoted", reinforcement=1.0),
    ]
    persona = {"master": [protected_entry(), PersonaEntry(id="prom_x", text="likes rain", reinforcement=2.0)]}
    pool = observation_pool(refs, persona, T0, S)
    assert [o.id for o in pool] == ["ref_hi", "prom_x", "ref_prom", "ref_lo"]
    ranked = observation_pool(refs, persona, T0, S, ranked_ids=["ref_lo", "unknown"])
    assert ranked[0].id == "ref_lo"
    capped = observation_pool(refs, persona, T0, LongTermSettings(evidence_map_max_observations=2))
    assert len(capped) == 2


def test_resolve_signals_validates_against_the_prompt() -> None:
    obs = [
        Observation(id="ref_abc", kind="reflection", entity="master", text="t", score=1),
        Observation(id="prom_ref_zzz", kind="persona", entity="master", text="u", score=1),
    ]
    output = {
        "signals": [
            {"fact_id": "fact_1", "target_id": "ref_abc", "signal": "reinforce"},
            {"fact_id": "fact_1", "target_id": "ref_abc", "signal": "reinforce"},  # duplicate
            {"fact_id": "fact_2", "target_id": "persona.master.prom_ref_zzz", "signal": "negate"},
            {"fact_id": "fact_9", "target_id": "ref_abc", "signal": "negate"},  # not in batch
            {"fact_id": "fact_1", "target_id": "ref_nope", "signal": "negate"},  # unknown target
            {"fact_id": "fact_1", "target_id": "ref_abc", "signal": "maybe"},
        ]
    }
    got = resolve_signals(output, ["fact_1", "fact_2"], obs)
    assert [(s.fact_id, s.target_id, s.target_kind, s.signal) for s in got] == [
        ("fact_1", "ref_abc", "reflection", "reinforce"),
        ("fact_2", "prom_ref_zzz", "persona", "negate"),
    ]
    disputed = resolve_disputed({"disputed": [{"reflection_id": "ref_abc"}, {"reflection_id": "ref_abc"}, {"reflection_id": "x"}]}, obs)
    assert [d.target_id for d in disputed] == ["ref_abc"]


def test_map_evidence_prompt_caps_observations_and_uses_record_ids() -> None:
    words = lambda s: len(s.split())  # noqa: E731
    obs = [Observation(id=f"ref_{i:02d}", kind="reflection", entity="master", text="word " * 300, score=1) for i in range(40)]
    shown = cap_observations(obs, words, S)
    assert len(shown) == 30
    assert all(words(o.text) <= 200 for o in shown)
    facts = [Fact(id="fact_20240301120000_abcdef12", text="Master drinks tea daily")]
    messages = map_evidence_messages(facts, obs, count_tokens=words, settings=S, master_name="Master", ai_name="Neko")
    body = messages[1]["content"]
    assert "[fact_20240301120000_abcdef12]" in body and "[ref_29]" in body and "[ref_30]" not in body
    assert '"signals"' in messages[0]["content"]
    tight = cap_observations(obs, words, LongTermSettings(evidence_observations_total_max_tokens=450))
    assert len(tight) == 2  # each shown line costs 201 + 1 words


def test_archive_shards_hold_at_most_500_per_file() -> None:
    suffixes = iter(["aaaa0001", "aaaa0002", "aaaa0003"])
    day = date(2024, 3, 1)
    existing = {"2024-03-01_00000000.json": 499, "2024-02-29_ffffffff.json": 10}
    names = assign_shards(existing, 502, day, lambda: next(suffixes), 500)
    assert shard_name(day, "x") == "2024-03-01_x.json"
    assert names[0] == "2024-03-01_00000000.json"
    assert names[1:501] == ["2024-03-01_aaaa0001.json"] * 500
    assert names[501] == "2024-03-01_aaaa0002.json"
    assert "2024-02-29_ffffffff.json" not in names
    with pytest.raises(ValueError):
        assign_shards({"2024-03-01_dup.json": 500}, 1, day, lambda: "dup", 500)
