"""Untrusted model output and failing models: retried within bounds, then recorded; the
conversation routes keep answering; no view is corrupted."""

from __future__ import annotations

import json
import re

from tests.support.fake_llm import Reply
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for


def fault_settings(root, llm, **extra):
    values = dict(
        llm_base_url=llm.base_url,
        llm_model="fake",
        llm_backoff_base_seconds=0.0,
        llm_max_retries=3,
        outbox_retry_delay_seconds=0.0,
        powerful_memory_default=False,  # per-turn extraction: one call per /cache
    )
    values.update(extra)
    return make_settings(root, **values)


def all_views_parse(root):
    for path in root.rglob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))


def test_malformed_answers_are_retried_then_parsed(tmp_path, fake_llm):
    good = {
        "facts": [
            {"text": "Master collects vinyl records", "importance": 6, "entity": "master", "event_start_at": None, "event_end_at": None}
        ]
    }
    fake_llm.queue(
        "extract_facts",
        Reply.text("I could not decide, sorry."),  # prose only
        Reply.json({"facts": [{"text": 5, "importance": "high"}]}),  # wrong types
        Reply.json({"items": []}),  # missing field
        Reply.text("Here you go:\n```json\n" + json.dumps(good) + ",\n```\nHope it helps"),  # fenced, trailing comma, prose
    )
    with LiveServer(fault_settings(tmp_path, fake_llm)) as srv:
        r = srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "I keep buying old records"}]})
        assert r.status_code == 200
        wait_for(lambda: srv.get("/api/characters/Lan/facts").json()["total"] == 1, what="the fact")
        assert len(fake_llm.calls("extract_facts")) == 4
        tiers = srv.get("/health").json()["llm"]["tiers"]
        assert tiers["summary"]["attempts"] >= 4
    all_views_parse(tmp_path)


def test_a_model_that_keeps_failing_is_dead_lettered_and_chat_goes_on(tmp_path, fake_llm):
    fake_llm.on("extract_facts", Reply.status(503, "overloaded"))
    with LiveServer(fault_settings(tmp_path, fake_llm, outbox_max_attempts=2, llm_max_retries=1)) as srv:
        r = srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "remember my birthday is in May"}]})
        assert r.status_code == 200
        outbox = tmp_path / "Lan" / "outbox.ndjson"
        # The outbox record is written after /cache answers (the turn's cursor is what is durable first).
        wait_for(
            lambda: outbox.exists() and any(json.loads(x).get("dead") for x in outbox.read_text().splitlines()), what="the dead letter"
        )
        lines = [json.loads(x) for x in outbox.read_text().splitlines()]
        attempts = [x for x in lines if x["status"] == "attempt"]
        assert len(attempts) == 2 and all("503" in a["error"] for a in attempts)  # each failure recorded
        assert len(fake_llm.calls("extract_facts")) == 2 * 2  # 2 outbox attempts x (1 try + 1 retry)
        health = srv.get("/health").json()["llm"]["tiers"]["summary"]
        assert health["failures"] >= 2 and health["last_error"]
        for i in range(5):
            assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"still chatting {i}"}]}).status_code == 200
        assert "still chatting 4" in srv.get("/new_dialog/Lan").text
    all_views_parse(tmp_path)


def test_slow_model_does_not_hold_the_conversation_routes(tmp_path, fake_llm):
    fake_llm.set_delay("extract_facts", 3.0)
    with LiveServer(fault_settings(tmp_path, fake_llm)) as srv:
        for i in range(10):
            r = srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"message {i}"}]})
            assert r.status_code == 200
        # The replies came back while every extraction was still sleeping in the model.
        assert len(fake_llm.calls("extract_facts")) < 10
        assert "message 9" in srv.get("/new_dialog/Lan").text


def test_map_evidence_with_unknown_ids_changes_nothing(tmp_path, fake_llm):
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master loves jazz",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    fake_llm.on("extract_facts", lambda req: {"facts": [{"text": "Master went to a jazz club", "importance": 6, "entity": "master"}]})

    def bogus_signals(req):
        prompt = json.dumps(req["messages"])
        fact_ids = re.findall(r"fact_[0-9]+_[0-9a-f]+", prompt)
        return {
            "signals": [
                {"fact_id": "fact_doesnotexist", "target_id": rid_holder[0], "signal": "reinforce"},
                {"fact_id": fact_ids[0] if fact_ids else "fact_x", "target_id": "ref_unknown", "signal": "negate"},
            ]
        }

    rid_holder = [""]
    fake_llm.on("map_evidence", bogus_signals)
    settings = make_settings(
        tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", llm_backoff_base_seconds=0.0, fact_extract_every_n_turns=1
    )
    with LiveServer(settings) as srv:
        facts = [
            {"text": f"Master listens to {x} records", "importance": 7} for x in ("Coltrane", "Miles Davis", "Monk", "Mingus", "Bill Evans")
        ]
        srv.post("/api/characters/Lan/facts", json={"facts": facts})
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        rid_holder[0] = rid
        srv.post(f"/api/characters/Lan/reflections/{rid}/feedback", json={"feedback": "confirmed"})
        srv.post("/reflect/Lan")  # confirms it (score 1.0)
        before = {r["id"]: r for r in srv.get("/api/characters/Lan/reflections").json()["items"]}[rid]
        assert before["status"] == "confirmed"
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "I went to a jazz club last night"}]})
        wait_for(lambda: fake_llm.calls("map_evidence"), what="the evidence pass")
        quiesce(srv.runtime, "Lan")
        after = {r["id"]: r for r in srv.get("/api/characters/Lan/reflections").json()["items"]}[rid]
        assert (after["reinforcement"], after["disputation"]) == (before["reinforcement"], before["disputation"])
    all_views_parse(tmp_path)
