"""A hanging model never holds a session-boundary write: /process, /renew and /settle answer
once the turns are durable, and a retried batch (no Idempotency-Key) is stored once."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from tests.support.live import LiveServer, make_settings

# Well below the server's settle timeout (120 s): a write that waits for the hanging model
# runs into this client timeout and the test fails with httpx.ReadTimeout.
CLIENT_TIMEOUT = 5.0


def batch(tag: str, n: int) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} message {i}"} for i in range(n)]


def stored_texts(root, name: str) -> list[str]:
    with sqlite3.connect(root / name / "time_indexed.db") as db:
        return [json.loads(m)["data"]["content"] for (m,) in db.execute("SELECT message FROM time_indexed_original ORDER BY id")]


@pytest.mark.parametrize("route", ["process", "renew", "settle"])
def test_a_hanging_model_does_not_hold_a_write_and_a_retry_is_stored_once(tmp_path, fake_llm, route):
    fake_llm.set_delay(None, 600.0)  # every model call hangs (released when the fake closes)
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", powerful_memory_default=False)
    turns = batch(route, 24)  # over the 20-item threshold: compression starts on this write
    with LiveServer(settings) as srv, httpx.Client(base_url=srv.url, timeout=CLIENT_TIMEOUT) as client:
        first = client.post(f"/{route}/Lan", json={"input_history": turns})
        assert first.status_code == 200, first.text
        # The model was really asked (and hangs): the answer did not wait for it.
        assert fake_llm.wait_for_calls(1, timeout=30)
        retry = client.post(f"/{route}/Lan", json={"input_history": turns})  # no key
        assert retry.status_code == 200, retry.text
        assert retry.json() == first.json()
        assert stored_texts(tmp_path, "Lan") == [t["content"] for t in turns]
        # A batch that repeats the stored tail and adds new turns stores only the new ones.
        more = turns[-2:] + batch(f"{route} later", 2)
        assert client.post(f"/{route}/Lan", json={"input_history": more}).status_code == 200
        assert stored_texts(tmp_path, "Lan") == [t["content"] for t in turns + more[2:]]
        # The conversation goes on while the model hangs.
        assert client.post("/cache/Lan", json={"input_history": batch("cached", 2)}).json() == {"status": "cached", "count": 2}
        assert stored_texts(tmp_path, "Lan")[-2:] == ["cached message 0", "cached message 1"]


def test_cache_batches_are_stored_as_sent(tmp_path):
    """/cache batches are each a new turn: the same words said twice are two turns."""
    with LiveServer(make_settings(tmp_path)) as srv:
        same = [{"role": "user", "content": "good night"}]
        for _ in range(2):
            assert srv.post("/cache/Lan", json={"input_history": same}).status_code == 200
        assert stored_texts(tmp_path, "Lan") == ["good night", "good night"]
