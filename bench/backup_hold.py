"""How long ``nekomem backup`` holds a character, and what its writers feel meanwhile.

    python -m bench.backup_hold [--turns 10000] [--facts 5000] [--seconds 4]

A character with ``--turns`` stored turns and ``--facts`` facts is written to a temporary
memory root, ``python -m nekomem serve`` runs on it, and one client posts one-turn
``/cache`` requests to it without pause. After ``--seconds`` of that (the baseline),
``nekomem backup --url`` copies the root (the character is held for its copy, see README
"Backup, export and restore"), then the client runs ``--seconds`` more. Prints the backup's
wall time, the size of the copy, and p50 / max of the /cache latency before, during and
after the backup (a write that arrives during the hold waits for it); then how long a
forget of a fact, of a stored turn and of a range of 100 turns takes on that character.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench._common import smoke_option, start_nekomem
from tests.support.live import ROOT
from tests.support.ui_seed import seed_facts, seed_journal

NAME = "Big"


class Writer(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, float]] = []  # (start, seconds)
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            i = 0
            while not self.stop.is_set():
                started = time.monotonic()
                client.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": f"turn {i}"}]}).raise_for_status()
                self.samples.append((started, time.monotonic() - started))
                i += 1


def _stats(samples: list[float]) -> str:
    if not samples:
        return "no requests"
    return f"{len(samples)} requests, p50 {statistics.median(samples) * 1000:.1f} ms, max {max(samples) * 1000:.1f} ms"


def _erasures(url: str) -> None:
    """Time one forget of each kind on the big character (each rewrites the views and logs
    that held a copy)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        fid = client.get(f"/api/characters/{NAME}/facts", params={"limit": 1}).json()["items"][0]["id"]
        rows = client.get(f"/api/browse/{NAME}/journal", params={"order": "asc", "limit": 101}).json()["items"]
        calls = {
            "a fact": ("DELETE", f"/api/characters/{NAME}/facts/{fid}", None),
            "a stored turn": ("DELETE", f"/api/characters/{NAME}/turns/{rows[0]['id']}", None),
            "a time range of 100 turns": (
                "DELETE",
                f"/api/characters/{NAME}/turns",
                {"from": rows[1]["ts"], "to": rows[100]["ts"]},
            ),
        }
        for what, (method, path, params) in calls.items():
            started = time.monotonic()
            client.request(method, path, params=params).raise_for_status()
            print(f"forget {what}: {(time.monotonic() - started) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--facts", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=4.0)
    smoke_option(parser, None, turns=200, facts=50, seconds=0.3)
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="nekomem-backup-bench-") as tmp:
        root = Path(tmp) / "memory"
        seed_journal(root, NAME, args.turns)
        seed_facts(root, NAME, args.facts)
        server, log = start_nekomem(root, env={"NEKOMEM_EMBEDDING_ENABLED": "false"})
        try:
            httpx.get(f"{server.url}/api/characters/{NAME}/facts", params={"limit": 1}, timeout=120).raise_for_status()
            writer = Writer(server.url)
            writer.start()
            time.sleep(args.seconds)  # the baseline: a bench measures, it asserts nothing
            began = time.monotonic()
            dest = Path(tmp) / "backup"
            done = subprocess.run(
                [sys.executable, "-m", "nekomem", "backup", str(dest), "--url", server.url],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            ended = time.monotonic()
            time.sleep(args.seconds)
            writer.stop.set()
            writer.join(timeout=120)
            if done.returncode != 0:
                raise SystemExit(f"backup failed: {done.stderr}\n{log.text()}")
            size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            before = [s for t, s in writer.samples if t + s < began]
            during = [s for t, s in writer.samples if t < ended and t + s > began]
            after = [s for t, s in writer.samples if t >= ended]
            print(f"character: {args.turns} turns, {args.facts} facts")
            print(f"nekomem backup (a process of its own, start-up included): {ended - began:.2f} s, copy {size / 1e6:.1f} MB")
            print(f"/cache before: {_stats(before)}")
            print(f"/cache overlapping the backup: {_stats(during)}")
            print(f"/cache after: {_stats(after)}")
            _erasures(server.url)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
