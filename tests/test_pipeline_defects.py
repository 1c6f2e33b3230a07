"""Defects found by running the pipeline on real conversations (issue 23), each on a real
server: numbers, negations and names reach the near-duplicate check; /health's pending
count holds from the moment an import is acknowledged; a ``tool`` message is stored."""

from __future__ import annotations

import json
import re

from tests.support.fake_llm import FakeLLM, last_user_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
_HOBBY = re.compile(r"hobby number (\d+)")


def facts(srv: LiveServer) -> list[dict]:
    return srv.get(f"/api/characters/{NAME}/facts", params={"limit": 1000}).json()["items"]


def test_twelve_hobbies_that_differ_in_a_number_are_twelve_facts(tmp_path, fake_llm: FakeLLM):
    """The repro of the issue: "I love hobby number N." x12 became 1 fact."""
    fake_llm.on(
        "extract_facts",
        lambda req: {
            "facts": [
                {"text": f"Master loves hobby number {n}.", "importance": 5, "entity": "master"}
                for n in _HOBBY.findall(last_user_text(req))
            ]
        },
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False)
    with LiveServer(settings) as srv:
        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).status_code == 200  # one call per turn
        for n in range(1, 13):
            body = {"input_history": [{"role": "user", "content": f"I love hobby number {n}."}, {"role": "assistant", "content": "Nice!"}]}
            assert srv.post(f"/cache/{NAME}", json=body).status_code == 200
        wait_for(lambda: len(fake_llm.calls("extract_facts")) == 12, what="twelve extractions")
        wait_for(lambda: len(facts(srv)) == 12, what="twelve facts")
        assert sorted(int(_HOBBY.search(f["text"]).group(1)) for f in facts(srv)) == list(range(1, 13))


def test_facts_that_differ_in_a_negation_or_a_name_are_kept_and_true_duplicates_are_not(tmp_path):
    pairs = [
        ("On Saturday Master went hiking with Alice in the mountains near the lake", "entity"),
        ("On Saturday Master went hiking with Bob in the mountains near the lake", "name"),
        ("Master likes drinking green tea in the quiet evening after work", "entity"),
        ("Master does not like drinking green tea in the quiet evening after work", "negation"),
        ("主人每天晚上都喜欢喝一杯热的绿茶", "entity"),
        ("主人每天晚上都不喜欢喝一杯热的绿茶", "negation"),
        ("ご主人は毎晩あたたかい緑茶を飲むのが好きです", "entity"),
        ("ご主人は毎晩あたたかい緑茶を飲むのが好きではありません", "negation"),
    ]
    settings = make_settings(tmp_path, embedding_enabled=False)
    with LiveServer(settings) as srv:
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t, _ in pairs]})
        assert r.status_code == 200, r.text
        assert len(r.json()["added"]) == len(pairs)
        # The same statement, differently cased and punctuated, is still a duplicate.
        again = srv.post(
            f"/api/characters/{NAME}/facts",
            json={"facts": [{"text": "on saturday master went hiking with alice in the mountains near the lake!"}]},
        )
        assert again.json() == {"added": [], "skipped_duplicates": 1}


def test_pending_counts_an_import_from_its_acknowledgement_until_every_vector_is_computed(tmp_path, embedding_service):
    settings = make_settings(tmp_path)
    texts = [f"Master keeps stamp {n} of the old harbour series in a blue album" for n in range(2000)]
    with LiveServer(settings, embeddings=embedding_service) as srv:
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in texts]})
        assert r.status_code == 200 and len(r.json()["added"]) == 2000
        first = srv.get("/health").json()["embeddings"]["pending"]
        assert first > 0, "pending read 0 right after the import was acknowledged"
        rows = srv.get("/api/browse/characters").json()["characters"]
        assert [row["embeddings_pending"] for row in rows if row["name"] == NAME][0] > 0
        # No query in between: the count alone must reach 0, and only when all are done.
        wait_for(lambda: srv.get("/health").json()["embeddings"]["pending"] == 0, timeout=600, what="every vector")
        rows = srv.get("/api/browse/characters").json()["characters"]
        assert [row["embeddings_pending"] for row in rows if row["name"] == NAME] == [0]
    # The server stopped right after pending read 0: every fact it wrote has its vector.
    stored = json.loads((tmp_path / NAME / "facts.json").read_text(encoding="utf-8"))
    assert len(stored) == 2000
    assert all(f.get("embedding") and f.get("embedding_model_id") for f in stored)


def test_a_tool_message_is_stored_as_a_human_turn_and_the_batch_is_accepted(tmp_path):
    settings = make_settings(tmp_path, embedding_enabled=False)
    with LiveServer(settings) as srv:
        body = {
            "input_history": [
                {"role": "user", "content": "What's the weather?"},
                {"role": "tool", "content": "sunny, 22 degrees"},
                {"role": "function", "content": "lookup done"},
                {"role": "assistant", "content": "It is sunny today."},
            ]
        }
        r = srv.post(f"/cache/{NAME}", json=body)
        assert r.status_code == 200, r.text
        rows = srv.get(f"/api/browse/{NAME}/journal", params={"order": "asc"}).json()["items"]
        assert [(row["role"], row["text"]) for row in rows] == [
            ("human", "What's the weather?"),
            ("human", "sunny, 22 degrees"),
            ("human", "lookup done"),
            ("ai", "It is sunny today."),
        ]
