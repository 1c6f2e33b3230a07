"""The group write of /cache post-turn records over real HTTP: work that finishes before
the write leaves no outbox line, the post-turn cursor still passes it, and a restart
runs none of it again; without an extraction model no record is made at all."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nekomem.actors.messages import OutboxState
from nekomem.config import Settings
from nekomem.domain.post_turn import POST_TURN_CURSOR
from tests.support.fake_llm import FakeLLM
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

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


def quick_model_settings(tmp_path: Path, llm: FakeLLM, sync_seconds: float) -> Settings:
    """One extraction per record (powerful memory off), answered at once by the fake model."""
    llm.on("extract_facts", lambda request: {"facts": []})
    return make_settings(
        tmp_path,
        llm_base_url=llm.base_url,
        llm_model="fake",
        powerful_memory_default=False,
        embedding_enabled=False,
        outbox_sync_seconds=sync_seconds,
    )


def test_post_turn_work_finished_before_the_group_write_writes_no_line(tmp_path: Path, fake_llm: FakeLLM) -> None:
    # Each record's extraction is answered at once, long before the group write is due.
    settings = quick_model_settings(tmp_path, fake_llm, 3600.0)
    with LiveServer(settings) as srv:
        for n in range(5):
            r = srv.post(
                f"/cache/{NAME}",
                json={"input_history": [{"role": "user", "content": f"turn {n}"}, {"role": "assistant", "content": "ok"}]},
            )
            assert r.status_code == 200, r.text
        # Wait for the work itself (a flush barrier before it ends would write the lines).
        wait_for(lambda: outbox_state(srv)["done"] == 5, what="the five extractions")
        quiesce(srv.runtime, NAME)
        state = outbox_state(srv)
        assert (state["pending"], state["done"]) == (0, 5)
        assert len(fake_llm.calls("extract_facts")) == 5
        outbox = tmp_path / NAME / "outbox.ndjson"
        assert not outbox.exists() or outbox.read_text() == ""
    # The cursor passed every record although none was written, so the restart re-runs none.
    cursor, top = saved_cursor(tmp_path)
    assert (cursor, top) == (10, 10)
    with LiveServer(settings) as srv:
        state = outbox_state(srv)
        assert (state["pending"], state["running"], state["done"]) == (0, 0, 0)
    assert not outbox.exists() or outbox.read_text() == ""
    assert len(fake_llm.calls("extract_facts")) == 5  # nothing ran twice


def test_without_a_group_write_every_record_is_written(tmp_path: Path, fake_llm: FakeLLM) -> None:
    """outbox_sync_seconds = 0: each record is written (and fsync'd) on its own."""
    settings = quick_model_settings(tmp_path, fake_llm, 0.0)
    with LiveServer(settings) as srv:
        for n in range(3):
            r = srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": f"turn {n}"}]})
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)
        assert outbox_state(srv)["done"] == 3
    lines = (tmp_path / NAME / "outbox.ndjson").read_text().splitlines()
    assert sum('"pending"' in line for line in lines) == 3


def test_without_an_extraction_model_no_record_is_made(tmp_path: Path) -> None:
    """No model can extract facts: a record would only be finished unrun, so none is made;
    the cursor passes the rows anyway and /process (which waits for the record) answers."""
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        for n in range(3):
            r = srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": f"turn {n}"}]})
            assert r.status_code == 200, r.text
        r = srv.post(f"/process/{NAME}", json={"input_history": [{"role": "user", "content": "processed"}]})
        assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)
        state = outbox_state(srv)
        assert (state["pending"], state["done"]) == (0, 0)
    assert not (tmp_path / NAME / "outbox.ndjson").exists()
    assert saved_cursor(tmp_path) == (4, 4)
