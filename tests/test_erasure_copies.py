"""Issue 38, item 4: erasure of every copy of a forgotten turn, edited ones included.

Before: a window item edited with ``PATCH .../recent/{i}`` and whose turn was then
forgotten stayed in recent.json, in the window base in time_indexed.db and in
/new_dialog (window items were matched by text only); a fact-extraction batch that was
with the model when its turns were forgotten, and failed, was kept in memory and sent to
the model again; an ``Idempotency-Key`` carrying the text stayed in the idempotency table.
Each test byte-searches the character folder (SQLite files and their -wal included)."""

from __future__ import annotations

import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import Reply, prompt_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for
from tests.test_erasure import holders, row_of, turn


def window_base(root: Path) -> bytes:
    db = sqlite3.connect(root / "Lan" / "time_indexed.db")
    try:
        row = db.execute("SELECT items FROM recent_base").fetchone()
    finally:
        db.close()
    return bytes(row[0]) if row else b""


def edit_secret(srv: LiveServer, root: Path) -> None:
    """Store three turns, then edit the secret one's window item (its row keeps the
    original text, the window the edited one)."""
    history = [
        turn("good morning", ts="2026-01-01T08:00:00+00:00"),
        turn("my safe code is EDITQ4Z8", ts="2026-01-01T08:01:00+00:00"),
        turn("noted", role="assistant", ts="2026-01-01T08:02:00+00:00"),
    ]
    assert srv.post("/cache/Lan", json={"input_history": history}).status_code == 200
    items = srv.get("/api/characters/Lan/recent").json()["items"]
    index = next(i["index"] for i in items if "EDITQ4Z8" in i["text"])
    r = srv.patch(f"/api/characters/Lan/recent/{index}", json={"text": "my safe code is EDITQ4Z8, or maybe EDITW7K1"})
    assert r.status_code == 200, r.text
    assert "EDITW7K1" in srv.get("/new_dialog/Lan").text
    assert b"EDITW7K1" in window_base(root) and "Lan/recent.json" in holders(root, "EDITW7K1")


@pytest.mark.parametrize("how", ["ids", "range", "all"])
def test_a_forgotten_turn_leaves_its_edited_window_item(tmp_path: Path, how: str) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        edit_secret(srv, root)
        if how == "ids":
            row = row_of(srv, "Lan", "EDITQ4Z8")
            r = srv.delete(f"/api/characters/Lan/turns/{row['id']}")
        elif how == "range":
            r = srv.delete("/api/characters/Lan/turns", params={"from": "2026-01-01T08:00:30Z", "to": "2026-01-01T08:01:30Z"})
        else:
            r = srv.delete("/api/characters/Lan/turns", params={"from": "2000-01-01T00:00:00Z", "to": "2100-01-01T00:00:00Z"})
        assert r.status_code == 200, r.text
        for needle in ("EDITQ4Z8", "EDITW7K1"):
            assert holders(root, needle) == [], needle
            assert needle not in srv.get("/new_dialog/Lan").text
        texts = [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]]
        assert texts == (["good morning", "noted"] if how != "all" else [])
    # And after a restart (the window is rebuilt from its base and the rows).
    with LiveServer(make_settings(root)) as srv:
        assert "EDITW7K1" not in srv.get("/new_dialog/Lan").text
        assert holders(root, "EDITW7K1") == []


def test_an_edited_item_edited_again_still_leaves_with_its_turn_after_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        edit_secret(srv, root)
    with LiveServer(make_settings(root)) as srv:
        items = srv.get("/api/characters/Lan/recent").json()["items"]
        index = next(i["index"] for i in items if "EDITW7K1" in i["text"])
        assert srv.patch(f"/api/characters/Lan/recent/{index}", json={"text": "the code was EDITJ3P5"}).status_code == 200
        row = row_of(srv, "Lan", "EDITQ4Z8")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        for needle in ("EDITQ4Z8", "EDITW7K1", "EDITJ3P5"):
            assert holders(root, needle) == [], needle
        assert [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]] == ["good morning", "noted"]


def test_a_batch_failed_while_its_turn_was_forgotten_never_reaches_the_model_again(tmp_path: Path, fake_llm) -> None:
    clock = ManualClock(datetime(2026, 4, 1, 9, tzinfo=timezone.utc))
    release = threading.Event()
    failing = threading.Event()
    failing.set()
    calls: list[str] = []

    def extract(req: dict) -> Reply | dict:
        calls.append(prompt_text(req))
        if failing.is_set():
            release.wait(30)  # the forget arrives while the model has the batch
            return Reply.status(500, "down")  # every attempt of that job fails
        return {"facts": []}

    fake_llm.on("extract_facts", extract)
    settings = make_settings(
        tmp_path / "memory",
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        embedding_enabled=False,
        llm_max_retries=1,
        llm_backoff_base_seconds=0,
    )
    with LiveServer(settings, clock=clock) as srv:
        history = [turn("I planted tulips today"), turn("my alarm code is INFLT5R9"), turn("lovely", role="assistant")]
        assert srv.post("/cache/Lan", json={"input_history": history}).status_code == 200
        quiesce(srv.runtime, "Lan")  # waiting in the fact actor's batch (idle rule, manual clock)
        clock.advance(seconds=120)
        wait_for(lambda: calls, what="the batch with the model")
        row = row_of(srv, "Lan", "INFLT5R9")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        release.set()  # the model fails now, after the forget answered
        quiesce(srv.runtime, "Lan")  # the job's own attempts are over: the batch failed
        first_job = len(calls)
        assert "INFLT5R9" in calls[0]
        failing.clear()
        # More than a minute later, past every backoff: the batch is retried.
        for _ in range(6):
            clock.advance(seconds=900)
            quiesce(srv.runtime, "Lan")
            if len(calls) > first_job:
                break
        assert len(calls) > first_job, "the failed batch was not retried"
        assert all("INFLT5R9" not in c for c in calls[first_job:]), "the forgotten text went to the model again"
        assert any("tulips" in c for c in calls[first_job:])
        assert holders(tmp_path / "memory", "INFLT5R9") == []


def test_an_idempotency_key_carrying_the_text_leaves_no_byte(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        key = "turn: my passport number is IDEMK8V2"
        body = {"input_history": [turn("my passport number is IDEMK8V2")]}
        first = srv.post("/cache/Lan", json=body, headers={"Idempotency-Key": key})
        assert first.status_code == 200
        # The key still works: a retry is answered from the table, not stored twice.
        again = srv.post("/cache/Lan", json=body, headers={"Idempotency-Key": key})
        assert again.json() == first.json()
        assert srv.get("/api/browse/Lan/journal", params={"q": "IDEMK8V2"}).json()["total"] == 1
        row = row_of(srv, "Lan", "IDEMK8V2")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        assert holders(root, "IDEMK8V2") == []


def test_plaintext_idempotency_keys_of_an_older_file_are_hashed_when_it_opens(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [turn("hello")]}).status_code == 200
    db = sqlite3.connect(root / "Lan" / "time_indexed.db")
    try:
        # A file written before keys were hashed: the key in the clear, no marker.
        db.execute("DELETE FROM cursors WHERE name = 'idempotency_hashed'")
        db.execute(
            "INSERT INTO idempotency (key, response, created_at) VALUES (?, ?, ?)", ("OLDKEYB4N6", b'{"status":"cached","count":1}', 1e12)
        )
        db.commit()
    finally:
        db.close()
    assert "Lan/time_indexed.db" in holders(root, "OLDKEYB4N6")
    with LiveServer(make_settings(root)) as srv:
        r = srv.post("/cache/Lan", json={"input_history": [turn("hello")]}, headers={"Idempotency-Key": "OLDKEYB4N6"})
        assert r.json() == {"status": "cached", "count": 1}  # answered from the table
        assert holders(root, "OLDKEYB4N6") == []


def test_a_forgotten_turn_leaves_the_item_a_review_rewrote(tmp_path: Path, fake_llm) -> None:
    """The correction tier rewrites window items (the journal keeps what was said): a
    rewritten item leaves with the row of the slot it took."""
    turns = []
    for i in range(5):
        turns.append(turn(f"question {i}"))
        turns.append(turn(f"answr {i} REVQ{i}X8 with a typo", role="assistant"))

    def corrected(request: dict) -> dict:
        dialogue = []
        for i in range(5):
            dialogue.append({"role": "user", "content": f"question {i}"})
            dialogue.append({"role": "assistant", "content": f"answer {i} REVF{i}Y3, fixed"})
        return {"explanation": "fixed typos", "corrected_dialogue": dialogue}

    fake_llm.on("review_recent", corrected)
    root = tmp_path / "memory"
    with LiveServer(make_settings(root, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False)) as srv:
        assert srv.post("/process/Lan", json={"input_history": turns}).status_code == 200
        wait_for(lambda: "Lan/recent.json" in holders(root, "REVF3Y3") or None, what="the review")
        quiesce(srv.runtime, "Lan")
        row = row_of(srv, "Lan", "REVQ3X8")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        assert holders(root, "REVQ3X8") == [] and holders(root, "REVF3Y3") == []
        assert "REVF3Y3" not in srv.get("/new_dialog/Lan").text
        texts = [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]]
        assert "answer 2 REVF2Y3, fixed" in texts and "answer 4 REVF4Y3, fixed" in texts


def test_a_forgotten_turn_leaves_the_item_the_hard_cap_cut(tmp_path: Path) -> None:
    """A message longer than the hard cap is kept head and tail in the window: that cut
    item leaves with its row."""
    root = tmp_path / "memory"
    long_text = "CAPHD7Q2 " + " ".join(f"word{i}" for i in range(400)) + " CAPTL4M6"
    with LiveServer(make_settings(root, recent_hard_cap_tokens=100)) as srv:
        assert srv.post("/cache/Lan", json={"input_history": [turn("short hello"), turn(long_text)]}).status_code == 200
        shown = [i["text"] for i in srv.get("/api/characters/Lan/recent").json()["items"]]
        assert any("CAPHD7Q2" in t and t != long_text for t in shown), shown  # cut, not whole
        row = row_of(srv, "Lan", "CAPTL4M6")
        assert srv.delete(f"/api/characters/Lan/turns/{row['id']}").status_code == 200
        assert holders(root, "CAPHD7Q2") == [] and holders(root, "CAPTL4M6") == []
        assert "CAPHD7Q2" not in srv.get("/new_dialog/Lan").text
