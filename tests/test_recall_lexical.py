"""Incremental BM25 index (against a from-the-formula reference) and rank fusion."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from nekomem.config.recall import RecallSettings
from nekomem.recall.fusion import fuse_legs, leg_top, rrf
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.tokenize import Tokenizer, tokenize

K1, B = 1.5, 0.75


def reference_scores(docs: dict[str, str], query: str, normalised: bool = True, skip_unseen_cjk: bool = True) -> dict[str, float]:
    """Okapi BM25 straight from the formula in lexical.py's docstring, one loop per document
    (a straddling CJK n-gram found in no document leaves the denominator when ``skip_unseen_cjk``)."""
    toks = {d: tokenize(t) for d, t in docs.items()}
    n = len(toks)
    if not n:
        return {}
    avgdl = sum(len(t) for t in toks.values()) / n or 1.0
    weights = Counter(tokenize(query))
    df = {t: sum(1 for ts in toks.values() if t in ts) for t in weights}
    idf = {t: math.log((n - df[t] + 0.5) / (df[t] + 0.5) + 1.0) for t in weights}
    straddling = Tokenizer().straddling(query) if skip_unseen_cjk else set()
    denominator = sum(w * idf[t] for t, w in weights.items() if df[t] or t not in straddling)
    out = {}
    for d, ts in toks.items():
        counts = Counter(ts)
        raw = 0.0
        for t, w in weights.items():
            tf = counts.get(t, 0)
            if tf:
                raw += (w * idf[t]) * (tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len(ts) / avgdl)))
        if raw > 0:
            out[d] = raw / denominator if normalised else raw
    return out


def ranked(scores: dict[str, float], k: int) -> list[tuple[str, float]]:
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


CORPUS = {
    "f1": "Master likes ramen with extra garlic",
    "f2": "主人昨天晚上吃了一碗拉面",
    "f3": "昨日ラーメンを食べた",
    "f4": "Master's cat is called Mochi",
    "f5": "",
    "f6": "ramen ramen ramen ramen ramen",
    "f7": "The weather was cold; Master drank hot tea",
    "f8": "主人喜欢喝热茶，不喜欢咖啡",
}
QUERIES = ["ramen", "ラーメン", "拉面", "master cat", "hot tea 热茶", "garlic ramen", "咖啡", "nothing here"]


def build(docs: dict[str, str], **settings: object) -> LexicalIndex:
    index = LexicalIndex(RecallSettings(**settings))  # type: ignore[arg-type]
    for doc_id, text in docs.items():
        index.add(doc_id, text)
    return index


@pytest.mark.parametrize("query", QUERIES)
def test_scores_equal_the_formula(query: str) -> None:
    index = build(CORPUS)
    assert index.search(query, 10) == ranked(reference_scores(CORPUS, query), 10)
    assert index.search(query, 10, normalised=False) == ranked(reference_scores(CORPUS, query, False), 10)


def test_ordering_full_overlap_beats_partial_and_no_overlap_is_dropped() -> None:
    index = build({"a": "green tea with lemon", "b": "green apples", "c": "blue sky"})
    hits = index.search("green tea", 10)
    assert [d for d, _ in hits] == ["a", "b"]
    assert hits[0][1] > hits[1][1] > 0


def test_cjk_query_finds_spaceless_japanese_and_chinese() -> None:
    index = build(CORPUS)
    assert index.search("ラーメン", 1)[0][0] == "f3"
    assert index.search("拉面", 1)[0][0] == "f2"


# A Chinese question cut into sliding n-grams: most of them straddle two words and occur in
# no memory ("我曾", "曾经在", "馆看"...).
MUSEUM = {"m": "今天去了博物馆，看了古代丝绸的展览", "w": "今天天气很好，去公园散步", "c": "晚上做了红烧鱼"}
MUSEUM_QUERY = "我曾经在五月二日去过博物馆，你还记得我当时看了什么展览吗？"


def test_unseen_cjk_ngrams_of_a_query_do_not_drown_the_normalised_score() -> None:
    on = build(MUSEUM)
    off = build(MUSEUM, recall_bm25_skip_unseen_cjk_grams=False)
    threshold = RecallSettings().recall_bm25_threshold
    assert on.search(MUSEUM_QUERY, 3) == ranked(reference_scores(MUSEUM, MUSEUM_QUERY), 3)
    assert off.search(MUSEUM_QUERY, 3) == ranked(reference_scores(MUSEUM, MUSEUM_QUERY, skip_unseen_cjk=False), 3)
    best_on, best_off = on.search(MUSEUM_QUERY, 1)[0], off.search(MUSEUM_QUERY, 1)[0]
    assert best_on[0] == best_off[0] == "m"
    assert best_off[1] < threshold <= best_on[1]
    # Only the normalisation changes: the raw BM25 ranking is the same either way.
    assert on.search(MUSEUM_QUERY, 3, normalised=False) == off.search(MUSEUM_QUERY, 3, normalised=False)


def test_unseen_japanese_pieces_still_weigh_like_words() -> None:
    docs = {"a": "孫の陽菜が遊びに来た", "b": "庭のトマトが赤くなった"}
    on = build(docs)
    off = build(docs, recall_bm25_skip_unseen_cjk_grams=False)
    query = "孫の学年は？"  # 学年 occurs nowhere, and is a piece of its own: it keeps its weight
    assert on.search(query, 2) == off.search(query, 2) == ranked(reference_scores(docs, query), 2)


def test_unseen_whole_words_still_weigh_in_the_normalised_score() -> None:
    index = build({"a": "museum trip with friends", "b": "park walk"})
    [(doc_id, partial)] = index.search("museum quantum", 5)
    [(_, full)] = index.search("museum", 5)
    assert doc_id == "a"
    assert partial < full / 2
    assert index.search("museum quantum", 5) == ranked(
        reference_scores({"a": "museum trip with friends", "b": "park walk"}, "museum quantum"), 5
    )


def test_empty_query_or_index_gives_nothing() -> None:
    assert LexicalIndex().search("tea", 5) == []
    index = build(CORPUS)
    assert index.search("", 5) == []
    assert index.search("   ", 5) == []
    assert index.search("tea", 0) == []


def test_single_document_exact_match_scores_one_and_clears_the_default_threshold() -> None:
    index = build({"only": "Master likes strawberry cake"})
    [(doc_id, score)] = index.search("strawberry cake", 5)
    assert doc_id == "only"
    assert score == pytest.approx(1.0)
    assert score >= RecallSettings().recall_bm25_threshold


def test_term_frequency_counts() -> None:
    index = build({"once": "ramen noodle soup bowl", "many": "ramen ramen ramen ramen ramen", "other": "tea"})
    scores = dict(index.search("ramen", 5, normalised=False))
    assert scores["many"] > 1.3 * scores["once"]


def test_min_score_and_ties_broken_by_id() -> None:
    index = build({"b": "tea", "a": "tea", "c": "tea cake"})
    hits = index.search("tea", 5)
    assert [d for d, _ in hits[:2]] == ["a", "b"]
    assert index.search("tea", 5, min_score=hits[0][1] + 1e-9) == []


def test_stop_names_are_stripped_from_documents_and_queries() -> None:
    index = LexicalIndex(stop_names=["Neko", "主人"])
    index.add("d1", "Neko likes fish")
    index.add("d2", "主人喜欢拉面")
    assert index.search("Neko", 5) == []
    assert index.search("主人", 5) == []
    assert index.search("fish", 5)[0][0] == "d1"
    index.set_stop_names(["fish"])
    assert index.search("Neko", 5)[0][0] == "d1"
    assert index.search("fish", 5) == []
    assert len(index) == 2


def test_writes_bookkeeping() -> None:
    index = build({"a": "tea"})
    with pytest.raises(ValueError):
        index.add("a", "coffee")
    with pytest.raises(ValueError):
        index.add("", "coffee")
    assert index.remove("missing") is False
    index.update("a", "tea")  # unchanged: no-op
    index.update("b", "coffee")  # absent: added
    assert len(index) == 2 and "b" in index and sorted(index.ids()) == ["a", "b"]
    index.update("a", "coffee with milk")
    assert [d for d, _ in index.search("tea", 5)] == []
    assert index.remove("a") is True
    assert len(index) == 1 and "a" not in index


def test_allowed_set_and_predicate_restrict_results() -> None:
    index = build(CORPUS)
    full = index.search("ramen ラーメン 拉面", 10)
    assert len(full) >= 3
    allowed = {full[-1][0], full[1][0], "f5", "unknown"}
    expected = [hit for hit in full if hit[0] in allowed]
    assert index.search("ramen ラーメン 拉面", 10, allowed=allowed) == expected
    assert index.search("ramen ラーメン 拉面", 10, allowed=lambda d: d in allowed) == expected
    assert index.search("ramen ラーメン 拉面", 10, allowed=set()) == []
    # A large allowed set (bigger than the candidates) takes the other code path.
    big = set(CORPUS) | {f"x{i}" for i in range(50)}
    big.discard(full[0][0])
    assert index.search("ramen ラーメン 拉面", 10, allowed=big) == full[1:]


def test_predicate_that_rejects_the_best_hits_widens_the_search() -> None:
    docs = {f"d{i:03d}": "tea " * (1 + i % 7) + f"filler{i}" for i in range(300)}
    index = build(docs)
    full = index.search("tea", 300)
    top = {d for d, _ in full[:200]}
    calls: list[str] = []

    def allowed(doc_id: str) -> bool:
        calls.append(doc_id)
        return doc_id not in top

    got = index.search("tea", 5, allowed=allowed)
    assert got == [hit for hit in full if hit[0] not in top][:5]
    assert len(calls) == len(set(calls))  # never asks twice about the same id


WORDS = ["tea", "cake", "ramen", "cat", "rain", "music", "piano", "garden", "coffee", "night"]
CJK = ["拉面", "咖啡", "ラーメン", "猫", "音楽", "雨", "花园", "夜", "紅茶", "ケーキ"]


def random_text(rng: random.Random) -> str:
    parts = [rng.choice(WORDS + CJK) for _ in range(rng.randint(0, 6))]
    return (" " if rng.random() < 0.5 else "").join(parts)


@pytest.mark.parametrize(("seed", "list_max"), [(1, 256), (2, 3), (3, 1)])
def test_incremental_writes_match_a_fresh_index(seed: int, list_max: int) -> None:
    rng = random.Random(seed)
    # Small thresholds so that per-term compaction, slot renumbering and (with a small
    # list_max) growing posting arrays all happen.
    settings = dict(
        recall_bm25_compact_dead_ratio=0.2,
        recall_bm25_compact_min_slots=5,
        recall_index_initial_capacity=4,
        recall_bm25_list_postings_max=list_max,
    )
    index = build({}, **settings)
    docs: dict[str, str] = {}
    queries = ["tea cake", "拉面", "ラーメン 猫", "coffee night", "紅茶ケーキ", "rain 雨 music"]
    for step in range(600):
        op = rng.random()
        doc_id = f"d{rng.randrange(120)}"
        if op < 0.45:
            text = random_text(rng)
            index.update(doc_id, text)
            docs[doc_id] = text
        elif op < 0.7:
            assert index.remove(doc_id) == (doc_id in docs)
            docs.pop(doc_id, None)
        elif doc_id not in docs:
            text = random_text(rng)
            index.add(doc_id, text)
            docs[doc_id] = text
        if step % 25 == 0:
            query = rng.choice(queries)
            assert index.search(query, 8) == ranked(reference_scores(docs, query), 8)
    assert len(index) == len(docs)
    fresh = build(docs)
    for query in queries + WORDS + CJK:
        assert index.search(query, 20) == fresh.search(query, 20)
        assert index.search(query, 20, normalised=False) == fresh.search(query, 20, normalised=False)


# --------------------------------------------------------------------------- fusion


def test_rrf_matches_hand_computed_values() -> None:
    fused = rrf([["a", "b", "c"], ["b", "d"]], k=60, limit=10)
    expected = {
        "b": 1 / 62 + 1 / 61,
        "a": 1 / 61,
        "d": 1 / 62,
        "c": 1 / 63,
    }
    assert [d for d, _ in fused] == ["b", "a", "d", "c"]
    for doc_id, score in fused:
        assert score == pytest.approx(expected[doc_id], abs=1e-15)


def test_rrf_weights_scale_each_list() -> None:
    fused = dict(rrf([["a", "b"], ["b", "t"]], k=60, limit=10, weights=[1.0, 2.0]))
    assert fused["t"] == pytest.approx(2 / 62) and fused["b"] == pytest.approx(1 / 62 + 2 / 61)
    assert fused["a"] == pytest.approx(1 / 61)


def test_rrf_dedup_skips_empty_ids_and_caps() -> None:
    [(doc_id, score)] = rrf([["x"], ["x"]], k=60, limit=8)
    assert doc_id == "x" and round(score, 6) == 0.032787  # 2/61
    assert rrf([["a", "a", "b"]], k=60, limit=8) == [("a", 1 / 61), ("b", 1 / 62)]
    assert rrf([["", "a"]], k=60, limit=8) == [("a", 1 / 61)]
    assert len(rrf([[f"l{i}" for i in range(10)], [f"v{i}" for i in range(10)]], k=60, limit=8)) == 8
    assert rrf([["a"]], k=60, limit=0) == []
    # Equal scores keep first appearance order.
    assert [d for d, _ in rrf([["p", "q"], ["q", "p"]], k=1, limit=2)] == ["p", "q"]
    with pytest.raises(ValueError):
        rrf([["a"]], k=-1, limit=1)


def test_leg_top_thresholds_and_cuts() -> None:
    hits = [("a", 0.05), ("b", 0.9), ("c", 0.2), ("d", 0.2), ("e", 0.5)]
    assert leg_top(hits, 3, 0.1) == ["b", "e", "c"]
    assert leg_top(hits, 10, 0.3) == ["b", "e"]


def test_fuse_legs_budgets_and_bm25_only() -> None:
    s = RecallSettings(recall_budget_each=4, recall_cosine_threshold=0.3)
    lexical = [(f"l{i}", 1.0 - i / 10) for i in range(6)] + [("low", 0.01)]
    vector = [("l1", 0.9), ("v1", 0.8), ("v2", 0.2)]
    fused = fuse_legs(lexical, vector, s)
    assert fused[0] == ("l1", pytest.approx(1 / 61 + 1 / 62))
    ids = [d for d, _ in fused]
    assert set(ids) == {"l0", "l1", "l2", "l3", "v1"}  # 4 lexical + v1; v2 under the cosine threshold
    assert [d for d, _ in fuse_legs(lexical, (), s)] == ["l0", "l1", "l2", "l3"]
