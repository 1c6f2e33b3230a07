"""An export holds the character, so it is a request a page cannot send cross-site without a
preflight (POST with a JSON body); a GET holds nothing (405). A second hold, and the
writes made during exports, wait for the one running instead of answering 409."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.support.live import LiveServer, make_settings

TURN = {"input_history": [{"role": "user", "content": "a turn"}]}


def test_a_get_of_the_export_holds_nothing(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post("/cache/Lan", json=TURN).status_code == 200
        before = srv.runtime.registry.activations
        # What an <img src=".../export"> tag sends: a GET without Origin.
        r = srv.get("/api/characters/Lan/export")
        assert r.status_code == 405
        assert "Lan" in srv.runtime.registry.active_names() and srv.runtime.registry.activations == before, "the GET held it"
        # No body, a form body, another site's page: refused before any hold.
        assert srv.post("/api/characters/Lan/export").json()["error_code"] == "empty_body"
        form = srv.post("/api/characters/Lan/export", content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415
        foreign = srv.post("/api/characters/Lan/export", json={}, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        assert srv.post("/api/characters/Lan/export", json={"unknown": 1}).status_code == 422
        assert srv.runtime.registry.activations == before and "Lan" in srv.runtime.registry.active_names()
        document = srv.post("/api/characters/Lan/export", json={})
        assert document.status_code == 200 and document.json()["name"] == "Lan"
        assert srv.post("/api/characters/Nobody/export", json={}).status_code == 404


def test_writes_and_a_second_export_wait_for_the_running_one(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post("/cache/Lan", json=TURN).status_code == 200
        exports: list[int] = []
        writes: list[int] = []
        stop = threading.Event()

        def export_loop() -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as client:
                while not stop.is_set():
                    exports.append(client.post("/api/characters/Lan/export", json={}).status_code)

        loops = [threading.Thread(target=export_loop) for _ in range(2)]
        for loop in loops:
            loop.start()
        try:
            with httpx.Client(base_url=srv.url, timeout=60) as client:
                for i in range(60):
                    body = {"input_history": [{"role": "user", "content": f"write {i}"}]}
                    writes.append(client.post("/cache/Lan", json=body).status_code)
        finally:
            stop.set()
            for loop in loops:
                loop.join(60)
        assert writes == [200] * 60, f"writes refused during exports: {[w for w in writes if w != 200]}"
        assert len(exports) >= 2 and set(exports) == {200}, exports
        stored = srv.get("/api/characters/Lan/recent").json()["stored_total"]
        assert stored == 61
