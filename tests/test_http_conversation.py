"""The conversation write path over real HTTP (uvicorn on an ephemeral port)."""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime, timedelta, timezone

import pytest

from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import Reply
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for


def stored_rows(root, name):
    db = sqlite3.connect(root / name / "time_indexed.db")
    try:
        return [json.loads(m) for (m,) in db.execute("SELECT message FROM time_indexed_original ORDER BY id")]
    finally:
        db.close()


def recent_items(root, name):
    return json.loads((root / name / "recent.json").read_text(encoding="utf-8"))


def openai_turn(role, text):
    return {"role": role, "content": [{"type": "text", "text": text}]}


def test_cache_both_encodings_stored_once_in_order(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        first = [openai_turn("user", "hello there"), openai_turn("assistant", "hi, master")]
        r = srv.post("/cache/Lan", json={"input_history": json.dumps(first)})  # double-encoded
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "cached", "count": 2}
        second = [
            {"type": "human", "data": {"content": "I like green tea"}},
            {"type": "ai", "data": {"content": "noted!"}},
        ]
        r = srv.post("/cache/Lan", json={"input_history": second})  # plain array, on-disk style
        assert r.json() == {"status": "cached", "count": 2}
        texts = ["hello there", "hi, master", "I like green tea", "noted!"]
        assert [m["data"]["content"] for m in stored_rows(tmp_path, "Lan")] == texts
        assert [m["data"]["content"] for m in recent_items(tmp_path, "Lan")] == texts
        assert [m["type"] for m in recent_items(tmp_path, "Lan")] == ["human", "ai", "human", "ai"]
        dialog = srv.get("/new_dialog/Lan")
        assert dialog.status_code == 200
        assert dialog.headers["content-type"].startswith("text/plain")
        body = dialog.text
        for text in texts:
            assert body.count(text) == 1
        assert body.index("hello there") < body.index("I like green tea") < body.index("noted!")
        history = srv.get("/get_recent_history/Lan").text
        assert "Master | I like green tea" in history


def test_idempotency_key_answers_from_first_result(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        body = {"input_history": [openai_turn("user", "only once please")]}
        a = srv.post("/cache/Lan", json=body, headers={"Idempotency-Key": "turn-1"})
        b = srv.post("/cache/Lan", json=body, headers={"Idempotency-Key": "turn-1"})
        assert a.json() == b.json() == {"status": "cached", "count": 1}
        assert len(stored_rows(tmp_path, "Lan")) == 1
        assert len(recent_items(tmp_path, "Lan")) == 1


def test_settle_that_repeats_the_stored_tail_stores_nothing_twice(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        history = [openai_turn("user", "a"), openai_turn("assistant", "b"), openai_turn("user", "c")]
        srv.post("/cache/Lan", json={"input_history": history[:2]})
        srv.post("/cache/Lan", json={"input_history": history[2:]})
        r = srv.post("/settle/Lan", json={"input_history": history})
        assert r.json() == {"status": "settled"}
        assert [m["data"]["content"] for m in stored_rows(tmp_path, "Lan")] == ["a", "b", "c"]
        # New messages after the repeated tail are stored once.
        r = srv.post("/settle/Lan", json={"input_history": history + [openai_turn("assistant", "d")]})
        assert [m["data"]["content"] for m in stored_rows(tmp_path, "Lan")] == ["a", "b", "c", "d"]
        assert [m["data"]["content"] for m in recent_items(tmp_path, "Lan")] == ["a", "b", "c", "d"]


def test_25_turns_compress_into_memo_plus_nine(tmp_path, fake_llm):
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings) as srv:
        turns = [openai_turn("user" if i % 2 == 0 else "assistant", f"turn number {i}") for i in range(25)]
        r = srv.post("/process/Lan", json={"input_history": turns})
        assert r.json() == {"status": "processed"}
        # Answered once the turns are durable; the compression follows in the background.
        items = wait_for(lambda: (lambda got: got if len(got) == 10 else None)(recent_items(tmp_path, "Lan")), what="the compression")
        assert items[0]["type"] == "system"
        assert items[0]["data"]["content"].startswith("Memo from prior conversations: ")
        assert [m["data"]["content"] for m in items[1:]] == [f"turn number {i}" for i in range(16, 25)]
        calls = fake_llm.calls("summarize_recent")
        assert calls, "the summary tier was not called"
        assert calls[0]["headers"]["x-nekomem-task"] == "summarize_recent"
        assert len(stored_rows(tmp_path, "Lan")) == 25
        dialog = srv.get("/new_dialog/Lan").text
        assert "Memo from prior conversations" in dialog
        assert "turn number 24" in dialog and "turn number 3\n" not in dialog


def test_hard_cap_holds_while_summariser_fails(tmp_path, fake_llm):
    fake_llm.on("summarize_recent", Reply.status(500))
    cap = 300
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", recent_hard_cap_tokens=cap, llm_max_retries=0)
    with LiveServer(settings) as srv:
        from nekomem.domain.tokens import get_counter

        counter = get_counter("o200k_base")
        sent = []
        trimmed = False
        for i in range(60):
            # Mostly short turns (so the window passes the compression threshold) with a
            # long one every 15 turns (so the cap has to act).
            text = f"message {i}" + (" lorem ipsum dolor sit amet" * 20 if i % 15 == 14 else "")
            sent.append(text)
            mode = "process" if i % 5 == 4 else "cache"
            r = srv.post(f"/{mode}/Lan", json={"input_history": [openai_turn("user", text)]})
            assert r.status_code == 200, r.text
            window = recent_items(tmp_path, "Lan")
            assert sum(counter.count(m["data"]["content"]) for m in window) <= cap
            trimmed = trimmed or window[0]["data"]["content"] != sent[0]
        assert trimmed, "the cap never had to act; the test is not testing it"
        assert [m["data"]["content"] for m in stored_rows(tmp_path, "Lan")] == sent
        window = recent_items(tmp_path, "Lan")
        assert window[-1]["data"]["content"] == sent[-1]
        assert fake_llm.calls("summarize_recent"), "the failing summariser was never tried"


def test_gap_hints_on_a_manual_clock(tmp_path):
    clock = ManualClock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    with LiveServer(make_settings(tmp_path, display_timezone="UTC"), clock=clock) as srv:
        assert srv.get("/last_conversation_gap/Lan").json() == {"gap_seconds": -1}
        srv.post("/cache/Lan", json={"input_history": [openai_turn("user", "see you")]})
        clock.advance(minutes=10)
        assert srv.get("/last_conversation_gap/Lan").json()["gap_seconds"] == pytest.approx(600)
        assert "since the last conversation" not in srv.get("/new_dialog/Lan").text
        clock.advance(minutes=25)
        text = srv.get("/new_dialog/Lan").text
        assert "It has been 35 minutes since the last conversation" in text
        assert "quite a while" not in text
        clock.advance(hours=5)
        text = srv.get("/new_dialog/Lan").text
        assert "5 hours and 35 minutes" in text and "quite a while" in text
        assert "2026-05-01 17:35" in text


def test_message_timestamps_are_kept(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        past = (datetime.now(timezone.utc) - timedelta(days=3)).replace(microsecond=0)
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "old", "timestamp": past.isoformat()}]})
        gap = srv.get("/last_conversation_gap/Lan").json()["gap_seconds"]
        assert 3 * 86400 - 5 < gap < 3 * 86400 + 60


def test_review_patches_the_window_through_the_correction_tier(tmp_path, fake_llm):
    turns = []
    for i in range(5):
        turns.append(openai_turn("user", f"question {i}"))
        turns.append(openai_turn("assistant", f"answr {i} with a typo"))

    def corrected(request):
        return {
            "explanation": "fixed typos",
            "corrected_dialogue": [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"question {i // 2}" if i % 2 == 0 else f"answer {i // 2}, fixed",
                }
                for i in range(10)
            ],
        }

    fake_llm.on("review_recent", corrected)
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings) as srv:
        assert srv.post("/process/Lan", json={"input_history": turns}).status_code == 200
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            texts = [m["data"]["content"] for m in recent_items(tmp_path, "Lan")]
            if "answer 4, fixed" in texts:
                break
            time.sleep(0.05)
        assert texts[-1] == "answer 4, fixed", texts
        assert fake_llm.calls("review_recent")[0]["headers"]["x-nekomem-task"] == "review_recent"
        # The raw journal keeps what was really said.
        assert "answr 4 with a typo" in [m["data"]["content"] for m in stored_rows(tmp_path, "Lan")]


def test_review_switch_off_means_no_review(tmp_path, fake_llm):
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", review_enabled=False)
    with LiveServer(settings) as srv:
        turns = [openai_turn("user" if i % 2 == 0 else "assistant", f"t{i}") for i in range(10)]
        srv.post("/process/Lan", json={"input_history": turns})
        quiesce(srv.runtime, "Lan")
        assert fake_llm.calls("review_recent") == []


def test_a_corrupt_recent_json_is_rebuilt_from_the_journal(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.post("/cache/Lan", json={"input_history": [openai_turn("user", "first"), openai_turn("assistant", "second")]})
    (tmp_path / "Lan" / "recent.json").write_text("{not json", encoding="utf-8")
    with LiveServer(make_settings(tmp_path)) as srv:
        text = srv.get("/new_dialog/Lan").text
        assert "first" in text and "second" in text
    assert [m["data"]["content"] for m in recent_items(tmp_path, "Lan")] == ["first", "second"]
    assert list((tmp_path / "Lan").glob("recent.json.corrupt-*")), "the unreadable file is kept aside"


def test_recent_json_follows_appends_edits_and_deletions(tmp_path):
    """recent.json is rewritten from per-item encodings kept between writes: after appends,
    an edit, a deletion and more appends its bytes are those of the window encoded whole,
    and no older window stays behind in the folder after the deletion."""
    import msgspec

    with LiveServer(make_settings(tmp_path)) as srv:
        expected = []

        def post(text):
            assert srv.post("/cache/Lan", json={"input_history": [openai_turn("user", text)]}).status_code == 200
            expected.append(text)

        def check():
            raw = (tmp_path / "Lan" / "recent.json").read_bytes()
            items = json.loads(raw)
            assert [m["data"]["content"] for m in items] == expected
            assert raw == msgspec.json.encode(items) + b"\n"  # compact, as a whole encode writes it

        for i in range(4):
            post(f"turn {i}")
            check()
        assert srv.patch("/api/characters/Lan/recent/1", json={"text": "turn 1, edited"}).status_code == 200
        expected[1] = "turn 1, edited"
        check()
        assert srv.delete("/api/characters/Lan/recent/2").status_code == 200
        del expected[2]
        check()
        leftovers = [p.read_bytes() for p in (tmp_path / "Lan").iterdir() if p.name.startswith(".")]
        assert not any(b"turn 2" in data for data in leftovers), "the deleted item lingers in a hidden file"
        for i in range(4, 7):
            post(f"turn {i}")
            check()
