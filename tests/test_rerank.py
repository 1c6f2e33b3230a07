"""Issue 36 item 4: the user's own re-ranker behind a /rerank endpoint re-orders the fused
candidates before the 8-row budget, against a scripted loopback server: its order is used
(both answer shapes: results with relevance_score, TEI's bare list with score, and TEI's
texts field), and a failing, stopped or hanging re-ranker leaves the fused order."""

from __future__ import annotations

import pytest

from nekomem.models.rerank import RerankError, parse_ranking
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.live import LiveServer, make_settings

NAME = "Lan"
# Twelve facts that all match "cat": more candidates than the 8-row budget.
FACTS = [f"Master's cat number {n} likes fish" for n in range(12)]


def recall(srv: LiveServer, query: str) -> list[str]:
    body = srv.post(f"/query_memory/{NAME}", json={"query": query}).json()
    assert "error_code" not in body, body
    scores = [row["score"] for row in body["results"]]
    assert scores == sorted(scores, reverse=True)
    return [row["text"] for row in body["results"]]


def by_number_descending(query: str, docs: list[str]) -> list[int]:
    """The scripted re-ranker: the highest cat number first."""
    return sorted(range(len(docs)), key=lambda i: -int(docs[i].split("number ")[1].split()[0]))


@pytest.mark.parametrize("shape", ["results", "tei"])
def test_the_rerankers_order_is_used_and_its_failure_falls_back(tmp_path, shape):
    with FakeEmbeddings() as fake:
        fake.rerank_shape = shape
        settings = make_settings(
            tmp_path,
            embedding_enabled=False,
            recall_rerank_base_url=fake.base_url,
            recall_rerank_model="fake-rerank",
            recall_rerank_field="texts" if shape == "tei" else "documents",
            recall_rerank_top_n=12,
            recall_budget_each=12,  # the lexical leg holds every fact
            recall_rerank_timeout_seconds=1.0,
        )
        with LiveServer(settings) as srv:
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).raise_for_status()
            fake.rank_with(None)  # answers 500
            fused = recall(srv, "cat")
            assert len(fused) == 8
            assert srv.get("/health").json()["reranker"]["state"] == "failing"

            fake.rank_with(by_number_descending)
            reranked = recall(srv, "cat")
            assert reranked == [f"Master's cat number {n} likes fish" for n in range(11, 3, -1)]
            call = fake.calls("/v1/rerank")[-1]["body"]
            field = "texts" if shape == "tei" else "documents"
            assert call["query"] == "cat" and len(call[field]) == 12 and call["model"] == "fake-rerank"
            assert srv.get("/health").json()["reranker"]["state"] == "ok"

            fake.stop()  # refused: the fused order
            assert recall(srv, "cat") == fused
            fake.hang()
            fake.start()  # hanging: the fused order once the re-ranker's deadline passes
            assert recall(srv, "cat") == fused
            fake.release()


def test_rerank_answers_are_parsed_defensively():
    assert parse_ranking({"results": [{"index": 2, "relevance_score": 0.1}, {"index": 0, "relevance_score": 0.9}]}, 3) == [0, 2]
    assert parse_ranking([{"index": 1, "score": 2.0}, {"index": 9, "score": 3.0}], 2) == [1]
    with pytest.raises(RerankError):
        parse_ranking({"results": [{"index": "0", "score": 1}]}, 1)
    with pytest.raises(RerankError):
        parse_ranking({"nothing": []}, 1)
