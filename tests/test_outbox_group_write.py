"""The group write of /cache post-turn records over real HTTP: work that finishes before
the write leaves no outbox line, the post-turn cursor still passes it, and a restart
runs none of it again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nekomem.actors.messages import OutboxState
from nekomem.domain.post_turn import POST_TURN_CURSOR
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce

NAME = "Lan"


def outbox_state(srv: LiveServer) -> dict:
    return srv.runtime.registry.ask_sync(NAME, "outbox", lambda reply: OutboxState(reply=reply))


def saved_cursor(root: Path) -> tuple[int, int]:
    """(the stored post-turn cursor, the last stored row)."""
    db = sqlite3.connect(root / NAME / "time_indexed.db")
    try:
        cursor = db.execute("SELECT row_id FROM cursors WHERE name = ?", (POST_TURN_CURSOR,)).fetchone()
        top = db.execute("SELECT MAX(id) FROM time_indexed_original").fetchone()
        return (cursor[0] if cursor else 0), top[0]
    finally:
        db.close()


def test_post_turn_work_finished_before_the_group_write_writes_no_line(tmp_path: Path) -> None:
    # No model: each record's handler finishes at once, long before the group write is due.
    settings = make_settings(tmp_path, outbox_sync_seconds=3600.0)
    with LiveServer(settings) as srv:
        for n in range(5):
            r = srv.post(
                f"/cache/{NAME}",
                json={"input_history": [{"role": "user", "content": f"turn {n}"}, {"role": "assistant", "content": "ok"}]},
            )
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)
        state = outbox_state(srv)
        assert (state["pending"], state["done"]) == (0, 5)
        outbox = tmp_path / NAME / "outbox.ndjson"
        assert not outbox.exists() or outbox.read_text() == ""
    # The cursor passed every record although none was written, so the restart re-runs none.
    cursor, top = saved_cursor(tmp_path)
    assert (cursor, top) == (10, 10)
    with LiveServer(settings) as srv:
        state = outbox_state(srv)
        assert (state["pending"], state["running"], state["done"]) == (0, 0, 0)
    assert not outbox.exists() or outbox.read_text() == ""


def test_without_a_group_write_every_record_is_written(tmp_path: Path) -> None:
    """outbox_sync_seconds = 0: each record is written (and fsync'd) on its own."""
    settings = make_settings(tmp_path, outbox_sync_seconds=0.0)
    with LiveServer(settings) as srv:
        for n in range(3):
            r = srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": f"turn {n}"}]})
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)
        assert outbox_state(srv)["done"] == 3
    lines = (tmp_path / NAME / "outbox.ndjson").read_text().splitlines()
    assert sum('"pending"' in line for line in lines) == 3
