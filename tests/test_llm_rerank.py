"""Issue 36: the chat model as the re-ranker of explicit recalls (recall_llm_rerank), against
the loopback fake model: one model call per explicit /query_memory (none for
/search_for_memory, a scoped query, with the setting off, or when a /rerank endpoint is
configured), its order used, and every bad answer (garbage, unknown or repeated ids, an
endless list, an error, a late answer) keeps the fused order without losing a row."""

from __future__ import annotations

import re

import pytest

from nekomem.models.llm_rerank import order_from_ids
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.fake_llm import FakeLLM, Reply, last_user_text
from tests.support.live import LiveServer, make_settings

NAME = "Lan"
GROUP = {"subject_kind": "group_chat", "subject_id": "qq:123456"}
FACTS = [f"Master's cat number {n} likes fish" for n in range(12)]
_LINE = re.compile(r"^\[(m\d+)\] .*number (\d+)", re.M)


def by_number_descending(request: dict) -> dict:
    """The scripted model: the candidate ids, highest cat number first."""
    lines = _LINE.findall(last_user_text(request))
    return {"ids": [mid for mid, _n in sorted(lines, key=lambda line: -int(line[1]))]}


def recall(srv: LiveServer, query: str, **extra: object) -> list[str]:
    body = srv.post(f"/query_memory/{NAME}", json={"query": query, **extra}).json()
    assert "error_code" not in body, body
    scores = [row["score"] for row in body["results"]]
    assert scores == sorted(scores, reverse=True)
    return [row["text"] for row in body["results"]]


def settings(tmp_path, llm: FakeLLM, **extra: object):
    values: dict[str, object] = {
        "embedding_enabled": False,
        "llm_base_url": llm.base_url,
        "llm_model": "fake",
        "recall_llm_rerank": True,
        "recall_rerank_top_n": 12,
        "recall_budget_each": 12,  # the lexical leg holds every fact
        "recall_rerank_timeout_seconds": 2.0,
    }
    return make_settings(tmp_path, **{**values, **extra})


def test_the_chat_model_re_ranks_explicit_recalls_only(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("rerank", by_number_descending)
    with LiveServer(settings(tmp_path, fake_llm)) as srv:
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).raise_for_status()
        assert srv.get("/health").json()["reranker"]["state"] == "idle"

        assert recall(srv, "cat") == [f"Master's cat number {n} likes fish" for n in range(11, 3, -1)]
        assert len(fake_llm.calls("rerank")) == 1
        health = srv.get("/health").json()["reranker"]
        assert health["kind"] == "llm" and health["state"] == "ok" and health["calls"] == 1 and health["tokens_sent"] > 0

        # Not explicit: the reference plugin's memory query, and a query scoped to subjects.
        srv.get(f"/search_for_memory/{NAME}/cat").raise_for_status()
        recall(srv, "cat", subjects=[GROUP])
        assert len(fake_llm.calls("rerank")) == 1


def test_bad_model_answers_keep_the_fused_order_and_every_row(tmp_path, fake_llm: FakeLLM):
    with LiveServer(settings(tmp_path, fake_llm)) as srv:
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).raise_for_status()
        fake_llm.on("rerank", {"ids": []})
        fused = recall(srv, "cat")
        assert len(fused) == 8
        bad = [
            Reply.text("I think the cats are all lovely!"),
            Reply.json({"ids": ["x", "m99", 7, None, "m0"]}),  # names no candidate
            Reply.json({"ids": ["m1"] * 10_000}),  # endless and repeated: read up to a bound
            Reply.status(500),
            Reply.delay(10, {"ids": ["m12"]}),  # late: the recall stops waiting
        ]
        for reply in bad:
            fake_llm.queue("rerank", reply)
            assert recall(srv, "cat") == fused, reply
        assert len(fake_llm.calls("rerank")) == 1 + len(bad)
        assert srv.get("/health").json()["reranker"]["failures"] >= 2


@pytest.mark.parametrize("case", ["off", "endpoint"])
def test_no_model_call_when_off_or_when_a_rerank_endpoint_is_configured(tmp_path, fake_llm: FakeLLM, case: str):
    fake_llm.on("rerank", by_number_descending)
    with FakeEmbeddings() as fake:
        fake.rank_with(lambda query, docs: list(range(len(docs))))
        extra = {"recall_llm_rerank": False} if case == "off" else {"recall_rerank_base_url": fake.base_url}
        with LiveServer(settings(tmp_path, fake_llm, **extra)) as srv:
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).raise_for_status()
            assert len(recall(srv, "cat")) == 8
            assert fake_llm.calls("rerank") == []
            assert len(fake.calls("/v1/rerank")) == (1 if case == "endpoint" else 0)


def test_order_from_ids_is_always_a_permutation():
    names = ["m1", "m2", "m3"]
    assert order_from_ids(["m3", "m1"], names) == [2, 0, 1]
    assert order_from_ids(["m2", "m2", "zz", 5, None], names) == [1, 0, 2]
    assert order_from_ids([], names) == [0, 1, 2]
    assert order_from_ids(["m3"] * 1000 + ["m1"], names) == [2, 0, 1]  # read up to a bound
