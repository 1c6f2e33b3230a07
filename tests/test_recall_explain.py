"""The recall playground with two embedding models (``use+e5``): one vector leg per model,
each over its own columns with its own threshold, as /query_memory ranks them. Real server,
real models (skipped when either is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nekomem.config.embeddings import EmbeddingSettings
from nekomem.models.embeddings import EmbeddingService, find_project_root
from nekomem.recall.names import blend_query_vectors, query_vector_texts
from nekomem.recall.vectors import VectorIndex
from tests.support.live import LiveServer, make_settings

ROOT = find_project_root(Path(__file__))
assert ROOT is not None
MODELS = [ROOT / "models" / "use-multilingual-v3" / "model.onnx", ROOT / "models" / "multilingual-e5-small" / "model.onnx"]
pytestmark = pytest.mark.skipif(not all(m.is_file() for m in MODELS), reason="use+e5 needs both models; run scripts/fetch_model.py")
NAME = "Lan"
FACTS = [
    "Master loves drinking green tea every morning",
    "Master works as a software engineer at a bank in Osaka",
    "Master is allergic to peanuts",
    "Master's younger sister lives in Canada",
    "Master plays the piano badly but is proud of it",
    "Master dislikes rainy days",
    "Master bought a red bicycle last spring",
    "Master's favourite film is an old samurai movie",
    "Master adopted a grey cat from the shelter",
    "Master is learning to cook Thai curry",
    "ご主人様は毎週土曜日にプールで泳いでいる",
    "ご主人様は辛いラーメンが大好きだ",
    "主人养了一只叫小白的猫",
    "主人最近在学习弹吉他",
]
QUERIES = ["what does the user drink", "does master have a pet?", "主人在学什么乐器", "food the user cannot eat", "weather"]


@pytest.fixture(scope="module")
def pair() -> Iterator[EmbeddingService]:
    service = EmbeddingService(EmbeddingSettings(embedding_model="use+e5"))
    service.start()
    assert service.wait_ready(180), service.reason
    yield service
    service.close()


def test_each_model_has_its_own_leg_and_the_fused_list_is_query_memorys(tmp_path: Path, pair: EmbeddingService) -> None:
    settings = make_settings(tmp_path, embedding_model="use+e5", recall_vector_hub_min_vectors=len(FACTS), recall_budget_each=4)
    s = settings.recall
    with LiveServer(settings, embeddings=pair) as srv:
        added = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).json()["added"]
        ids = dict(zip(FACTS, added, strict=True))
        srv.wait_vectors(NAME)

        # Each model's leg computed here from that model's own unit vectors: the pair's columns
        # divided by the model's weight, in an index of their own, ranked against their centroid.
        rows = pair.embed(FACTS)
        own = []
        for leg in pair.legs:
            index = VectorIndex(leg.stop - leg.start)
            for text, row in zip(FACTS, rows, strict=True):
                index.upsert(ids[text], row[leg.start : leg.stop] / leg.weight)
            own.append((leg, index))
        below = 0
        for query in QUERIES:
            plain = srv.post(f"/query_memory/{NAME}", json={"query": query}).json()
            explained = srv.post(f"/api/browse/{NAME}/recall_explain", json={"query": query}).json()
            assert [r["id"] for r in explained["fused"]] == [r["id"] for r in plain["results"]], query
            assert explained["query_time_hint"] is None and explained["thresholds"]["vector_hub_weight"] == 1.0
            qvec = blend_query_vectors(
                pair.embed(query_vector_texts(query, s.recall_query_unnamed_weight), "query"), s.recall_query_unnamed_weight
            )
            kept_by_leg = []
            assert len(explained["vector_legs"]) == 2
            for shown, (leg, index) in zip(explained["vector_legs"], own, strict=True):
                assert shown["model"] == leg.name and shown["columns"] == [leg.start, leg.stop]
                assert shown["threshold"] == leg.recall_threshold
                expected = index.search(qvec[leg.start : leg.stop], s.recall_budget_each, min_score=leg.recall_threshold, hub=1.0)
                kept = [r for r in shown["hits"] if r["removed"] is None]
                assert [r["id"] for r in kept] == [i for i, _ in expected], (query, leg.name)
                assert [r["score"] for r in kept] == pytest.approx([c for _, c in expected], abs=1e-4)  # the model's own cosine
                for r in shown["hits"]:
                    assert (r["removed"] == "below_threshold") == (r["score"] < leg.recall_threshold) or r["removed"] == "over_budget"
                below += sum(r["removed"] == "below_threshold" for r in shown["hits"])
                kept_by_leg.append([r["id"] for r in kept])
            # Each fused row's rank in each model's leg.
            for r in explained["fused"]:
                assert r["vector_ranks"] == [leg.index(r["id"]) + 1 if r["id"] in leg else None for leg in kept_by_leg]
        assert below > 0  # the thresholds did remove something (and said so)
        use, e5 = pair.legs
        assert use.recall_threshold is not None and e5.recall_threshold is not None
        assert use.recall_threshold != e5.recall_threshold  # each leg its own threshold
