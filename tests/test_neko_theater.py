"""The reference's numeric theater against a real server: its /cache capsule write (with
the body fields its router sends), theater/stories, theater/forget and theater/retract,
checked in recent.json, time_indexed.db, the outbox and the facts, as the reference's own
tests check them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tests.support.fake_llm import prompt_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
SOURCE = "theater_numeric_v2"


def capsule(story: str, session: str, summary: str, *, through: int = 5, status: str = "paused", **extra: Any) -> dict:
    """One message as the theater's build_numeric_v2_memory_messages makes it."""
    meta = {
        "source": SOURCE,
        "memory_tier": "episode_summary",
        "message_kind": "episode_summary",
        "story_id": story,
        "session_id": session,
        "story_title": "Rainy Night",
        "episode_status": status,
        "episode_summary": summary,
        "archive_from_revision": 1,
        "archive_through_revision": through,
        **extra,
    }
    return {"role": "system", "content": [{"type": "text", "text": summary}], "metadata": meta}


def archive_body(message: dict, request_id: str, attempt: int = 1, marker: str | None = None) -> dict:
    """The body the theater router posts to /cache (input_history double-encoded)."""
    return {
        "input_history": json.dumps([message], ensure_ascii=False),
        "idempotency_key": request_id,
        "theater_archive_attempt": attempt,
        "theater_forget_marker": marker,
    }


def recent_items(root: Path) -> list[dict]:
    return json.loads((root / NAME / "recent.json").read_text(encoding="utf-8"))


def theater_recent(root: Path) -> list[dict]:
    return [m for m in recent_items(root) if (m["data"].get("metadata") or {}).get("source") == SOURCE]


def journal(root: Path) -> list[tuple[str, dict, str | None]]:
    db = sqlite3.connect(root / NAME / "time_indexed.db")
    try:
        rows = db.execute("SELECT session_id, message, timestamp FROM time_indexed_original ORDER BY id").fetchall()
    finally:
        db.close()
    return [(sid, json.loads(message), ts) for sid, message, ts in rows]


def theater_rows(root: Path) -> list[tuple[str, dict, str | None]]:
    return [r for r in journal(root) if (r[1]["data"].get("metadata") or {}).get("source") == SOURCE]


def everywhere(root: Path, text: str) -> list[str]:
    """The files of the character folder whose bytes hold ``text``."""
    hits = []
    for path in (root / NAME).rglob("*"):
        if path.is_file() and text.encode("utf-8") in path.read_bytes():
            hits.append(path.name)
    if any(text in json.dumps(row[1], ensure_ascii=False) for row in journal(root)):
        hits.append("time_indexed.db")
    return hits


def test_capsule_posted_twice_is_stored_once_listed_rendered_and_forgotten(tmp_path: Path, fake_llm) -> None:
    fake_llm.on("extract_facts", {"facts": [{"text": "Master drinks green tea", "importance": 6, "entity": "master"}]})
    summary = "Lan and Master hid from the storm in an old lighthouse."
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", fact_extract_idle_seconds=0.2)
    with LiveServer(settings) as srv:
        assert srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "I drink green tea"}]}).status_code == 200
        body = archive_body(capsule("story_rain", "session_rain", summary, performed_at="2026-05-01T21:30:00"), "archive-1")
        first = srv.post(f"/cache/{NAME}", json=body)
        assert first.status_code == 200 and first.json() == {"status": "cached", "count": 1}, first.text
        # The theater's retry of the same archive (a timeout it could not read): stored once.
        again = srv.post(f"/cache/{NAME}", json=body)
        assert again.json() == {"status": "cached", "count": 1}

        stored = theater_recent(tmp_path)
        assert len(stored) == 1
        meta = stored[0]["data"]["metadata"]
        assert meta["source"] == SOURCE and meta["story_id"] == "story_rain" and meta["session_id"] == "session_rain"
        assert meta["run_index"] == 1 and meta["story_run_count"] == 1 and meta["archive_through_revision"] == 5
        assert stored[0]["data"]["content"] == summary
        rows = theater_rows(tmp_path)
        assert len(rows) == 1 and rows[0][0].startswith("theater-story-")
        assert rows[0][1]["data"]["metadata"]["story_id"] == "story_rain"
        assert rows[0][2] == "2026-05-01T21:30:00.000000+00:00"  # performed_at, not the archive time

        listing = srv.get(f"/internal/memory/{NAME}/theater/stories").json()
        assert listing == {"ok": True, "stories": [{"story_id": "story_rain", "title": "Rainy Night", "memory_summaries": [summary]}]}
        context = srv.get(f"/new_dialog/{NAME}", params={"language": "en"}).text
        assert "theater story “Rainy Night”" in context and "fictional" in context and summary in context
        assert context.count(summary) == 1

        # An ordinary turn after the capsule: fact extraction runs, and never sees the capsule.
        srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "Tea again tonight"}]})
        assert fake_llm.wait_for_calls(1, "extract_facts", timeout=30)
        srv.post("/reflect/" + NAME)
        assert all(summary not in prompt_text(call["body"]) for call in fake_llm.calls())

        forgot = srv.post(f"/internal/memory/{NAME}/theater/forget", json={"story_id": "story_rain"}).json()
        assert forgot["ok"] is True and forgot["removed_recent"] == 1 and forgot["removed_time_index"] == 1
        assert isinstance(forgot["forget_marker"], str) and len(forgot["forget_marker"]) >= 32
        assert theater_recent(tmp_path) == [] and theater_rows(tmp_path) == []
        assert everywhere(tmp_path, summary) == []
        assert srv.get(f"/internal/memory/{NAME}/theater/stories").json() == {"ok": True, "stories": []}
        assert summary not in srv.get(f"/new_dialog/{NAME}").text
        # The ordinary turns are untouched.
        assert [m["data"]["content"] for m in recent_items(tmp_path)] == ["I drink green tea", "Tea again tonight"]

        # A late write issued before the forget (no marker) is dropped; one carrying the
        # marker (issued after the forget) is stored.
        late = srv.post(f"/cache/{NAME}", json=body).json()
        assert late == {"status": "retracted", "count": 0} and theater_recent(tmp_path) == []
        fresh = archive_body(capsule("story_rain", "session_2", "A second night."), "archive-2", marker=forgot["forget_marker"])
        assert srv.post(f"/cache/{NAME}", json=fresh).json()["status"] == "cached"
        assert [m["data"]["metadata"]["session_id"] for m in theater_recent(tmp_path)] == ["session_2"]

    # After a restart nothing comes back and no post-turn work was derived from capsules.
    with LiveServer(settings) as srv:
        assert [s["memory_summaries"] for s in srv.get(f"/internal/memory/{NAME}/theater/stories").json()["stories"]] == [
            ["A second night."]
        ]
        assert summary not in srv.get(f"/new_dialog/{NAME}").text
    # (A record finished before its group write never reaches the file, so it may be absent.)
    outbox_path = tmp_path / NAME / "outbox.ndjson"
    outbox = outbox_path.read_text(encoding="utf-8") if outbox_path.exists() else ""
    assert "A second night." not in outbox and SOURCE not in outbox


def test_retract_takes_back_one_archive_restores_the_previous_and_fences_late_attempts(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        url = f"/internal/memory/{NAME}/theater"
        early = capsule("story_rain", "session_rain", "They reached the lighthouse.", through=3)
        assert srv.post(f"/cache/{NAME}", json=archive_body(early, "archive-a")).json()["status"] == "cached"
        later = capsule("story_rain", "session_rain", "They lit the lamp together.", through=7, status="completed", ending_title="Dawn")
        assert srv.post(f"/cache/{NAME}", json=archive_body(later, "archive-b")).json()["status"] == "cached"
        kept = theater_recent(tmp_path)
        assert len(kept) == 1 and kept[0]["data"]["content"] == "They lit the lamp together."
        assert kept[0]["data"]["metadata"]["ending_titles_seen"] == ["Dawn"]
        context = srv.get(f"/new_dialog/{NAME}", params={"language": "en"}).text
        assert "completed with the ending “Dawn”" in context

        # The player declines archive-b: its capsule goes, the earlier version comes back.
        body = {
            "story_id": "story_rain",
            "session_id": "session_rain",
            "archive_through_revision": 7,
            "archive_request_id": "archive-b",
            "archive_attempt": 1,
        }
        answer = srv.post(f"{url}/retract", json=body).json()
        assert answer["ok"] is True and answer["removed_recent"] == 1 and answer["removed_time_index"] == 1
        assert [m["data"]["content"] for m in theater_recent(tmp_path)] == ["They reached the lighthouse."]
        assert [r[1]["data"]["content"] for r in theater_rows(tmp_path)] == ["They reached the lighthouse."]
        assert everywhere(tmp_path, "They lit the lamp together.") == []
        # Retracting again changes nothing; a late attempt 1 of archive-b is dropped...
        assert srv.post(f"{url}/retract", json=body).json() == {"ok": True, "removed_recent": 0, "removed_time_index": 0}
        assert srv.post(f"/cache/{NAME}", json=archive_body(later, "archive-b", attempt=1)).json() == {"status": "retracted", "count": 0}
        assert everywhere(tmp_path, "They lit the lamp together.") == []
        # ...while the player's later explicit choice to remember (attempt 2) is stored.
        assert srv.post(f"/cache/{NAME}", json=archive_body(later, "archive-b", attempt=2)).json()["status"] == "cached"
        assert [m["data"]["content"] for m in theater_recent(tmp_path)] == ["They lit the lamp together."]

        # Retracting it again restores the earlier range; retracting that one, which has
        # nothing before it, removes the session's capsule entirely.
        srv.post(f"{url}/retract", json={**body, "archive_request_id": ""})
        assert [m["data"]["content"] for m in theater_recent(tmp_path)] == ["They reached the lighthouse."]
        srv.post(f"{url}/retract", json={**body, "archive_request_id": "", "archive_through_revision": 3})
        assert theater_recent(tmp_path) == [] and theater_rows(tmp_path) == []


def test_theater_limits_and_bad_bodies(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        for run in range(1, 6):
            message = capsule("story_rain", f"session_{run}", f"Run {run} of the rain story.", ending_title=f"End {run}")
            assert srv.post(f"/cache/{NAME}", json=archive_body(message, f"archive-{run}")).json()["status"] == "cached"
        kept = theater_recent(tmp_path)
        # The newest three sessions of a story stay, numbered, with the story's count and endings.
        assert [m["data"]["metadata"]["run_index"] for m in kept] == [3, 4, 5]
        assert kept[-1]["data"]["metadata"]["story_run_count"] == 5
        assert len(theater_rows(tmp_path)) == 3
        context = srv.get(f"/new_dialog/{NAME}", params={"language": "en"}).text
        assert "performed this story 5 times so far" in context and "End 5" in context

        # An idempotency key on an ordinary batch is refused, and nothing is stored.
        r = srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "hi"}], "idempotency_key": "k"})
        assert r.status_code == 400 and r.json()["error_code"] == "idempotency_key_requires_theater_episode"
        r = srv.post(f"/cache/{NAME}", json=archive_body(capsule("s", "t", "x"), "k" * 161))
        assert r.status_code == 400 and r.json()["error_code"] == "idempotency_key_too_long"
        assert all(m["data"]["content"] != "hi" for m in recent_items(tmp_path))
        r = srv.post(f"/internal/memory/{NAME}/theater/forget", json={"story_id": "  "})
        assert r.status_code == 422 and r.json()["error_code"] == "story_id_required"
        r = srv.post(f"/internal/memory/{NAME}/theater/retract", json={"story_id": "s"})
        assert r.status_code == 422 and r.json()["error_code"] == "schema_violation"
        assert srv.get("/internal/memory/Nobody/theater/stories").status_code == 404
        # Message metadata of an ordinary turn is kept as sent.
        meta = {"source": "qq_bridge", "message_id": 42}
        srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "tagged", "metadata": meta}]})
        assert [m["data"]["metadata"] for m in recent_items(tmp_path) if m["data"]["content"] == "tagged"] == [meta]


def test_compression_keeps_capsules_whole_after_the_memo(tmp_path: Path, fake_llm) -> None:
    summary = "They sailed a paper boat across the bathtub sea."
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        assert srv.post(f"/cache/{NAME}", json=archive_body(capsule("story_boat", "s1", summary), "a1")).json()["status"] == "cached"
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn number {i}"} for i in range(25)]
        assert srv.post(f"/process/{NAME}", json={"input_history": turns}).json() == {"status": "processed"}
        # Answered once the turns are durable; the compression follows in the background.
        items = wait_for(
            lambda: (lambda got: got if got and got[0]["data"]["content"].startswith("Memo from") else None)(recent_items(tmp_path)),
            what="the memo",
        )
        assert items[0]["type"] == "system" and items[0]["data"]["content"].startswith("Memo from prior conversations: ")
        assert items[1]["data"]["content"] == summary and items[1]["data"]["metadata"]["story_id"] == "story_boat"
        assert [m["data"]["content"] for m in items[2:]] == [f"turn number {i}" for i in range(16, 25)]
        calls = fake_llm.calls("summarize_recent")
        assert calls and all(summary not in prompt_text(c["body"]) for c in calls)
        assert srv.get(f"/internal/memory/{NAME}/theater/stories").json()["stories"][0]["memory_summaries"] == [summary]


def test_a_review_answer_never_rewrites_a_capsule(tmp_path: Path, fake_llm) -> None:
    from tests.support.waiting import wait_for

    summary = "They built a pillow fort and defended it from the vacuum."
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"answr {i} with a typo"} for i in range(10)]

    def corrected(request: dict) -> dict:
        dialogue = [{"role": "system", "content": "REWRITTEN capsule"}]
        dialogue += [{"role": t["role"], "content": t["content"].replace("answr", "answer")} for t in turns]
        return {"explanation": "fixed", "corrected_dialogue": dialogue}

    fake_llm.on("review_recent", corrected)
    with LiveServer(make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")) as srv:
        srv.post(f"/cache/{NAME}", json=archive_body(capsule("story_fort", "s1", summary), "a1"))
        assert srv.post(f"/process/{NAME}", json={"input_history": turns}).status_code == 200
        meta_path = tmp_path / NAME / "recent_meta.json"
        wait_for(
            lambda: meta_path.exists() and json.loads(meta_path.read_text())["review"].get("last_review_ts"),
            timeout=30,
            what="the review to finish",
        )
        assert fake_llm.calls("review_recent")
        items = recent_items(tmp_path)
        assert [m["data"]["content"] for m in items if (m["data"].get("metadata") or {}).get("source") == SOURCE] == [summary]
        assert "REWRITTEN capsule" not in json.dumps(items)
