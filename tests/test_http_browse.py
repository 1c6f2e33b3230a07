"""The memory browser's API (/api/browse/...) and its page route (/ui), over real HTTP."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from nekomem.domain.records import Correction, PersonaEntry, persona_to_disk
from nekomem.http.browse_insight import _Snap, evidence_curve, split_sections
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import CharacterPaths
from tests.support.live import LiveServer, make_settings
from tests.support.ui_seed import seed_facts, seed_journal, seed_persona
from tests.support.waiting import wait_for


def _events(root, name):
    return [json.loads(x) for x in (root / name / "events.ndjson").read_text().splitlines()]


def test_characters_journal_and_facts_pages(tmp_path):
    seed_journal(tmp_path, "Diary", 300)
    seed_facts(tmp_path, "Big", 1000, archived=10)
    with LiveServer(make_settings(tmp_path)) as srv:
        chars = {c["name"]: c for c in srv.get("/api/browse/characters").json()["characters"]}
        # Listing reads passive characters from disk: nothing is activated by it.
        assert chars["Diary"]["active"] is False and chars["Diary"]["turns"] == 300
        assert chars["Big"]["counts"]["facts"] == 1000 and chars["Big"]["counts"]["facts_archived"] == 10
        assert srv.runtime.registry.active_names() == []

        page = srv.get("/api/browse/Diary/journal", params={"limit": 20, "offset": 40}).json()
        assert page["total"] == 300 and [r["id"] for r in page["items"]][:2] == [260, 259]
        asc = srv.get("/api/browse/Diary/journal", params={"order": "asc", "limit": 3}).json()
        assert [r["text"] for r in asc["items"]][0].startswith("journal line 00000")
        kites = srv.get("/api/browse/Diary/journal", params={"q": "KITES", "limit": 1000}).json()
        assert kites["total"] == 30 and all("about kites" in r["text"] for r in kites["items"])
        window = srv.get(
            "/api/browse/Diary/journal", params={"since": "2026-01-01T08:10:00+00:00", "until": "2026-01-01T09:10:00+00:00"}
        ).json()
        assert window["total"] == 61
        assert srv.get("/api/browse/Diary/journal", params={"since": "yesterday-ish"}).status_code == 400
        assert srv.get("/api/browse/Diary/journal", params={"order": "sideways"}).status_code == 400
        assert srv.get("/api/browse/Nobody/journal").json() == {"total": 0, "offset": 0, "items": []}

        big = srv.get("/api/browse/Big/facts", params={"importance_min": 9, "entity": "neko", "absorbed": "false", "limit": 1000}).json()
        expected = [i for i in range(1000) if 1 + i % 10 >= 9 and i % 3 == 1 and i % 7 != 0]
        assert big["total"] == len(expected)
        assert big["items"][0]["id"] == f"fact_seed_{expected[-1]:06d}"  # newest first
        assert all(not f["archived"] and f["importance"] >= 9 for f in big["items"])
        archived = srv.get("/api/browse/Big/facts", params={"status": "archived"}).json()
        assert archived["total"] == 10 and all(f["archived"] for f in archived["items"])
        text = srv.get("/api/browse/Big/facts", params={"q": "TOPIC 996", "status": "all"}).json()
        assert text["total"] == 1 and text["items"][0]["text"].endswith("topic 996")
        ids = srv.get("/api/browse/Big/facts", params={"ids": "fact_seed_000001,fact_seed_001005", "status": "all"}).json()
        assert sorted(f["id"] for f in ids["items"]) == ["fact_seed_000001", "fact_seed_001005"]
        for bad in ({"importance_min": 0}, {"absorbed": "maybe"}, {"entity": "cat"}, {"status": "gone"}, {"event_from": "soon"}):
            r = srv.get("/api/browse/Big/facts", params=bad)
            assert r.status_code == 400 and r.json()["error_code"] == "bad_query", bad


def test_event_time_filter_and_turn_span(tmp_path, fake_llm):
    fake_llm.on("extract_facts", {"facts": [{"text": "Master bought a green umbrella", "importance": 6, "entity": "master"}]})
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        srv.post(
            "/api/characters/Lan/facts",
            json={
                "facts": [
                    {"text": "Master visited Kyoto", "event_start_at": "2025-05-01T00:00:00+00:00"},
                    {"text": "Master visited Osaka", "event_start_at": "2026-05-01T00:00:00+00:00"},
                ]
            },
        )
        page = srv.get(
            "/api/browse/Lan/facts", params={"event_from": "2026-01-01T00:00:00Z", "event_to": "2026-12-31T00:00:00Z", "q": "visited"}
        ).json()
        assert [f["text"] for f in page["items"]] == ["Master visited Osaka"]
        srv.post(
            "/process/Lan",
            json={
                "input_history": [
                    {"role": "user", "content": "I bought an umbrella", "timestamp": "2026-11-30T10:00:00+00:00"},
                    {"role": "assistant", "content": "What colour?", "timestamp": "2026-11-30T10:00:05+00:00"},
                ]
            },
        )
        fact = wait_for(
            lambda: (srv.get("/api/browse/Lan/facts", params={"q": "umbrella"}).json()["items"] or [None])[0], what="the extracted fact"
        )
        # The extracted fact knows which turns it came from: the browser jumps to them.
        assert fact["source_ref"] == {"kind": "turns", "from": "2026-11-30T10:00:00+00:00", "to": "2026-11-30T10:00:05+00:00"}
        turns = srv.get("/api/browse/Lan/journal", params={"since": fact["source_ref"]["from"], "until": fact["source_ref"]["to"]}).json()
        assert [t["text"] for t in turns["items"]] == ["What colour?", "I bought an umbrella"]


def test_persona_suppress_corrections_and_review_switch(tmp_path):
    seed_persona(tmp_path, "Lan")
    with LiveServer(make_settings(tmp_path)) as srv:
        r = srv.post("/api/browse/Lan/persona/per_song/suppress", json={"suppress": True})
        assert r.status_code == 200 and r.json()["suppress"] is True
        entry = [e for e in srv.get("/api/characters/Lan/persona").json()["items"] if e["id"] == "per_song"][0]
        assert entry["suppress"] is True
        assert "Lan hums when she is happy" in srv.get("/new_dialog/Lan").text.split("Do not bring these up")[1]
        assert srv.post("/api/browse/Lan/persona/per_song/suppress", json={"suppress": False}).json()["suppress"] is False
        protected = srv.post("/api/browse/Lan/persona/card_1/suppress", json={"suppress": True})
        assert protected.status_code == 409 and protected.json()["error_code"] == "conflict"
        assert srv.post("/api/browse/Lan/persona/nope/suppress", json={"suppress": True}).status_code == 404
        assert srv.post("/api/browse/Lan/persona/per_song/suppress", json={"suppress": "yes"}).status_code == 422
        queue = srv.get("/api/browse/Lan/corrections").json()
        assert queue["total"] == 1 and queue["items"][0]["new_text"] == "Master switched to coffee in the mornings"

        assert srv.get("/api/memory/review_config").json() == {"enabled": True}
        assert srv.post("/api/memory/review_config", json={"enabled": False}).json() == {"success": True, "enabled": False}
        assert json.loads((tmp_path / "core_config.json").read_text())["recent_memory_auto_review"] is False
        assert srv.post("/api/memory/review_config", json={"enabled": "no"}).status_code == 400
    # Every change went through the journal.
    types = [e["type"] for e in _events(tmp_path, "Lan")]
    assert types.count("persona.suppressed") == 2


def test_recall_explain_shows_legs_and_removals(tmp_path, fake_llm):
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        srv.post(
            "/api/characters/Lan/facts",
            json={
                "facts": [
                    {"text": "Master flew a kite at the beach", "event_start_at": "2026-03-01T00:00:00+00:00"},
                    {"text": "Master repaired the kite string", "event_start_at": "2026-06-01T00:00:00+00:00"},
                ]
            },
        )
        fake_llm.on(
            "synthesize_reflection",
            {
                "reflection": {
                    "text": "Master loves kites",
                    "entity": "master",
                    "time_scope": "pattern",
                    "event_start_at": None,
                    "event_end_at": None,
                }
            },
        )
        for place in ("park", "hill", "field"):
            srv.post("/api/characters/Lan/facts", json={"facts": [{"text": f"Master flew a kite at the {place}", "importance": 8}]})
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        srv.post(f"/api/characters/Lan/reflections/{rid}/feedback", json={"feedback": "denied"})

        plain = srv.post("/query_memory/Lan", json={"query": "kite"}).json()
        explained = srv.post("/api/browse/Lan/recall_explain", json={"query": "kite"}).json()
        # The fused list is the one /query_memory answers.
        assert [r["id"] for r in explained["fused"]] == [r["id"] for r in plain["results"]]
        assert explained["vector_state"] == "no embedding service" and explained["vector_legs"] == []
        assert all(r["lexical_rank"] is not None and r["vector_ranks"] == [] for r in explained["fused"])
        # The denied reflection is kept out by the hard filter, and said so.
        assert [(h["id"], h["reason"]) for h in explained["hard_filtered"]] == [(rid, "status denied")]

        windowed = srv.post("/api/browse/Lan/recall_explain", json={"query": "kite string", "time": "2026-06-01"}).json()
        assert windowed["window"] is not None and windowed["in_window"] == 1
        removed = {r["text"]: r["removed"] for r in windowed["lexical"]}
        assert removed["Master repaired the kite string"] is None
        assert removed["Master flew a kite at the beach"] == "time_window"
        assert [r["text"] for r in windowed["fused"]] == ["Master repaired the kite string"]

        time_only = srv.post("/api/browse/Lan/recall_explain", json={"time": "2026-03-01"}).json()
        assert time_only["fused"][0]["text"] == "Master flew a kite at the beach"
        missing = srv.post("/api/browse/Lan/recall_explain", json={})
        assert missing.status_code == 422 and missing.json()["error_code"] == "missing_query"
        assert srv.post("/api/browse/Lan/recall_explain", json={"query": 5}).status_code == 422


def test_evidence_history_and_context_sections(tmp_path, fake_llm):
    seed_persona(tmp_path, "Lan")
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master loves kites",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hello"}]})
        srv.post(
            "/api/characters/Lan/facts",
            json={
                "facts": [{"text": f"Master flew a kite at the {p}", "importance": 8} for p in ("park", "hill", "field", "beach", "river")]
            },
        )
        rid = srv.post("/reflect/Lan").json()["reflection"]["id"]
        before = srv.get(f"/api/browse/Lan/reflections/{rid}/evidence").json()
        srv.post(f"/api/characters/Lan/reflections/{rid}/feedback", json={"feedback": "confirmed"})
        after = srv.get(f"/api/browse/Lan/reflections/{rid}/evidence").json()
        assert [e["type"] for e in after["events"]] == ["reflection.synthesized", "reflection.evidence_updated"]
        assert len(before["events"]) == 1 and after["reflection"]["status"] == "confirmed"
        assert after["curve"][-1]["net"] > before["curve"][-1]["net"]
        assert after["thresholds"] == {"confirm": 1.0, "promote": 2.0, "archive": -2.0}
        assert srv.get("/api/browse/Lan/reflections/nope/evidence").status_code == 404

        ctx = srv.get("/api/browse/Lan/context").json()
        assert ctx["text"] == srv.get("/new_dialog/Lan").text
        assert "".join(s["text"] for s in ctx["sections"]) == ctx["text"]
        by = {s["section"]: s for s in ctx["sections"]}
        assert "Master is a night owl" in by["persona"]["text"] and "Master loves kites" in by["reflections"]["text"]
        assert "hello" in by["recent"]["text"] and by["persona"]["budget"] > 0 and by["frame"]["budget"] is None
        assert sum(s["tokens"] for s in ctx["sections"]) >= ctx["tokens"] - len(ctx["sections"])


def test_split_sections_and_evidence_curve_units():
    text = "\n======Lan's Long-term Memory======\n## About Master\n- a\n\n### Do not bring these up on your own (Lan remembers them, but they came up too often recently)\n- b\n\n\n======Lan's Inner Thoughts======\nx\n"
    pieces = split_sections(text, "Lan", "Master")
    assert "".join(p for _s, p in pieces) == text
    assert [s for s, _p in pieces] == ["frame", "persona", "suppressed", "recent"]
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    snaps = [
        _Snap(
            at=t0,
            type="a",
            status="pending",
            reinforcement=1.0,
            disputation=0.0,
            rein_last_signal_at=t0.isoformat(),
            disp_last_signal_at=None,
        ),
        _Snap(
            at=t0 + timedelta(days=10),
            type="b",
            status="pending",
            reinforcement=2.0,
            disputation=1.0,
            rein_last_signal_at=(t0 + timedelta(days=10)).isoformat(),
            disp_last_signal_at=(t0 + timedelta(days=10)).isoformat(),
        ),
    ]
    curve = evidence_curve(snaps, t0, t0 + timedelta(days=20), 10.0, 5.0)
    assert curve[0]["net"] == 1.0
    jump = [p for p in curve if p["t"] == (t0 + timedelta(days=10)).isoformat()]
    assert [p["reinforcement"] for p in jump] == [0.5, 2.0]  # just before (one half-life) and at the event
    assert curve[-1]["reinforcement"] == 1.0 and curve[-1]["disputation"] == 0.25


def test_ui_page_is_served_with_guards(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.get("/ui").text == srv.get("/ui/").text  # the page uses absolute /ui/ paths
        page = srv.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        js = srv.get("/ui/app.js")
        assert js.headers["content-type"].startswith("text/javascript") and "import" in js.text
        # A name longer than the file system allows (the fuzzer's find: it once raised
        # ENAMETOOLONG and answered 500) and a directory are missing files like any other.
        too_long = "/ui/" + "%CC%BA" * 200 + "x.js"
        for bad in ("/ui/nope.js", "/ui/../pyproject.toml", "/ui/%2e%2e/http/app.py", "/ui/__init__.py", too_long, "/ui/static"):
            answer = srv.get(bad)
            assert answer.status_code == 404 and answer.json()["error_code"] == "not_found", bad


def test_corrupt_file_is_storage_trouble(tmp_path):
    paths = CharacterPaths(tmp_path, "Lan")
    paths.ensure()
    atomic_write_json(paths.persona, persona_to_disk({"master": [PersonaEntry(id="p1", text="x")]}))
    atomic_write_json(
        paths.persona_corrections, [Correction(old_text="a", new_text="b", entity="master", created_at="2026-01-01T00:00:00+00:00")]
    )
    paths.facts.write_text("[{broken")
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.get("/api/browse/Lan/facts")  # activation moves the corrupt view aside
        row = srv.get("/api/browse/characters").json()["characters"][0]
        assert row["active"] is True and any(t.startswith("facts.json.corrupt-") for t in row["trouble"])
        assert row["counts"]["persona"] == 1 and row["counts"]["corrections"] == 1


def test_fact_filter_compares_event_times_as_instants():
    from nekomem.domain.browse import FactFilter, page_facts
    from nekomem.domain.records import Fact

    tokyo = Fact(id="a", text="dinner in Tokyo", event_start_at="2026-05-01T08:00:00+09:00")  # 23:00 UTC the day before
    paris = Fact(id="b", text="lunch in Paris", event_start_at="2026-05-01T12:00:00+02:00")
    flt = FactFilter(event_from="2026-05-01T00:00:00+00:00", event_to="2026-05-01T23:59:59+00:00")
    total, page = page_facts([tokyo, paris], [], flt, 0, 10)
    assert total == 1 and page[0][0].id == "b"
    total, _ = page_facts([tokyo, paris], [], FactFilter(event_to="2026-04-30T23:30:00Z"), 0, 10)
    assert total == 1


def test_reads_of_an_unknown_character_create_nothing(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.get("/api/browse/Ghost/facts").json() == {"total": 0, "offset": 0, "items": []}
        assert srv.get("/api/browse/Ghost/journal").json()["total"] == 0
        assert srv.get("/api/browse/Ghost/corrections").json()["total"] == 0
        assert srv.get("/api/browse/Ghost/reflections_archived").json()["total"] == 0
        assert srv.get("/api/browse/Ghost/context").json()["text"] == ""
        assert srv.get("/api/browse/Ghost/reflections/x/evidence").status_code == 404
        assert srv.post("/api/browse/Ghost/recall_explain", json={"query": "kites"}).status_code == 404
        assert srv.get("/api/browse/characters").json() == {"characters": [], "total": 0, "offset": 0, "limit": 1000, "sort": "name"}
        assert not (tmp_path / "Ghost").exists() and srv.runtime.registry.active_names() == []
