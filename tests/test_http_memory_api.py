"""The /api/characters memory API: list, edit and delete entries of every layer."""

from __future__ import annotations

import json

from tests.support.live import LiveServer, make_settings


def test_list_edit_delete_facts_and_recent(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        r = srv.post(
            "/api/characters/Lan/facts",
            json={
                "facts": [
                    {"text": "Master likes kites", "importance": 4},
                    {
                        "text": "Master owns a red bicycle",
                        "importance": 6,
                        "entity": "master",
                        "event_start_at": "2026-04-01T00:00:00+00:00",
                    },
                ]
            },
        )
        added = r.json()["added"]
        assert len(added) == 2
        again = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master likes kites", "importance": 4}]}).json()
        assert again == {"added": [], "skipped_duplicates": 1}
        listing = srv.get("/api/characters/Lan/facts", params={"limit": 1}).json()
        assert listing["total"] == 2 and len(listing["items"]) == 1
        fid = added[0]
        edited = srv.patch(f"/api/characters/Lan/facts/{fid}", json={"text": "Master loves kites", "importance": 7})
        assert edited.status_code == 200 and edited.json()["text"] == "Master loves kites"
        assert srv.patch(f"/api/characters/Lan/facts/{fid}", json={"importance": 11}).status_code == 422
        assert srv.patch(f"/api/characters/Lan/facts/{fid}", json={"colour": "blue"}).status_code == 422
        assert srv.patch("/api/characters/Lan/facts/fact_nope", json={"text": "x"}).status_code == 404
        assert srv.delete(f"/api/characters/Lan/facts/{added[1]}").json() == {"deleted": added[1]}
        assert srv.delete(f"/api/characters/Lan/facts/{added[1]}").status_code == 404
        texts = [f["text"] for f in srv.get("/api/characters/Lan/facts").json()["items"]]
        assert texts == ["Master loves kites"]
        # Bad imports are refused whole.
        bad = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "ok"}, {"text": ""}]})
        assert bad.status_code == 422 and "facts[1]" in bad.json()["message"]

        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "helo"}, {"role": "assistant", "content": "hi"}]})
        recent = srv.get("/api/characters/Lan/recent").json()
        assert [i["text"] for i in recent["items"]] == ["helo", "hi"]
        assert srv.patch("/api/characters/Lan/recent/0", json={"text": "hello"}).status_code == 200
        assert srv.delete("/api/characters/Lan/recent/1").status_code == 200
        assert srv.delete("/api/characters/Lan/recent/5").status_code == 404
        assert [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]] == ["hello"]
        assert srv.get("/api/characters/Lan/nolayer").status_code == 404
        assert srv.get("/api/characters/Lan/facts", params={"limit": "many"}).status_code == 400
        chars = srv.get("/api/characters").json()["characters"]
        assert {"name": "Lan", "active": True} in chars
    # The change went through the journal: it survives a restart.
    with LiveServer(make_settings(tmp_path)) as srv:
        assert [f["text"] for f in srv.get("/api/characters/Lan/facts").json()["items"]] == ["Master loves kites"]
    events = [json.loads(x)["type"] for x in (tmp_path / "Lan" / "events.ndjson").read_text().splitlines()]
    assert events.count("fact.added") == 2 and "fact.updated" in events and "fact.deleted" in events


def test_edit_and_delete_reflections_and_persona(tmp_path, fake_llm):
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master enjoys windy days",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        facts = [{"text": f"Master flew a kite at the {p}", "importance": 7} for p in ("beach", "park", "hill", "field", "river")]
        srv.post("/api/characters/Lan/facts", json={"facts": facts})
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        r = srv.patch(f"/api/characters/Lan/reflections/{rid}", json={"text": "Master loves flying kites"})
        assert r.status_code == 200 and r.json()["text"] == "Master loves flying kites"
        assert "Master loves flying kites" in srv.get("/new_dialog/Lan").text
        bad = srv.post(f"/api/characters/Lan/reflections/{rid}/feedback", json={"feedback": "maybe"})
        assert bad.status_code == 422
        assert srv.post("/api/characters/Lan/reflections/ref_unknown/feedback", json={"feedback": "denied"}).status_code == 404
        assert srv.delete(f"/api/characters/Lan/reflections/{rid}").status_code == 200
        assert srv.get("/api/characters/Lan/reflections").json()["total"] == 0

        card = srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "neko", "text": "Lan likes fish"}]}).json()["added"][0]
        assert srv.patch(f"/api/characters/Lan/persona/{card}", json={"text": "Lan adores fish"}).json()["text"] == "Lan adores fish"
        assert "Lan adores fish" in srv.get("/new_dialog/Lan").text
        assert srv.delete(f"/api/characters/Lan/persona/{card}").status_code == 200
        assert srv.get("/api/characters/Lan/persona").json()["total"] == 0
