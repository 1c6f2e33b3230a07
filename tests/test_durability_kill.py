"""SIGKILL the server in the middle of a write load, restart, and check nothing
acknowledged is lost and every JSON view parses."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time

import httpx

from tests.support.live import ServerProcess


def stored_texts(root, name):
    db = sqlite3.connect(root / name / "time_indexed.db")
    try:
        return [json.loads(m)["data"]["content"] for (m,) in db.execute("SELECT message FROM time_indexed_original")]
    finally:
        db.close()


def writer(url, name, tag, acked, stop):
    i = 0
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set():
            text = f"{tag}-{i}"
            i += 1
            try:
                r = client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": text}]})
            except httpx.HTTPError:
                return
            if r.status_code == 200:
                acked.append((name, text))


def test_kill_during_writes_loses_no_acknowledged_turn(tmp_path):
    rng = random.Random(7)
    acked: list[tuple[str, str]] = []
    names = ["Lan", "Mio", "ねこ"]
    server = ServerProcess(tmp_path)
    for round_no in range(4):
        server.start()
        stop = threading.Event()
        threads = [
            threading.Thread(target=writer, args=(server.url, names[t % len(names)], f"r{round_no}t{t}", acked, stop))
            for t in range(6)
        ]
        before = len(acked)
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(acked) < before + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.1, 0.6))
        server.kill()
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert len(acked) > 50, "the load was too small to mean anything"
    server.start()
    try:
        for name in names:
            texts = stored_texts(tmp_path, name)
            mine = [text for n, text in acked if n == name]
            missing = set(mine) - set(texts)
            assert not missing, f"{len(missing)} acknowledged turns of {name} lost"
            assert len(texts) == len(set(texts)), "a turn was stored twice"
            recent = json.loads((tmp_path / name / "recent.json").read_text(encoding="utf-8"))
            assert set(mine) <= {m["data"]["content"] for m in recent}
        for path in tmp_path.rglob("*.json"):
            json.loads(path.read_text(encoding="utf-8"))
        for path in tmp_path.rglob("*.ndjson"):
            lines = path.read_text(encoding="utf-8").splitlines()
            for line in lines[:-1]:
                json.loads(line)  # only the very last line may be torn
        # Still serving after all that.
        r = httpx.post(server.url + "/cache/Lan", json={"input_history": [{"role": "user", "content": "after"}]})
        assert r.status_code == 200
    finally:
        server.stop()
