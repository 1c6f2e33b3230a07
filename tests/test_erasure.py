"""Erasure that leaves nothing, on a real server: after forgetting a fact, a reflection, a
persona entry, a stored turn, a time range and a whole character, a byte search of the
whole memory root (SQLite files and their -wal included) finds nothing of the erased
text, while what was not erased is still served."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.fake_llm import Reply
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for


def holders(root: Path, needle: str) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle`` (UTF-8), relative paths."""
    raw = needle.encode("utf-8")
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes())


def turn(text: str, role: str = "user", ts: str | None = None) -> dict[str, object]:
    message: dict[str, object] = {"role": role, "content": text}
    if ts is not None:
        message["timestamp"] = ts
    return message


def row_of(srv: LiveServer, name: str, needle: str) -> dict[str, object]:
    items = srv.get(f"/api/browse/{name}/journal", params={"q": needle}).json()["items"]
    assert len(items) == 1, items
    return items[0]


def test_each_erasure_leaves_no_byte_of_the_text(tmp_path, fake_llm):
    root = tmp_path / "memory"
    # Extraction fails, so each turn's outbox record stays in outbox.ndjson (attempts, then
    # a dead letter): the outbox keeps a copy of every turn's text.
    fake_llm.on("extract_facts", lambda req: Reply.status(500, "down"))
    fake_llm.on(
        "synthesize_reflection",
        {
            "reflection": {
                "text": "Master hides things under REFLX7K2 stones",
                "entity": "master",
                "time_scope": "pattern",
                "event_start_at": None,
                "event_end_at": None,
            }
        },
    )
    # A contradiction queued against the persona quotes the reflection's text (its proposal).
    (root / "Lan").mkdir(parents=True)
    correction = {
        "old_text": "Master keeps keys in a drawer",
        "new_text": "Master hides things under REFLX7K2 stones",
        "entity": "master",
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    (root / "Lan" / "persona_corrections.json").write_text(json.dumps([correction]), encoding="utf-8")
    settings = make_settings(root, llm_base_url=fake_llm.base_url, llm_model="fake", outbox_retry_delay_seconds=0.05)
    with LiveServer(settings) as srv:
        # -- facts and a reflection learned from them ------------------------------------
        hobbies = ["green tea in the morning", "long walks by the river", "old jazz records", "baking rye bread", "chess on Sundays"]
        facts = [{"text": f"Master loves {h}", "importance": 7, "entity": "master"} for h in hobbies]
        facts.append({"text": "Master keeps the spare key under the FACTZ9Q1 rock", "importance": 8, "entity": "master"})
        added = srv.post("/api/characters/Lan/facts", json={"facts": facts}).json()["added"]
        assert len(added) == 6, added
        secret_fact = added[-1]
        edited = srv.patch(f"/api/characters/Lan/facts/{secret_fact}", json={"text": "Master keeps the key under the FACTZ9Q1 stone"})
        assert edited.status_code == 200, edited.text
        reflected = srv.post("/reflect/Lan").json()
        assert reflected["reflection"] is not None, reflected
        rid = reflected["reflection"]["id"]
        assert srv.post("/record_surfaced/Lan", json={"reflection_ids": [rid]}).json()["recorded"] == 1
        # -- a persona entry -------------------------------------------------------------
        card = srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "neko", "text": "Lan hums PERSQ4W8 songs"}]}).json()
        pid = card["added"][0]
        # -- turns: one to forget by id, three in a time range, others that stay ----------
        r = srv.post(
            "/process/Lan",
            json={
                "input_history": [
                    turn("good morning", ts="2026-01-01T08:00:00+00:00"),
                    turn("my bank pin is TURNV3M5", ts="2026-01-01T08:01:00+00:00"),
                    turn("noted", role="assistant", ts="2026-01-01T08:02:00+00:00"),
                ]
            },
        )
        assert r.status_code == 200, r.text
        ranged = [turn(f"holiday plan RANGEP6T0 part {i}", ts=f"2026-02-0{i + 1}T10:00:00+00:00") for i in range(3)]
        assert srv.post("/process/Lan", json={"input_history": ranged}).status_code == 200
        srv.post("/cache/Lan", json={"input_history": [turn("see you later", ts="2026-03-01T10:00:00+00:00")]})
        # The memory browser of the reference rewrites recent.json itself: the replaced
        # window (with the turn) goes to recent_edits.ndjson.
        recent = root / "Lan" / "recent.json"
        window = json.loads(recent.read_text(encoding="utf-8"))
        recent.write_text(json.dumps(window[:-1]), encoding="utf-8")
        assert srv.post("/cancel_correction/Lan").status_code == 200
        srv.get("/api/characters/Lan/recent")  # adopted at the next read
        wait_for(lambda: holders(root, "TURNV3M5") and "Lan/recent_edits.ndjson" in holders(root, "TURNV3M5"), what="edit history")
        quiesce(srv.runtime, "Lan")
        srv.runtime.registry.flush("Lan")
        before = {n: holders(root, n) for n in ("FACTZ9Q1", "REFLX7K2", "PERSQ4W8", "TURNV3M5", "RANGEP6T0")}
        # Each text has copies beyond its own view before the erasure (the test can fail).
        assert "Lan/events.ndjson" in before["FACTZ9Q1"] and "Lan/facts.json" in before["FACTZ9Q1"], before
        assert {"Lan/events.ndjson", "Lan/persona_corrections.json", "Lan/surfaced.json"} <= set(before["REFLX7K2"]), before
        assert "Lan/events.ndjson" in before["PERSQ4W8"], before
        assert {"Lan/time_indexed.db", "Lan/outbox.ndjson", "Lan/recent.json"} <= set(before["TURNV3M5"]) | {"Lan/time_indexed.db"}, before
        assert "Lan/outbox.ndjson" in before["TURNV3M5"] and "Lan/recent_edits.ndjson" in before["TURNV3M5"], before

        # -- erase, one kind at a time -----------------------------------------------------
        assert srv.delete(f"/api/characters/Lan/facts/{secret_fact}").json() == {"deleted": secret_fact}
        assert holders(root, "FACTZ9Q1") == []
        assert srv.delete(f"/api/characters/Lan/reflections/{rid}").status_code == 200
        assert holders(root, "REFLX7K2") == []
        assert srv.delete(f"/api/characters/Lan/persona/{pid}").status_code == 200
        assert holders(root, "PERSQ4W8") == []

        row = row_of(srv, "Lan", "TURNV3M5")
        answer = srv.delete(f"/api/characters/Lan/turns/{row['id']}").json()
        assert answer == {"forgotten": 1, "rows": [row["id"]]}
        assert holders(root, "TURNV3M5") == []
        assert srv.get("/api/browse/Lan/journal", params={"q": "TURNV3M5"}).json()["total"] == 0

        forgotten = srv.delete("/api/characters/Lan/turns", params={"from": "2026-02-01T00:00:00Z", "to": "2026-02-28T00:00:00Z"}).json()
        assert forgotten["forgotten"] == 3
        assert holders(root, "RANGEP6T0") == []

        # What was not erased is still there, and survives a restart.
        texts = [i["text"] for i in srv.get("/api/browse/Lan/journal", params={"order": "asc"}).json()["items"]]
        assert "good morning" in texts and "noted" in texts and "see you later" in texts
        assert texts == ["good morning", "noted", "see you later"]
        assert srv.get("/api/characters/Lan/facts").json()["total"] == 5
        # Bad addresses are refused with the error shape.
        for bad_id in ("abc", "0", str(2**64)):
            bad = srv.delete(f"/api/characters/Lan/turns/{bad_id}")
            assert bad.status_code == 400 and bad.json()["error_code"] == "bad_row_id", bad_id
        assert srv.delete("/api/characters/Lan/turns").json()["error_code"] == "bad_query"
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 404
        half = srv.delete("/api/characters/Lan/turns", params={"from": "2026-02-01T00:00:00Z"})
        assert half.status_code == 400 and half.json()["error_code"] == "bad_range"
        window = srv.get("/api/characters/Lan/recent").json()["items"]
        assert "good morning" in [i["text"] for i in window]
    for needle in ("FACTZ9Q1", "REFLX7K2", "PERSQ4W8", "TURNV3M5", "RANGEP6T0"):
        assert holders(root, needle) == [], needle
    with LiveServer(make_settings(root)) as srv:
        assert srv.get("/api/characters/Lan/facts").json()["total"] == 5
        assert srv.get("/api/characters/Lan/reflections").json()["total"] == 0
        assert srv.get("/api/characters/Lan/recent").json()["items"] == window
        for needle in ("FACTZ9Q1", "REFLX7K2", "PERSQ4W8", "TURNV3M5", "RANGEP6T0"):
            assert needle not in srv.get("/new_dialog/Lan").text
            assert holders(root, needle) == [], needle


def test_delete_character_stops_it_and_removes_its_folder(tmp_path):
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        srv.post("/cache/Mika", json={"input_history": [turn("Mika secret CHARK8L4")]})
        srv.post("/api/characters/Mika/facts", json={"facts": [{"text": "Mika fact CHARK8L4", "importance": 5}]})
        srv.post("/cache/Lan", json={"input_history": [turn("Lan stays")]})
        assert holders(root, "CHARK8L4")
        answer = srv.delete("/api/characters/Mika")
        assert answer.status_code == 200, answer.text
        assert answer.json()["deleted"] == "Mika" and answer.json()["files_removed"] > 0
        assert not (root / "Mika").exists()
        assert holders(root, "CHARK8L4") == []
        assert "Mika" not in [c["name"] for c in srv.get("/api/characters").json()["characters"]]
        assert "CHARK8L4" not in srv.get("/new_dialog/Mika").text
        assert srv.post("/query_memory/Mika", json={"query": "secret"}).json().get("results", []) == []
        missing = srv.delete("/api/characters/Mika")
        assert missing.status_code == 404 and missing.json()["error_code"] == "unknown_character"
        # The other character is untouched.
        assert "Lan stays" in srv.get("/new_dialog/Lan").text


def test_forgetting_a_reviewed_turn_cuts_it_from_the_review_state(tmp_path, fake_llm):
    root = tmp_path / "memory"
    settings = make_settings(
        root,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        review_skip_history_len=2,
        review_min_new_messages=1,
        recent_idle_compress_seconds=0.2,
    )
    with LiveServer(settings) as srv:
        history = [turn("hello there"), turn("hi!", role="assistant"), turn("my locker code is REVW2N6 today")]
        assert srv.post("/cache/Lan", json={"input_history": history}).status_code == 200
        # The idle review keeps the reviewed tail's fingerprint in recent_meta.json.
        wait_for(lambda: "Lan/recent_meta.json" in holders(root, "REVW2N6") or None, what="the idle review")
        row = row_of(srv, "Lan", "REVW2N6")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        assert holders(root, "REVW2N6") == []
        assert [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]] == ["hello there", "hi!"]


def test_a_forgotten_turn_leaves_the_waiting_extraction_batch(tmp_path, fake_llm):
    from datetime import datetime, timezone

    from nekomem.runtime.clock import ManualClock
    from tests.support.fake_llm import prompt_text

    clock = ManualClock(datetime(2026, 4, 1, 9, tzinfo=timezone.utc))
    settings = make_settings(tmp_path / "memory", llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings, clock=clock) as srv:
        history = [turn("I planted tulips today"), turn("my alarm code is QUEUEX1"), turn("lovely", role="assistant")]
        assert srv.post("/cache/Lan", json={"input_history": history}).status_code == 200
        quiesce(srv.runtime, "Lan")  # the record waits in the fact actor's batch (idle rule, manual clock)
        assert not fake_llm.calls("extract_facts")
        row = row_of(srv, "Lan", "QUEUEX1")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        clock.advance(seconds=120)
        calls = wait_for(lambda: fake_llm.calls("extract_facts"), what="the batch extraction")
        prompts = "\n".join(prompt_text(c["body"]) for c in calls)
        assert "tulips" in prompts and "QUEUEX1" not in prompts


def test_an_answered_erasure_survives_sigkill(tmp_path):
    """The answer comes once the erasure is on disk: a server killed right after it
    restarts without the erased entry or turn, and no byte of them is back."""
    import httpx

    from tests.support.live import ServerProcess

    root = tmp_path / "memory"
    srv = ServerProcess(root)
    srv.start()
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            facts = [{"text": "Master's safe code is KILLF4C7", "importance": 8}, {"text": "Master likes plums", "importance": 5}]
            fid = client.post("/api/characters/Lan/facts", json={"facts": facts}).json()["added"][0]
            history = [turn("my pin is KILLT8N2"), turn("noted", role="assistant")]
            assert client.post("/cache/Lan", json={"input_history": history}).status_code == 200
            row = client.get("/api/browse/Lan/journal", params={"q": "KILLT8N2"}).json()["items"][0]["id"]
            assert client.delete(f"/api/characters/Lan/facts/{fid}").status_code == 200
            assert client.delete(f"/api/characters/Lan/turns/{row}").status_code == 200
        srv.kill()
        assert holders(root, "KILLF4C7") == [] and holders(root, "KILLT8N2") == []
        srv.start()
        with httpx.Client(base_url=srv.url, timeout=60) as client:
            assert [f["text"] for f in client.get("/api/characters/Lan/facts").json()["items"]] == ["Master likes plums"]
            assert [i["text"] for i in client.get("/api/characters/Lan/recent").json()["items"]] == ["noted"]
            assert "KILL" not in client.get("/new_dialog/Lan").text
        assert holders(root, "KILLF4C7") == [] and holders(root, "KILLT8N2") == []
    finally:
        srv.stop()
    log = srv.log_path.read_text(encoding="utf-8", errors="replace")
    assert "forgot 1 stored turns" in log and "KILL" not in log  # INFO logs carry no memory text


def test_delete_a_character_while_it_takes_writes(tmp_path):
    """Writes racing a deletion are answered (before it, or after it into a new, empty
    character, or 409 if they waited past their timeout), never 5xx; the deletion is."""
    import threading

    import httpx

    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        statuses: list[int] = []
        stop = threading.Event()

        def write() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as client:
                i = 0
                while not stop.is_set():
                    r = client.post("/cache/Mika", json={"input_history": [turn(f"racing DELR{i:05d}")]})
                    statuses.append(r.status_code)
                    i += 1

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        try:
            wait_for(lambda: len(statuses) >= 20, what="writes before the deletion")
            answer = srv.delete("/api/characters/Mika")
            assert answer.status_code == 200, answer.text
            after = len(statuses)
            wait_for(lambda: len(statuses) >= after + 20, what="writes after the deletion")
        finally:
            stop.set()
            writer.join(timeout=60)
        assert set(statuses) <= {200, 409}, sorted(set(statuses))
        # What is stored now is only what came after the deletion: a prefix of the writes is gone.
        texts = [i["text"] for i in srv.get("/api/browse/Mika/journal", params={"order": "asc", "limit": 1000}).json()["items"]]
        assert texts and "racing DELR00000" not in texts
        assert srv.get("/health").json()["supervision"]["failed_children"] == 0
