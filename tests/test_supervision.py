"""A handler error answers its request and leaves the layer serving; a layer whose files
cannot be read is restarted from disk, then marked failed; other characters never notice."""

from __future__ import annotations

from pathlib import Path

import pytest

from nekomem.layers.recent.layer import RecentLayer
from tests.support import faults
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for


@pytest.fixture
def crash_once(monkeypatch):
    """Fault injection: the next GetRecent handled by any RecentActor's layer raises."""
    return faults.crash_once(monkeypatch, RecentLayer, "on_GetRecent")


def test_a_handler_error_answers_500_and_the_layer_reloads_from_disk(tmp_path, crash_once):
    with LiveServer(make_settings(tmp_path, restart_budget=2)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "kept across the error"}]})
        srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "other character"}]})
        crash_once["armed"] = True
        r = srv.get("/new_dialog/Lan")
        assert r.status_code == 500 and r.json()["error_code"] == "internal_error"
        assert "kept across" not in r.text  # the error names no memory text
        # The next request reaches the same actor with its layer loaded again from disk.
        assert "kept across the error" in srv.get("/new_dialog/Lan").text
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "after"}]}).status_code == 200
        assert "other character" in srv.get("/new_dialog/Mio").text
        supervision = srv.get("/health").json()["supervision"]
        assert supervision["child_restarts"] == 0 and supervision["failed_children"] == 0
        assert supervision["handler_errors"] == 1


def test_handler_errors_never_mark_a_layer_failed(tmp_path, crash_once):
    """Before: each error crashed the actor, and a few of them in a minute spent the restart
    budget and answered 503 character_failed to every later request until a restart."""
    with LiveServer(make_settings(tmp_path, restart_budget=1)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]})
        for _ in range(4):
            crash_once["armed"] = True
            assert srv.get("/get_recent_history/Lan").status_code == 500
        r = srv.get("/get_recent_history/Lan")
        assert r.status_code == 200, r.text
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "fine"}]}).status_code == 200
        supervision = srv.get("/health").json()["supervision"]
        assert supervision["failed_children"] == 0 and supervision["child_restarts"] == 0
        assert supervision["handler_errors"] == 4


def test_a_layer_whose_files_cannot_load_after_an_error_is_marked_failed(tmp_path: Path, crash_once):
    """The storage is what fails here: the renewal cannot read recent.json, so the actor
    crashes, is restarted within the budget, and is marked failed once it is spent."""
    root = tmp_path / "memory"
    with LiveServer(make_settings(root, restart_budget=1)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]})
        recent = root / "Lan" / "recent.json"
        recent.unlink()
        recent.mkdir()  # a folder in place of recent.json
        crash_once["armed"] = True
        assert srv.get("/get_recent_history/Lan").status_code == 500
        wait_for(lambda: srv.get("/health").json()["supervision"]["failed_children"] == 1, what="the layer marked failed")
        r = srv.get("/get_recent_history/Lan")
        assert r.status_code == 503 and r.json()["error_code"] == "character_failed"
        assert srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "fine"}]}).status_code == 200
