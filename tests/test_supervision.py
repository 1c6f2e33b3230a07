"""A crashing child is restarted from disk and reported; other characters never notice."""

from __future__ import annotations

import pytest

from nekomem.actors.recent_layer import RecentLayer
from tests.support import faults
from tests.support.live import LiveServer, make_settings


@pytest.fixture
def crash_once(monkeypatch):
    """Fault injection: the next GetRecent handled by any RecentActor's layer raises."""
    return faults.crash_once(monkeypatch, RecentLayer, "on_GetRecent")


def test_crashed_child_restarts_from_disk(tmp_path, crash_once):
    with LiveServer(make_settings(tmp_path, restart_budget=2)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "kept across the crash"}]})
        srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "other character"}]})
        crash_once["armed"] = True
        r = srv.get("/new_dialog/Lan")
        assert r.status_code == 500 and r.json()["error_code"] == "internal_error"
        # The next request reaches a fresh actor that reloaded its state from disk.
        assert "kept across the crash" in srv.get("/new_dialog/Lan").text
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "after"}]}).status_code == 200
        assert "other character" in srv.get("/new_dialog/Mio").text
        assert srv.get("/health").json()["supervision"]["child_restarts"] == 1


def test_restart_budget_exhausted_marks_the_layer_failed(tmp_path, crash_once):
    with LiveServer(make_settings(tmp_path, restart_budget=1)) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "x"}]})
        for _ in range(2):
            crash_once["armed"] = True
            srv.get("/get_recent_history/Lan")
        r = srv.get("/get_recent_history/Lan")
        assert r.status_code == 503 and r.json()["error_code"] == "character_failed"
        assert srv.get("/health").json()["supervision"]["failed_children"] == 1
        assert srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "fine"}]}).status_code == 200
