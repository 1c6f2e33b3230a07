"""The same-time leg (recall_same_time_anchors): the pure leg, inside RecallIndex with real
BM25 and vector indexes (hand-made unit vectors), and over real HTTP with the real model,
where /query_memory must answer the playground's fused list."""

from __future__ import annotations

from datetime import date, timezone
from pathlib import Path

import numpy as np
import pytest

from nekomem.config.settings import load_settings
from nekomem.domain import vector_codec
from nekomem.domain.index_entry import IndexEntry
from nekomem.models.embeddings import EmbeddingService, text_sha256
from nekomem.recall.fusion import rrf, same_time_leg
from nekomem.recall.index import RecallIndex
from nekomem.recall.query_text import LexicalAnalyzer, stop_names_for
from tests.support.live import LiveServer, make_settings

MODEL = "test-model"
NAME = "Lan"


def test_the_leg_is_the_fusion_kept_to_the_anchors_days() -> None:
    days = {"a": 1, "b": 2, "c": 1, "d": None, "e": 3, "f": 2}
    legs = [["a", "b", "c"], ["b", "d", "e", "f"]]
    fused = [i for i, _ in rrf(legs, 60, 10)]
    assert fused[:2] == ["b", "a"]
    # Anchors b (day 2) and a (day 1): every fused id of days 1 and 2, in fused order.
    assert same_time_leg(legs, 60, 2, days.get) == [i for i in fused if days[i] in (1, 2)]
    assert same_time_leg(legs, 60, 1, days.get) == ["b", "f"]
    # An undated anchor contributes no day; none dated at all gives no leg.
    assert same_time_leg([["d", "a"]], 60, 1, days.get) == []
    assert same_time_leg([["d", "a"]], 60, 2, days.get) == ["a"]
    assert same_time_leg([], 60, 3, days.get) == [] and same_time_leg(legs, 60, 0, days.get) == []


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def make_index(anchors: int) -> RecallIndex:
    overrides = {
        "recall_vector_hub_weight": 0.0,
        "recall_same_time_anchors": anchors,
        "recall_budget_each": 3,
        "recall_budget_total": 3,
        "recall_cosine_threshold": 0.0,
        "recall_bm25_threshold": 0.0,
    }
    s = load_settings(None, env={}, overrides=overrides).recall
    index = RecallIndex(s, timezone.utc, LexicalAnalyzer(s, stop_names_for(["Master", NAME])))
    index.attach_model(MODEL, 3)
    # The query is "hiking trip" with vector (1, 0, 0). id: (text, vector, event day)
    docs = {
        "trip": ("Master planned a hiking trip to the mountains", unit(1.0, 0.0, 0.0), "2026-03-01"),
        "boots": ("Master bought hiking boots for it", unit(0.0, 0.0, 1.0), "2026-03-01"),
        "bike": ("Master went hiking once as a child", unit(0.0, 0.0, 1.0), "2026-02-10"),
        "x": ("Master likes maps", unit(0.9, 0.4, 0.0), "2026-01-05"),
        "y": ("Master reads travel blogs", unit(0.8, 0.6, 0.0), "2026-01-06"),
    }
    index.upsert(
        IndexEntry(
            id=i,
            tier="fact",
            text=t,
            vector=vector_codec.encode(v),
            vector_model=MODEL,
            text_sha256=text_sha256(t),
            event_start_at=f"{day}T10:00:00+00:00",
        )
        for i, (t, v, day) in docs.items()
    )
    return index


def test_a_memory_of_the_best_hits_day_is_lifted() -> None:
    query, qvec = "hiking trip", unit(1.0, 0.0, 0.0)
    off = make_index(0)
    hits_off, legs_off = off.search(query, qvec, None, None)
    assert len(legs_off) == 2
    # "trip" leads both legs; "boots" (same day, one word) ties BM25 rank with "bike" but comes later.
    assert [e.id for e, _ in hits_off][0] == "trip" and "boots" not in [e.id for e, _ in hits_off][:2]

    on = make_index(1)
    hits_on, legs_on = on.search(query, qvec, None, None)
    assert legs_on[:2] == legs_off and len(legs_on) == 3
    assert legs_on[2] == ["trip", "boots"]
    assert [e.id for e, _ in hits_on][:2] == ["trip", "boots"]
    assert on._event_day("trip") == date(2026, 3, 1) and on._event_day("missing") is None


def test_undated_memories_add_no_leg() -> None:
    s = load_settings(None, env={}, overrides={"recall_same_time_anchors": 3}).recall
    index = RecallIndex(s, timezone.utc, LexicalAnalyzer(s, stop_names_for(["Master"])))
    index.upsert([IndexEntry(id="a", tier="fact", text="Master likes tea"), IndexEntry(id="b", tier="fact", text="Master likes green tea")])
    legs = index.legs(index.analyzer.query("tea"), None, None)
    assert legs == [["a", "b"], []] or legs == [["b", "a"], []]


@pytest.fixture(scope="module")
def embeddings(embedding_service: EmbeddingService) -> EmbeddingService:
    """The shared real model (tests/conftest.py)."""
    return embedding_service


def test_query_memory_answers_the_playgrounds_fused_list(tmp_path: Path, embeddings: EmbeddingService) -> None:
    days = ["2026-01-03", "2026-01-10", "2026-01-17"]
    topics = [
        ["Master adopted a cat named Mochi", "Master bought a scratching post", "Master's cat sleeps on the sofa"],
        ["Master started piano lessons", "Master practises scales every evening", "Master's piano teacher is strict"],
        ["Master went hiking in the hills", "Master's boots gave him blisters", "Master saw a deer on the trail"],
    ]
    facts = [{"text": t, "event_start_at": f"{d}T20:00:00+00:00"} for d, ts in zip(days, topics, strict=True) for t in ts]
    settings = make_settings(tmp_path, recall_budget_each=3, recall_budget_total=4)
    assert settings.recall.recall_same_time_anchors == 3  # the default
    with LiveServer(settings, embeddings=embeddings) as srv:
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).raise_for_status()
        srv.wait_vectors(NAME)
        for query in ("tell me about the cat", "how are the piano lessons going", "hiking"):
            plain = srv.post(f"/query_memory/{NAME}", json={"query": query}).json()
            explained = srv.post(f"/api/browse/{NAME}/recall_explain", json={"query": query}).json()
            assert 0 < len(plain["results"]) <= 4
            assert [x["id"] for x in explained["fused"]] == [x["id"] for x in plain["results"]]
