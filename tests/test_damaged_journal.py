"""A damaged time_indexed.db (zero-length, truncated, garbage) is found when the character
loads: the file is kept aside, what can be read of it is served from a new journal, and the
character is reported damaged in /health and in the memory browser's listing; it keeps
answering (no actor timeout, no crash loop)."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3

import httpx
import pytest

from nekomem.actors.messages import AppendTurns
from nekomem.domain.layers import event_owners
from nekomem.domain.turns import Turn
from nekomem.layers.recent.layer import RecentLayer
from nekomem.runtime.reply import Reply
from nekomem.stores import timeindex_check
from nekomem.stores.applied import SharedJournal
from nekomem.stores.layout import CharacterPaths
from tests.support.fake_ports import FakePorts
from tests.support.live import LiveServer, ServerProcess, make_settings

TURNS = 300


def _checkpointed(db_path):
    """Fold the WAL into the journal file and remove the WAL and its index."""
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for side in ("-wal", "-shm"):
        if os.path.exists(f"{db_path}{side}"):
            os.unlink(f"{db_path}{side}")


def _fill(tmp_path):
    settings = make_settings(tmp_path)
    with LiveServer(settings) as srv:
        for i in range(0, TURNS, 30):
            batch = [{"role": "user", "content": f"turn {j} " + "x" * 200} for j in range(i, i + 30)]
            assert srv.post("/cache/Lan", json={"input_history": batch}).status_code == 200
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    db_path = tmp_path / "Lan" / "time_indexed.db"
    _checkpointed(db_path)
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


class _FullChecks:
    """Counts SQLite's full check of a journal (``timeindex_check.quick_check``) while
    still running it."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = timeindex_check.quick_check

        def counted(db):
            self.count += 1
            return real(db)

        monkeypatch.setattr(timeindex_check, "quick_check", counted)


@pytest.mark.parametrize("how", ["zero_length", "truncated", "garbage"])
def test_a_journal_noted_as_checked_and_damaged_in_place_is_found_without_the_full_check(tmp_path, monkeypatch, how):
    """The server that made the journal noted it as checked on this boot (``journal_checked``
    in recent_meta.json), so the next activation leaves SQLite's full check out: SQLite's
    first read and the row check find these damages."""
    settings, db_path = _fill(tmp_path)
    meta = json.loads((tmp_path / "Lan" / "recent_meta.json").read_text(encoding="utf-8"))
    assert meta["journal_checked"], "the server that created the journal noted it"
    inode = db_path.stat().st_ino
    _damage(db_path, how)
    assert db_path.stat().st_ino == inode, "damaged in place: the same file"
    checks = _FullChecks(monkeypatch)
    with LiveServer(settings) as srv:
        view = srv.get("/api/characters/Lan/recent").json()
        assert srv.get("/health").json()["storage"]["state"] == "journal_damaged"
        assert view["stored_total"] < TURNS
    assert checks.count == 0


def test_a_journal_is_read_whole_once_per_file_and_boot_not_at_every_activation(tmp_path, monkeypatch):
    settings, db_path = _fill(tmp_path)
    checks = _FullChecks(monkeypatch)
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/recent").status_code == 200
        assert checks.count == 0, "the server that created the journal noted it as checked"
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == TURNS
        assert checks.count == 0, "a second activation of the same file on the same boot"
    # Without the note (a journal checked on another machine, or by an older server), the
    # full check runs once, and the note is stored.
    meta_path = tmp_path / "Lan" / "recent_meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["journal_checked"] = None
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == TURNS
        assert checks.count == 1
    assert json.loads(meta_path.read_text(encoding="utf-8"))["journal_checked"]
    # A file put in place of the journal (a restore, a copy) is read whole again.
    copy = db_path.with_name("copy.db")
    shutil.copyfile(db_path, copy)
    os.replace(copy, db_path)
    with LiveServer(settings) as srv:
        assert srv.get("/api/characters/Lan/recent").json()["stored_total"] == TURNS
        assert checks.count == 2
        assert srv.get("/health").json()["storage"]["state"] == "ok"


def test_after_a_kill_9_the_journal_is_not_read_whole_and_every_acknowledged_turn_is_served(tmp_path, monkeypatch):
    server = ServerProcess(tmp_path)
    server.start(timeout=120)
    acked = []
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(40):
                text = f"before the kill {i}"
                if client.post("/cache/Lan", json={"input_history": [{"role": "user", "content": text}]}).status_code == 200:
                    acked.append(text)
    finally:
        server.kill()
    assert len(acked) == 40
    wal = tmp_path / "Lan" / "time_indexed.db-wal"
    assert wal.exists() and wal.stat().st_size > 32, "the kill left the rows in the WAL"
    checks = _FullChecks(monkeypatch)
    with LiveServer(make_settings(tmp_path)) as srv:  # start-up recovery activates Lan
        view = srv.get("/api/characters/Lan/recent").json()
        assert [i["text"] for i in view["items"]][-40:] == acked
        assert srv.get("/health").json()["storage"]["state"] == "ok"
    assert checks.count == 0, "the killed server had checked this file on this boot"


def test_a_reload_of_the_layer_after_a_crash_checks_the_journal_in_full(tmp_path, monkeypatch):
    """A page damaged in place while the file is in use shows as an SQLite error: the layer
    crashes and its restart (a second load of the same activation) must read the file whole,
    whatever the note says."""
    settings = make_settings(tmp_path)
    paths = CharacterPaths(tmp_path, "Lan")
    paths.ensure()
    journal = SharedJournal(paths.events, paths.events_applied, event_owners())
    ports = FakePorts(settings, tmp_path, "recent", character="Lan", journal=journal)
    layer = RecentLayer(ports)
    layer.load()  # makes the journal, notes it
    reply = Reply()
    turn = Turn(role="human", text="hello", ts="2026-06-01T10:00:00+00:00")
    layer.on_AppendTurns(AppendTurns(turns=[turn], mode="cache", session_id="s1", reply=reply))
    reply.result(5)
    layer.close()
    checks = _FullChecks(monkeypatch)
    again = RecentLayer(FakePorts(settings, tmp_path, "recent", character="Lan", journal=journal))
    again.load()  # a new activation: the note holds
    again.close()
    assert checks.count == 0
    restarted = RecentLayer(ports)  # the same activation's ports: a restart
    restarted.load()
    restarted.close()
    assert checks.count == 1
