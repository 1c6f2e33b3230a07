"""The reference memory browser's two routes that used to answer 404: the external
Markdown import (``/internal/memory/import_external_markdown``) and the repeated-phrase
review (``/internal/memory/{name}/repetition_insights``), with the bodies the reference's
main server forwards, against a real server."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.live import LiveServer, make_settings

NAME = "Lan"


def import_body(**extra: object) -> dict:
    body: dict = {
        "character_name": NAME,
        "source_format": "openclaw",
        "imported_files": ["USER.md", "MEMORY.md", "memory/2026-05-01.md"],
        "candidates": [
            {
                "text": "Master is a night owl",
                "entity": "master",
                "target": "persona",
                "source_file": "USER.md",
                "source_section": "Habits",
            },
            {"text": "Lan speaks softly", "entity": "neko", "target": "persona", "source_file": "SOUL.md"},
            {"text": "Master's cat is called Mochi", "entity": "master", "target": "facts", "source_file": "MEMORY.md"},
            {
                "text": "Went hiking at Mount Takao",
                "entity": "master",
                "target": "facts",
                "source_file": "memory/2026-05-01.md",
                "event_date": "2026-05-01",
            },
        ],
        "warning_count": 2,
    }
    body.update(extra)
    return body


def test_external_markdown_import_adds_persona_and_facts_once(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        r = srv.post("/internal/memory/import_external_markdown", json=import_body())
        assert r.status_code == 200, r.text
        assert r.json() == {
            "status": "success",
            "character_name": NAME,
            "source_format": "openclaw",
            "imported_files": ["USER.md", "MEMORY.md", "memory/2026-05-01.md"],
            "added_persona": 2,
            "added_facts": 2,
            "skipped_duplicates": 0,
            "warning_count": 2,
        }
        again = srv.post("/internal/memory/import_external_markdown", json=import_body()).json()
        assert (again["added_persona"], again["added_facts"], again["skipped_duplicates"]) == (0, 0, 4)

        persona = srv.get(f"/api/characters/{NAME}/persona", params={"limit": 100}).json()["items"]
        imported = {(e["entity"], e["text"]): e for e in persona if e.get("source") == "external_import"}
        assert set(imported) == {("master", "Master is a night owl"), ("neko", "Lan speaks softly")}
        assert not any(e["protected"] for e in imported.values())
        facts = {f["text"]: f for f in srv.get(f"/api/characters/{NAME}/facts", params={"limit": 100}).json()["items"]}
        hike = facts["Went hiking at Mount Takao"]
        assert hike["importance"] == 7 and hike["event_start_at"].startswith("2026-05-01T00:00:00")
        assert hike["source_ref"]["external_import"]["file"] == "memory/2026-05-01.md"
        assert "Master is a night owl" in srv.get(f"/new_dialog/{NAME}").text

        # Bad bodies: a clear 400 naming the problem, nothing stored.
        bad = import_body(source_format="notion")
        assert srv.post("/internal/memory/import_external_markdown", json=bad).json()["error_code"] == "bad_source_format"
        bad = import_body(candidates=[{"text": "x", "entity": "cat", "target": "facts", "source_file": "a.md"}])
        r = srv.post("/internal/memory/import_external_markdown", json=bad)
        assert r.status_code == 400 and r.json()["error_code"] == "bad_candidate" and "candidates[0]" in r.json()["message"]
        assert srv.post("/internal/memory/import_external_markdown", json=import_body(candidates=[])).status_code == 400
        r = srv.post("/internal/memory/import_external_markdown", json=import_body(character_name="../etc"))
        assert r.status_code == 400
        assert len(srv.get(f"/api/characters/{NAME}/facts", params={"limit": 100}).json()["items"]) == 2


def test_repetition_insights_finds_the_repeated_phrases_of_replies_only(tmp_path: Path) -> None:
    replies = [
        "[20261201 Tue 09:59]Of course, quiet lantern nights are the best, nya",
        "I love the rain. Quiet lantern nights again?",
        "Quiet lantern nights make me sleepy",
        "Silver morning light is nice",
        "Silver morning light again",
    ]
    history = []
    for text in replies:
        history += [{"role": "user", "content": "quiet lantern nights quiet lantern nights"}, {"role": "assistant", "content": text}]
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.post(f"/cache/{NAME}", json={"input_history": json.dumps(history)})
        r = srv.post(f"/internal/memory/{NAME}/repetition_insights", json={"language": "en", "assistant_message_limit": 50})
        assert r.status_code == 200, r.text
        report = r.json()
        assert report["success"] is True and report["artifact_type"] == "user_review_candidates"
        assert report["parameters"] == {"assistant_message_limit": 50, "message_count_threshold": 3}
        assert report["summary"]["assistant_message_count"] == 5 and report["summary"]["source_available"] is True
        # Found in three replies (user messages do not count); "silver morning light" only in two.
        assert [(c["normalized_phrase"], c["message_count"]) for c in report["candidates"]] == [("quiet lantern nights", 3)]
        assert report["candidates"][0]["phrase"] == "quiet lantern nights"
        assert "20261201" not in json.dumps(report)

        # Only the newest replies are analysed: with a limit of 3, two of the three are gone.
        r = srv.post(f"/internal/memory/{NAME}/repetition_insights", json={"language": "en", "assistant_message_limit": 3})
        assert r.json()["candidates"] == [] and r.json()["summary"]["assistant_message_count"] == 3

        cjk = [{"role": "assistant", "content": f"今天也要加油喵，第{i}次"} for i in range(3)]
        srv.post("/cache/Mochi", json={"input_history": cjk})
        zh = srv.post("/internal/memory/Mochi/repetition_insights", json={"language": "zh-CN"}).json()
        assert zh["candidates"][0]["phrase"] == "今天也要加油喵" and zh["candidates"][0]["message_count"] == 3

        unknown = srv.post("/internal/memory/Nobody/repetition_insights", json={"language": "en"}).json()
        assert unknown["summary"]["source_available"] is False and unknown["candidates"] == []
        assert not (tmp_path / "Nobody").exists()
        r = srv.post(f"/internal/memory/{NAME}/repetition_insights", json={"language": "fr"})
        assert r.status_code == 422 and "language" in r.json()["message"]
        r = srv.post(f"/internal/memory/{NAME}/repetition_insights", json={"language": "en", "assistant_message_limit": 2})
        assert r.status_code == 422


def test_prompt_locale_is_stored_and_used_by_the_context(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "hello"}]})
        assert srv.get(f"/prompt-locale/{NAME}").json() == {"success": True, "language": None, "order": 0, "effective_language": "en"}
        assert "Inner Thoughts" in srv.get(f"/new_dialog/{NAME}").text
        r = srv.client.put(f"/prompt-locale/{NAME}", json={"language": "ja"})  # type: ignore[union-attr]
        assert r.json() == {"success": True, "language": "ja", "order": 1, "previous_language": None, "changed": True}
        assert srv.get(f"/prompt-locale/{NAME}").json()["language"] == "ja"
        assert "の心の中" in srv.get(f"/new_dialog/{NAME}").text
        assert "の心の中" in srv.get(f"/new_dialog/{NAME}", params={"render_language": "en"}).text
        # An explicit request language wins, and is kept as the character's (as the
        # reference keeps it); render_language does not override the stored one.
        assert "Inner Thoughts" in srv.get(f"/new_dialog/{NAME}", params={"language": "en"}).text
        assert srv.get(f"/prompt-locale/{NAME}").json()["language"] == "en"
        assert "Inner Thoughts" in srv.get(f"/new_dialog/{NAME}", params={"render_language": "ja"}).text
        again = srv.client.put(f"/prompt-locale/{NAME}", json={"language": "zh-CN"}).json()  # type: ignore[union-attr]
        assert again == {"success": True, "language": "zh-CN", "order": 3, "previous_language": "en", "changed": True}
        r = srv.client.put(f"/prompt-locale/{NAME}", json={"language": "fr"})  # type: ignore[union-attr]
        assert r.status_code == 400 and r.json()["error_code"] == "unsupported_language"
        assert srv.get(f"/prompt-locale/{NAME}").json()["language"] == "zh-CN"


def test_search_for_memory_answers_the_recall_block_as_json(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        facts = [{"text": "Master drinks green tea every morning", "importance": 6}, {"text": "Master owns a red bicycle"}]
        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).status_code == 200
        r = srv.get(f"/search_for_memory/{NAME}/green tea")
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
        text = r.json()
        assert isinstance(text, str) and "green tea every morning" in text and "red bicycle" not in text
        nothing = srv.get("/search_for_memory/Nobody/green tea").json()
        assert isinstance(nothing, str) and "green tea every morning" not in nothing
        assert not (tmp_path / "Nobody").exists()


def test_get_persona_answers_the_reference_shape(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        card = {"entries": [{"entity": "neko", "text": "Lan is gentle"}, {"entity": "master", "text": "Master is a student"}]}
        assert srv.post(f"/api/characters/{NAME}/card", json=card).status_code == 200
        persona = srv.get(f"/get_persona/{NAME}").json()
        assert [e["text"] for e in persona["neko"]["facts"]] == ["Lan is gentle"]
        assert [e["text"] for e in persona["master"]["facts"]] == ["Master is a student"]
        entry = persona["neko"]["facts"][0]
        assert entry["protected"] is True and entry["source"] == "character_card" and entry["id"].startswith("card_")
        assert "entity" not in entry and entry["embedding"] is None
        assert srv.get("/get_persona/Nobody").json() == {} and not (tmp_path / "Nobody").exists()
