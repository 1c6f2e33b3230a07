"""A RecallActor that crashes loses its in-memory index; the restarted instance asks the
owners (facts, reflections) to send theirs again, so recall finds what it found before."""

from __future__ import annotations

import pytest

from nekomem.layers.recall.layer import RecallLayer
from nekomem.models.embeddings import EmbeddingService
from tests.support import faults
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for


@pytest.fixture
def crash_next_query(monkeypatch):
    return faults.crash_once(monkeypatch, RecallLayer, "on_QueryMemory")


def found(srv: LiveServer, query: str) -> list[str]:
    r = srv.post("/query_memory/Lan", json={"query": query})
    assert r.status_code == 200, r.text
    return [row["text"] for row in r.json()["results"]]


def test_a_restarted_recall_actor_gets_its_index_back(tmp_path, crash_next_query):
    settings = make_settings(tmp_path, embedding_enabled=False)
    with LiveServer(settings, embeddings=EmbeddingService(settings.embeddings)) as srv:
        r = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master keeps a violin from Cremona"}]})
        assert r.status_code == 200, r.text
        assert found(srv, "violin") == ["Master keeps a violin from Cremona"]
        crash_next_query["armed"] = True
        r = srv.post("/query_memory/Lan", json={"query": "violin"})
        assert r.status_code == 200 and r.json()["error_code"] == "hybrid_recall_failed"
        wait_for(lambda: srv.get("/health").json()["supervision"]["handler_errors"] == 1, what="the renewal")
        assert wait_for(lambda: found(srv, "violin"), what="the index sent again") == ["Master keeps a violin from Cremona"]
