"""SIGKILL the server in the middle of a write load, restart, and check nothing
acknowledged is lost and every JSON view parses."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time

import httpx

from nekomem.domain.post_turn import POST_TURN_CURSOR
from tests.support.live import ServerProcess
from tests.support.waiting import wait_for


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
        server.start(timeout=120)  # a restart on a busy machine loads the tokenizer and the embedding model
        stop = threading.Event()
        threads = [
            threading.Thread(target=writer, args=(server.url, names[t % len(names)], f"r{round_no}t{t}", acked, stop)) for t in range(6)
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
    server.start(timeout=120)
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


def covered_rows(root, name):
    """Row ranges of the post-turn records in a character's outbox (pending or finished)."""
    path = root / name / "outbox.ndjson"
    ranges = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line
            rows = record.get("payload", {}).get("rows") if record.get("status") == "pending" else None
            if rows:
                ranges.append(tuple(rows))
    return ranges


def post_turn_cursor(root, name):
    """The saved post-turn cursor: the rows up to it have finished or recorded work."""
    db = sqlite3.connect(root / name / "time_indexed.db")
    try:
        row = db.execute("SELECT row_id FROM cursors WHERE name = ?", (POST_TURN_CURSOR,)).fetchone()
        return row[0] if row else 0
    finally:
        db.close()


def stored_rows(root, name):
    db = sqlite3.connect(root / name / "time_indexed.db")
    try:
        return {json.loads(m)["data"]["content"]: row_id for row_id, m in db.execute("SELECT id, message FROM time_indexed_original")}
    finally:
        db.close()


def test_kill_during_load_over_500_active_characters(tmp_path):
    """500 characters active at once, 8 writers on random ones, SIGKILL mid-load: after a
    restart every acknowledged turn is stored, in recent.json, covered by a post-turn
    record or passed by the post-turn cursor (its work finished before its record was
    written), and every view parses."""
    names = [f"c{i:03d}" for i in range(500)]
    env = {"NEKOMEM_MAX_ACTIVE_CHARACTERS": "600", "NEKOMEM_PASSIVATE_IDLE_SECONDS": "86400"}
    server = ServerProcess(tmp_path, env=env)
    server.start(timeout=60)
    acked: list[tuple[str, str]] = []
    lock = threading.Lock()

    def post(client, name, text):
        r = client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": text}]})
        if r.status_code == 200:
            with lock:
                acked.append((name, text))

    def activate(part):
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for name in part:
                post(client, name, f"{name}-hello")

    threads = [threading.Thread(target=activate, args=(names[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(acked) == len(names), "every character answered its first turn"
    assert httpx.get(server.url + "/health").json()["active_characters"] == len(names)

    stop = threading.Event()

    def load(seed):
        rng = random.Random(seed)
        i = 0
        with httpx.Client(base_url=server.url, timeout=10) as client:
            while not stop.is_set():
                i += 1
                try:
                    post(client, rng.choice(names), f"w{seed}-{i}")
                except httpx.HTTPError:
                    return  # the server was killed

    writers = [threading.Thread(target=load, args=(k,)) for k in range(8)]
    before = len(acked)
    for t in writers:
        t.start()
    wait_for(lambda: len(acked) >= before + 300, timeout=120, what="300 acknowledged turns under load")
    server.kill()
    stop.set()
    for t in writers:
        t.join(timeout=15)
    server.start(timeout=120)  # recovery re-enqueues what the cursor had not covered
    try:
        by_name: dict[str, list[str]] = {}
        for name, text in acked:
            by_name.setdefault(name, []).append(text)
        for name, mine in by_name.items():
            rows = stored_rows(tmp_path, name)
            missing = set(mine) - set(rows)
            assert not missing, f"{len(missing)} acknowledged turns of {name} lost"
            recent = {m["data"]["content"] for m in json.loads((tmp_path / name / "recent.json").read_text(encoding="utf-8"))}
            assert set(mine) <= recent, f"recent.json of {name} misses acknowledged turns"
        # Recovery has run: every stored turn's post-turn work is recorded once, or it
        # finished before its record reached the file and the cursor has passed it.
        passed = 0
        for name in names:
            rows = stored_rows(tmp_path, name)
            ranges = covered_rows(tmp_path, name)
            cursor = post_turn_cursor(tmp_path, name)
            for _text, row_id in rows.items():
                hits = sum(1 for first, last in ranges if first <= row_id <= last)
                assert hits == 1 or (hits == 0 and row_id <= cursor), f"row {row_id} of {name} has {hits} post-turn records"
                passed += hits == 0
        assert passed > 0, "no post-turn work finished before its record was written"
        for path in tmp_path.rglob("*.json"):
            json.loads(path.read_text(encoding="utf-8"))
        r = httpx.post(server.url + "/cache/c000", json={"input_history": [{"role": "user", "content": "after"}]})
        assert r.status_code == 200
    finally:
        server.stop()
