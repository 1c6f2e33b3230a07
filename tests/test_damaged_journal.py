"""A damaged time_indexed.db (zero-length, truncated, garbage) is found when the character
loads: the file is kept aside, what can be read of it is served from a new journal, and the
character is reported damaged in /health and in the memory browser's listing; it keeps
answering (no actor timeout, no crash loop)."""

from __future__ import annotations

import json
import os
import random
import sqlite3

import pytest

from tests.support.live import LiveServer, make_settings

TURNS = 300


def _fill(tmp_path):
    settings = make_settings(tmp_path)
    with LiveServer(settings) as srv:
        for i in range(0, TURNS, 30):
            batch = [{"role": "user", "content": f"turn {j} " + "x" * 200} for j in range(i, i + 30)]
            assert srv.post("/cache/Lan", json={"input_history": batch}).status_code == 200
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    db_path = tmp_path / "Lan" / "time_indexed.db"
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for side in ("-wal", "-shm"):
        if os.path.exists(f"{db_path}{side}"):
            os.unlink(f"{db_path}{side}")
    return settings, db_path


def _damage(db_path, how):
    original = db_path.read_bytes()
    if how == "zero_length":
        db_path.write_bytes(b"")
    elif how == "truncated":
        db_path.write_bytes(original[: len(original) // 2])
    else:
        db_path.write_bytes(random.Random(3).randbytes(len(original)))
    return db_path.read_bytes()


@pytest.mark.parametrize("how", ["zero_length", "truncated", "garbage"])
def test_a_damaged_journal_is_kept_aside_reported_and_served(tmp_path, how):
    settings, db_path = _fill(tmp_path)
    damaged_bytes = _damage(db_path, how)
    window_before = json.loads((tmp_path / "Lan" / "recent.json").read_text(encoding="utf-8"))
    assert len(window_before) == TURNS
    with LiveServer(settings) as srv:
        listing = srv.get("/api/browse/characters").json()["characters"]
        assert [c["name"] for c in listing] == ["Lan"], "the character stays in the browser"
        r = srv.get("/api/characters/Lan/recent")  # loads the character
        assert r.status_code == 200, r.text
        view = r.json()
        # The defined state: the window as recent.json held it, the journal's readable rows.
        assert [i["text"] for i in view["items"]] == [m["data"]["content"] for m in window_before]
        salvaged = view["stored_total"]
        if how == "truncated":
            assert 0 < salvaged < TURNS
        else:
            assert salvaged == 0
        health = srv.get("/health").json()
        assert health["supervision"]["child_restarts"] == 0 and health["supervision"]["failed_children"] == 0, "no crash loop"
        storage = health["storage"]
        assert storage["state"] == "journal_damaged"
        [damaged] = storage["damaged_journals"]
        assert damaged["character"] == "Lan" and "kept aside as time_indexed.db.damaged-" in damaged["detail"]
        [row] = srv.get("/api/browse/characters").json()["characters"]
        assert row["damaged"] is True and any("damaged" in t for t in row["trouble"])
        assert row["turns"] == salvaged
        # Still serving, writes land in the new journal.
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "after"}]}).status_code == 200
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == salvaged + 1
    [copy] = [
        p for p in (tmp_path / "Lan").iterdir() if p.name.startswith("time_indexed.db.damaged-") and not p.name.endswith(("-wal", "-shm"))
    ]
    assert copy.read_bytes() == damaged_bytes, "the damaged file is kept as it was"
    # A restart keeps serving the new journal and still shows the damage in the listing.
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == salvaged + 1
        assert srv.get("/api/browse/characters").json()["characters"][0]["damaged"] is True


def test_a_sound_journal_is_not_reported(tmp_path):
    settings, _ = _fill(tmp_path)
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == TURNS
        storage = srv.get("/health").json()["storage"]
        assert storage["state"] == "ok" and storage["damaged_journals"] == []
        assert srv.get("/api/browse/characters").json()["characters"][0]["damaged"] is False


def test_a_damaged_journal_and_a_lost_window_serve_the_salvaged_rows(tmp_path):
    settings, db_path = _fill(tmp_path)
    _damage(db_path, "truncated")
    (tmp_path / "Lan" / "recent.json").unlink()
    with LiveServer(settings) as srv:
        view = srv.get("/api/characters/Lan/recent").json()
        assert 0 < view["stored_total"] < TURNS
        texts = [i["text"] for i in view["items"]]
        assert texts and texts == [f"turn {j} " + "x" * 200 for j in range(len(texts))], "the salvaged rows, oldest first"
        assert srv.get("/health").json()["storage"]["damaged_journals"]
