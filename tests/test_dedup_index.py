"""The incremental dedup index decides exactly like the reference scan."""

from __future__ import annotations

import random
from datetime import datetime, timezone

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.dedup_index import DedupIndex
from nekomem.domain.fact_dedup import dedup_new_facts
from nekomem.domain.facts import normalize_fact

WORDS = "tea coffee cat dog morning night music piano rain sun walk park book movie cake ramen sushi train work sleep".split()


def make(rng, i):
    words = rng.sample(WORDS, rng.randint(2, 6))
    if rng.random() < 0.3:
        words = words + ["extra"]
    text = "Master " + " ".join(words)
    if rng.random() < 0.2:
        text = "ご主人様は" + "".join(rng.sample(list("猫犬茶朝夜雨本"), 3)) + "が好き"
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return normalize_fact(
        {"text": text, "importance": 5, "entity": rng.choice(["master", "neko"])},
        now=now,
        source="user_observation",
        settings=LongTermSettings(),
    )


def test_same_outcome_as_the_scan():
    s = LongTermSettings()
    for seed in range(5):
        rng = random.Random(seed)
        stored = []
        index = DedupIndex(s.fact_near_dup_jaccard_threshold, s.fact_near_dup_max_candidates)
        for _round in range(30):
            batch = [make(rng, i) for i in range(rng.randint(1, 8))]
            batch = [f for f in batch if f is not None]
            expected = dedup_new_facts(batch, stored, s)
            got = index.dedup(batch)
            assert [f.id for f in got.accepted] == [f.id for f in expected.accepted]
            assert got.skipped_exact == expected.skipped_exact
            assert [h for h, _ in got.skipped_near] == [h for h, _ in expected.skipped_near]
            stored.extend(expected.accepted)


def test_removed_facts_no_longer_block():
    s = LongTermSettings()
    index = DedupIndex(s.fact_near_dup_jaccard_threshold, s.fact_near_dup_max_candidates)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    fact = normalize_fact({"text": "Master loves green tea", "importance": 5}, now=now, source="user_observation", settings=s)
    assert index.dedup([fact]).accepted == [fact]
    assert index.dedup([fact]).accepted == []
    index.remove(fact.id)
    assert index.dedup([fact]).accepted == [fact]


def test_a_number_picks_the_candidates_so_a_duplicate_behind_many_common_words_is_found() -> None:
    # 300 facts share every keyword with the new one; only one also has its number. The
    # keyword route stops at max_candidates; the mark route looks at that one fact.
    settings = LongTermSettings()
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def fact(text: str):  # type: ignore[no-untyped-def]
        return normalize_fact({"text": text, "entity": "master"}, now=now, source="user_observation", settings=settings)

    index = DedupIndex(0.8, max_candidates=50)
    for i in range(300):
        index.add(fact(f"Master walks the dog in the park at dawn with tea number {1000 + i}"))
    twin = fact("Master walks the dog in the park at dawn with tea number 1299!")
    assert index.dedup([twin]).skipped_near and not index.dedup([twin]).accepted
    other = fact("Master walks the dog in the park at dawn with tea number 5000")
    assert index.dedup([other]).accepted  # another number: another fact
