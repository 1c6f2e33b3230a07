"""The consensus leg (recall_consensus_leg): the pure ranking, the leg inside RecallIndex
with real BM25 and vector indexes (hand-made unit vectors), and over real HTTP with the real
model, where /query_memory must answer the playground's fused list."""

from __future__ import annotations

from datetime import timezone
from pathlib import Path

import numpy as np
import pytest

from nekomem.config.settings import load_settings
from nekomem.domain import vector_codec
from nekomem.domain.index_entry import IndexEntry
from nekomem.models.embeddings import EmbeddingService, text_sha256
from nekomem.recall.consensus import consensus_ranking, pool_of, zscores
from nekomem.recall.fusion import rrf
from nekomem.recall.index import RecallIndex
from nekomem.recall.query_text import LexicalAnalyzer, stop_names_for
from tests.support.live import LiveServer, make_settings

MODEL = "test-model"
NAME = "Lan"


def test_pool_is_the_union_of_each_rankings_head_in_first_appearance_order() -> None:
    assert pool_of([["a", "b", "c"], ["c", "d"], [], ["e", "a", "f"]], 2) == ["a", "b", "c", "d", "e"]


def test_zscores_and_a_flat_signal() -> None:
    z = zscores(np.array([1.0, 2.0, 3.0]))
    assert z.mean() == pytest.approx(0.0) and z.std() == pytest.approx(1.0) and list(np.argsort(z)) == [0, 1, 2]
    assert zscores(np.array([0.4, 0.4, 0.4])).tolist() == [0.0, 0.0, 0.0]


def test_ranking_sums_weighted_zscores_and_keeps_pool_order_on_ties() -> None:
    pool = ["a", "b", "c", "d"]
    lexical = np.array([1.0, 0.0, 0.0, 0.0])  # only a matches a word
    cosine = np.array([0.20, 0.60, 0.58, 0.10])
    # Cosine alone: b, c, a, d. BM25 weighing as much lifts a (far ahead lexically) to the top.
    assert consensus_ranking(pool, [(0.0, lexical), (1.0, cosine)], 4) == ["b", "c", "a", "d"]
    assert consensus_ranking(pool, [(1.0, lexical), (1.0, cosine)], 2) == ["a", "b"]
    assert consensus_ranking(pool, [(1.0, np.zeros(4))], 3) == ["a", "b", "c"]
    assert consensus_ranking([], [], 3) == [] and consensus_ranking(pool, [(1.0, cosine)], 0) == []
    with pytest.raises(ValueError, match="pool of 4"):
        consensus_ranking(pool, [(1.0, np.zeros(3))], 2)


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def make_index(**overrides: object) -> RecallIndex:
    s = load_settings(None, env={}, overrides={"recall_vector_hub_weight": 0.0, "recall_same_time_anchors": 0, **overrides}).recall
    index = RecallIndex(s, timezone.utc, LexicalAnalyzer(s, stop_names_for(["Master", NAME])))
    index.attach_model(MODEL, 3)
    return index


DOCS = {
    # id: (text, vector); the query is "violin lesson" with vector (1, 0, 0).
    "lex": ("Master had a violin lesson", unit(0.0, 0.0, 1.0)),  # BM25's best, orthogonal to the query
    "both": ("Master practised the violin", unit(0.8, 0.6, 0.0)),  # second in both legs
    "vec1": ("Master went to a concert", unit(1.0, 0.05, 0.0)),
    "vec2": ("Master listened to music", unit(0.95, 0.3, 0.0)),
    "far": ("Master baked bread", unit(0.0, 1.0, 0.0)),
}


def fill(index: RecallIndex) -> None:
    entries = [
        IndexEntry(id=i, tier="fact", text=t, vector=vector_codec.encode(v), vector_model=MODEL, text_sha256=text_sha256(t), importance=5)
        for i, (t, v) in DOCS.items()
    ]
    index.upsert(entries)
    assert index.vector_count() == len(DOCS)


def test_the_leg_joins_the_fusion_only_when_switched_on() -> None:
    query, qvec = "violin lesson", unit(1.0, 0.0, 0.0)
    off = make_index(recall_budget_each=2, recall_cosine_threshold=0.0, recall_bm25_threshold=0.0)
    fill(off)
    legs_off = off.legs(off.analyzer.query(query), qvec, None)
    assert len(legs_off) == 2 and legs_off[0] == ["lex", "both"] and legs_off[1] == ["vec1", "vec2"]

    on = make_index(recall_budget_each=2, recall_cosine_threshold=0.0, recall_bm25_threshold=0.0, recall_consensus_leg=True)
    fill(on)
    legs_on = on.legs(on.analyzer.query(query), qvec, None)
    # The first two legs are unchanged (cut to the budget from the deeper pool search) ...
    assert legs_on[:2] == legs_off
    # ... and the third ranks the pool (every leg's best 16, here all five) by the summed z-scores:
    # "both" is second by BM25 and third by cosine but well above average in both, so it leads.
    assert legs_on[2] == ["both", "vec1"]
    hits, legs = on.search(query, qvec, None, None)
    assert [e.id for e, _ in hits] == [i for i, _ in rrf(legs, on.s.recall_rrf_k, on.s.recall_budget_total)]
    assert [e.id for e, _ in hits][0] == "both"
    # Without a query vector there is nothing to agree with: BM25 alone, no third leg.
    assert len(on.legs(on.analyzer.query(query), None, None)) == 2


def test_a_memory_without_its_vector_yet_counts_as_the_pools_worst_cosine() -> None:
    index = make_index(recall_budget_each=6, recall_cosine_threshold=0.0, recall_bm25_threshold=0.0, recall_consensus_leg=True)
    fill(index)
    index.upsert([IndexEntry(id="new", tier="fact", text="Master booked a violin lesson for Monday", importance=5)])
    assert "new" in index.need and "new" not in (index.vectors or [])
    legs = index.legs(index.analyzer.query("violin lesson"), unit(1.0, 0.0, 0.0), None)
    assert "new" in legs[0] and "new" not in legs[1] and sorted(legs[2]) == sorted([*DOCS, "new"])
    # Second by BM25 but with the worst cosine of the pool, it ranks below "both" (good at both).
    assert legs[2].index("new") > legs[2].index("both")


@pytest.fixture(scope="module")
def embeddings(embedding_service: EmbeddingService) -> EmbeddingService:
    """The shared real model (tests/conftest.py)."""
    return embedding_service


def test_query_memory_answers_the_playgrounds_fused_list_with_the_leg_on(tmp_path: Path, embeddings: EmbeddingService) -> None:
    people = ["Melanie", "Caroline"]
    topics = ["painted a lake sunrise", "goes swimming with her kids", "is learning the violin", "reads poetry at night", "baked bread"]
    facts = [f"{p} {t}" for p in people for t in topics]
    settings = make_settings(tmp_path, recall_consensus_leg=True, recall_budget_each=3, recall_budget_total=4)
    with LiveServer(settings, embeddings=embeddings) as srv:
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in facts]})
        r.raise_for_status()
        srv.wait_vectors(NAME)
        for query in ("What did Melanie paint?", "who plays music", "swimming"):
            plain = srv.post(f"/query_memory/{NAME}", json={"query": query}).json()
            explained = srv.post(f"/api/browse/{NAME}/recall_explain", json={"query": query}).json()
            assert 0 < len(plain["results"]) <= 4
            assert [x["id"] for x in explained["fused"]] == [x["id"] for x in plain["results"]]
