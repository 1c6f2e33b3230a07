"""Many writers, many characters, and passivation, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import httpx

from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for


def rows(root, name):
    db = sqlite3.connect(root / name / "time_indexed.db")
    try:
        return [json.loads(m)["data"]["content"] for (m,) in db.execute("SELECT message FROM time_indexed_original ORDER BY id")]
    finally:
        db.close()


async def _writer(client, name, writer, count):
    for i in range(count):
        r = await client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": f"w{writer}-{i}"}]})
        assert r.status_code == 200, r.text


def test_50_concurrent_writers_to_one_character(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                await asyncio.gather(*(_writer(client, "Lan", w, 8) for w in range(50)))

        asyncio.run(main())
        stored = rows(tmp_path, "Lan")
        assert len(stored) == 50 * 8 == len(set(stored))
        for w in range(50):
            mine = [s for s in stored if s.startswith(f"w{w}-")]
            assert mine == [f"w{w}-{i}" for i in range(8)]


def test_20_characters_written_concurrently_stay_isolated(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        names = [f"char{c}" for c in range(20)]

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                await asyncio.gather(*(_writer(client, name, w, 5) for name in names for w in range(3)))

        asyncio.run(main())
        for name in names:
            stored = rows(tmp_path, name)
            assert len(stored) == 15
            assert all(s.startswith("w") for s in stored)
            recent = json.loads((tmp_path / name / "recent.json").read_text())
            assert sorted(m["data"]["content"] for m in recent) == sorted(stored)
        assert srv.get("/health").json()["active_characters"] == 20


def test_passivation_bounds_active_characters(tmp_path):
    limit = 16
    with LiveServer(make_settings(tmp_path, max_active_characters=limit)) as srv:

        async def main():
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
                sem = asyncio.Semaphore(8)

                async def touch(i):
                    async with sem:
                        r = await client.post(f"/cache/c{i}", json={"input_history": [{"role": "user", "content": f"hello {i}"}]})
                        assert r.status_code == 200

                await asyncio.gather(*(touch(i) for i in range(1000)))

        asyncio.run(main())
        assert srv.runtime.registry.active_count() <= limit
        assert srv.runtime.registry.passivations >= 1000 - limit
        # A passivated character's next request finds all its data.
        assert "hello 3" in srv.get("/new_dialog/c3").text
        r = srv.post("/cache/c3", json={"input_history": [{"role": "user", "content": "again"}]})
        assert r.status_code == 200
        assert rows(tmp_path, "c3") == ["hello 3", "again"]
        assert srv.runtime.registry.active_count() <= limit


def test_a_passivated_character_leaves_nothing_in_memory(tmp_path):
    """Its instance is dropped once stopped: nothing keeps its actors (and their state)
    alive until the character's next activation."""
    import gc

    from nekomem.layers.recent.actor import RecentActor

    limit = 4
    with LiveServer(make_settings(tmp_path, max_active_characters=limit)) as srv:
        for i in range(40):
            r = srv.post(f"/cache/p{i}", json={"input_history": [{"role": "user", "content": f"hello {i}"}]})
            assert r.status_code == 200
        registry = srv.runtime.registry
        assert registry.passivations >= 40 - limit
        wait_for(lambda: registry.stopping_count() == 0, what="every passivated instance stopped")
        gc.collect()
        alive = [a for a in gc.get_objects() if isinstance(a, RecentActor) and a.ctx.paths.root == tmp_path]
        assert 0 < len(alive) <= limit


def test_idle_passivation_on_a_manual_clock(tmp_path):
    from nekomem.runtime.clock import ManualClock

    clock = ManualClock()
    with LiveServer(make_settings(tmp_path, passivate_idle_seconds=60), clock=clock) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]})
        assert srv.runtime.registry.active_names() == ["Lan"]
        clock.advance(30)  # fires what became due on this thread: nothing yet
        assert srv.runtime.registry.active_names() == ["Lan"]
        clock.advance(31)  # the passivation timer fires here
        assert srv.runtime.registry.active_names() == []
        assert "hi" in srv.get("/new_dialog/Lan").text
