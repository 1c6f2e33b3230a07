"""Facts -> reflections -> persona over real HTTP against the scripted LLM server."""

from __future__ import annotations

from datetime import datetime, timezone

from nekomem.runtime.clock import ManualClock
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

PREFERENCES = [
    "I really love green tea in the morning",
    "Jasmine tea is my favourite after dinner",
    "I always drink oolong when I study",
    "Matcha lattes are the best treat",
    "I never drink coffee, only tea",
]


def fact_outputs(request):
    facts = [
        {"text": f"Master says: {p}", "importance": 7, "entity": "master", "event_start_at": None, "event_end_at": None}
        for p in PREFERENCES
    ]
    return {"facts": facts}


REFLECTION = {
    "reflection": {
        "text": "Master loves tea and drinks it every day",
        "entity": "master",
        "time_scope": "pattern",
        "event_start_at": None,
        "event_end_at": None,
    }
}


def chat(srv, name, texts):
    for text in texts:
        r = srv.post(
            f"/cache/{name}",
            json={"input_history": [{"role": "user", "content": text}, {"role": "assistant", "content": "How lovely!"}]},
        )
        assert r.status_code == 200, r.text


def test_powerful_memory_path_to_persona(tmp_path, fake_llm):
    fake_llm.on("extract_facts", fact_outputs)
    fake_llm.on("synthesize_reflection", REFLECTION)
    fake_llm.on(
        "judge_promotion", lambda req: {"action": "promote", "target_id": None, "text": "Master loves tea, every day", "reason": None}
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings) as srv:
        chat(srv, "Lan", PREFERENCES + [f"and another thing {i}" for i in range(5)])  # 10 user turns
        wait_for(lambda: srv.get("/api/characters/Lan/facts").json()["total"] >= 5 or None, what="facts")
        assert fake_llm.calls("extract_facts")
        listing = srv.get("/api/characters/Lan/facts").json()
        assert {f["text"] for f in listing["items"]} >= {f"Master says: {p}" for p in PREFERENCES}
        assert all(f["id"].startswith("fact_") for f in listing["items"])

        r = srv.post("/reflect/Lan")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["reflection"] is not None, body
        rid = body["reflection"]["id"]
        assert rid.startswith("ref_")
        refs = srv.get("/api/characters/Lan/reflections").json()["items"]
        assert [x["status"] for x in refs if x["id"] == rid] == ["pending"]
        dialog = srv.get("/new_dialog/Lan").text
        assert "Master loves tea and drinks it every day" in dialog
        # Facts that fed the reflection are absorbed.
        absorbed = srv.get("/api/characters/Lan/facts", params={"status": "absorbed"}).json()["total"]
        assert absorbed >= 5

        for _ in range(2):
            r = srv.post(f"/api/characters/Lan/reflections/{rid}/feedback", json={"feedback": "confirmed"})
            assert r.status_code == 200, r.text
        assert r.json()["evidence_score"] >= 2.0

        r = srv.post("/reflect/Lan")
        body = r.json()
        assert any(p["reflection_id"] == rid and p["kind"] == "promoted" for p in body["promotion"]), body
        assert fake_llm.calls("judge_promotion")
        refs = srv.get("/api/characters/Lan/reflections").json()["items"]
        assert [x["status"] for x in refs if x["id"] == rid] == ["promoted"]
        persona = srv.get("/api/characters/Lan/persona").json()["items"]
        promoted = [e for e in persona if e["source_id"] == rid]
        assert [e["text"] for e in promoted] == ["Master loves tea and drinks it every day"], persona
        assert not promoted[0]["protected"]
        dialog = srv.get("/new_dialog/Lan").text
        # Rendered once, as persona knowledge (a promoted reflection leaves its sections).
        assert dialog.count("Master loves tea and drinks it every day") == 1


def test_powerful_memory_off_reaches_persona_by_time(tmp_path, fake_llm):
    clock = ManualClock(datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc))
    fake_llm.on("synthesize_reflection", REFLECTION)
    # Only /reflect promotes here (the clock jumps by days, which would fire the periodic
    # pass first), so its answer shows each step.
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        reflection_auto_promote_initial_delay_seconds=1e9,
        reflection_auto_promote_interval_seconds=1e9,
    )
    with LiveServer(settings, clock=clock) as srv:
        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).json() == {"success": True, "enabled": False}
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": False}
        facts = [{"text": f"Master says: {p}", "importance": 7, "entity": "master"} for p in PREFERENCES]
        r = srv.post("/api/characters/Lan/facts", json={"facts": facts})
        assert r.status_code == 200, r.text
        assert len(r.json()["added"]) == 5
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        assert srv.post("/reflect/Lan").json()["confirmed"] == []
        clock.advance(days=7, hours=1)
        body = srv.post("/reflect/Lan").json()
        assert rid in body["confirmed"]
        status = {x["id"]: x["status"] for x in srv.get("/api/characters/Lan/reflections").json()["items"]}
        assert status[rid] == "confirmed"
        clock.advance(days=7, hours=1)
        body = srv.post("/reflect/Lan").json()
        assert any(p["reflection_id"] == rid and p["kind"] == "promoted" for p in body["promotion"]), body
        status = {x["id"]: x["status"] for x in srv.get("/api/characters/Lan/reflections").json()["items"]}
        assert status[rid] == "promoted"
        assert not fake_llm.calls("judge_promotion")
        assert "Master loves tea and drinks it every day" in srv.get("/new_dialog/Lan").text


def test_card_entries_are_protected_and_rendered_first(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        r = srv.post(
            "/api/characters/Lan/card",
            json={
                "entries": [{"entity": "neko", "text": "Lan is a cheerful cat girl"}, {"entity": "master", "text": "Master is a night owl"}]
            },
        )
        assert r.status_code == 200, r.text
        assert len(r.json()["added"]) == 2
        again = srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "neko", "text": "Lan is a cheerful cat girl"}]}).json()
        assert again["added"] == []
        persona = srv.get("/api/characters/Lan/persona", params={"status": "protected"}).json()
        assert persona["total"] == 2 and all(e["protected"] for e in persona["items"])
        dialog = srv.get("/new_dialog/Lan").text
        assert "Lan is a cheerful cat girl" in dialog and "Master is a night owl" in dialog
        bad = srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "", "text": "x"}]})
        assert bad.status_code == 422 and bad.json()["status"] == "error"


def test_protected_card_entry_survives_a_contradicting_reflection(tmp_path, fake_llm):
    clock = ManualClock(datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc))
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master's favourite drink is not coffee at all",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", powerful_memory_default=False)
    with LiveServer(settings, clock=clock) as srv:
        srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "master", "text": "Master's favourite drink is coffee"}]})
        card = srv.get("/api/characters/Lan/persona", params={"status": "protected"}).json()["items"]
        facts = [
            {"text": f"Master said coffee is {x}", "importance": 7} for x in ("bitter", "too strong", "awful", "not for me", "overrated")
        ]
        srv.post("/api/characters/Lan/facts", json={"facts": facts})
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        for _ in range(3):
            clock.advance(days=8)
            srv.post("/reflect/Lan")
            # Decay and archive sweeps run too; protected entries are exempt.
            srv.runtime.registry.ask_sync(
                "Lan", "persona", lambda reply: __import__("nekomem.actors.messages", fromlist=["Flush"]).Flush(reply=reply)
            )
        persona = srv.get("/api/characters/Lan/persona").json()["items"]
        assert [e for e in persona if e["protected"]] == card
        assert not any(e["text"] == "Master's favourite drink is not coffee at all" for e in persona)
        status = {x["id"]: x["status"] for x in srv.get("/api/characters/Lan/reflections").json()["items"]}
        assert status[rid] != "promoted"
        assert "Master's favourite drink is coffee" in srv.get("/new_dialog/Lan").text


def test_periodic_disputation_scan_reads_new_user_messages(tmp_path, fake_llm):
    clock = ManualClock(datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc))
    fake_llm.on("synthesize_reflection", REFLECTION)
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", passivate_idle_seconds=1e9)
    with LiveServer(settings, clock=clock) as srv:
        facts = [{"text": f"Master says: {p}", "importance": 7} for p in PREFERENCES]
        srv.post("/api/characters/Lan/facts", json={"facts": facts})
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        srv.post(f"/api/characters/Lan/reflections/{rid}/feedback", json={"feedback": "confirmed"})
        srv.post("/reflect/Lan")
        fake_llm.on("check_disputation", lambda req: {"disputed": [{"reflection_id": rid}]})
        chat(srv, "Lan", ["These days I mostly drink hot chocolate instead"])
        before = {r["id"]: r for r in srv.get("/api/characters/Lan/reflections").json()["items"]}[rid]
        clock.advance(seconds=settings.longterm.reflection_rebuttal_initial_delay_seconds + 1)
        wait_for(lambda: fake_llm.calls("check_disputation"), what="the disputation scan")
        scan_prompt = str(fake_llm.calls("check_disputation")[-1]["body"])
        assert "hot chocolate" in scan_prompt
        after = wait_for(
            lambda: (lambda r: r if r["disputation"] > before["disputation"] else None)(
                {r["id"]: r for r in srv.get("/api/characters/Lan/reflections").json()["items"]}[rid]
            ),
            what="the disputation signal",
        )
        assert after["disputation"] > before["disputation"]
        calls = len(fake_llm.calls("check_disputation"))
        # The next scan has nothing new to read: no second call for the same message.
        clock.advance(seconds=settings.longterm.reflection_rebuttal_interval_seconds + 1)
        quiesce(srv.runtime, "Lan")
        assert len(fake_llm.calls("check_disputation")) == calls
