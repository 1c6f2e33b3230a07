"""Paraphrase dedup with the real local embedding model: a new fact whose vector is close
to a stored one is queued for judge_duplicates, and a merge decision leaves one fact."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

MODEL = Path(__file__).resolve().parents[1] / "models" / "use-multilingual-v3" / "model.onnx"
pytestmark = pytest.mark.skipif(not MODEL.exists(), reason="default embedding model not installed (run scripts/fetch_model.py)")


def test_paraphrase_pair_is_judged_and_merged(tmp_path, fake_llm, embedding_service):
    def merge(request):
        prompt = json.dumps(request["messages"], ensure_ascii=False)
        ids = list(dict.fromkeys(re.findall(r"fact_[0-9]+_[0-9a-f]+", prompt)))
        assert len(ids) >= 2
        return {"decisions": [{"new_id": ids[0], "existing_id": ids[1], "action": "merge", "text": "Master loves green tea"}]}

    fake_llm.on("judge_duplicates", merge)
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings, embeddings=embedding_service) as srv:
        srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master loves green tea very much", "importance": 6}]})
        quiesce(srv.runtime, "Lan")
        srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master really adores drinking green tea", "importance": 6}]})
        wait_for(lambda: fake_llm.calls("judge_duplicates"), what="judge_duplicates")
        items = wait_for(
            lambda: (lambda xs: xs if len(xs) == 1 else None)(srv.get("/api/characters/Lan/facts").json()["items"]), what="the merge"
        )
        assert items[0]["text"] == "Master loves green tea"


def test_unrelated_facts_are_not_paired(tmp_path, fake_llm, embedding_service):
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings, embeddings=embedding_service) as srv:
        srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master loves green tea very much", "importance": 6}]})
        srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "The train to Osaka was two hours late", "importance": 6}]})
        quiesce(srv.runtime, "Lan")
        assert fake_llm.calls("judge_duplicates") == []
        assert srv.get("/api/characters/Lan/facts").json()["total"] == 2
