"""Memory of the embedding models under load against the same server at rest, per model.

    python -m bench.memory [--models use e5 use+e5] [--characters 200] [--active 20]
                           [--clients 8] [--seconds 20] [--smoke]

For each model (and, first, embeddings off as the reference) one real server
(``python -m nekomem serve``, temp memory root, no LLM, ``max_active_characters`` =
``--active`` so characters are passivated and activated all along). One character gets
``--facts`` facts through the API and one conversation turn; once every fact has its vector,
its folder is copied to ``--characters`` - 1 other names (real files the server wrote, vectors
included). At rest: that one character served (a query), the server idle for a moment, then
VmRSS. Under load: ``--clients`` clients, each cycling over the characters with a ``/cache``
then a ``/query_memory``, for ``--seconds``; VmRSS is sampled every 20 ms and the peak kept.
Printed per model: RSS at rest, peak under load, their ratio (issue 39's target: <= 1.5x),
RSS after the load, and the load's requests/s. ``--smoke``: ``use`` only, 6 characters, 2
active, 1 s of load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench._common import print_table, ratio, run_load, start_nekomem, turn_pair
from bench.recall_latency import SEED, Corpus

OFF = "off"
REST_SECONDS = 1.0
SAMPLE_SECONDS = 0.02
SETTLE_SECONDS = 600.0


def character(i: int) -> str:
    return f"mem-{i:05d}"


def vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakSampler:
    """VmRSS of a process every SAMPLE_SECONDS on a thread; ``peak`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = vm_rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, vm_rss_mb(self.pid))


def settle(client: httpx.Client, timeout: float) -> None:
    """Until the model has loaded and no fact waits for its vector."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        emb = client.get("/health").json()["embeddings"]
        if emb["state"] != "loading" and not emb.get("pending"):
            return
        time.sleep(0.2)
    raise RuntimeError("vectors not settled")


def prepare(root: Path, url: str, characters: int, facts: int) -> None:
    corpus = Corpus(SEED + 1)
    with httpx.Client(base_url=url, timeout=120) as client:
        client.post(
            f"/api/characters/{character(0)}/facts", json={"facts": [{"text": corpus.fact()} for _ in range(facts)]}
        ).raise_for_status()
        client.post(f"/cache/{character(0)}", json=turn_pair("hello, I'm home", "welcome home")).raise_for_status()
        client.post(f"/query_memory/{character(0)}", json={"query": "warm up"}).raise_for_status()
        settle(client, SETTLE_SECONDS)
    template = root / character(0)
    for i in range(1, characters):
        shutil.copytree(template, root / character(i), ignore=shutil.ignore_patterns("*-shm", "*.tmp"))


def make_plan(characters: int, queries: Sequence[str]) -> Any:
    def plan(client: int, number: int) -> tuple[str, str, str, Any]:
        who = character((client * 7919 + number // 2) % characters)
        if number % 2 == 0:
            return "cache", "POST", f"/cache/{who}", turn_pair(f"turn {number}: what should we cook?", "a warm curry, master.")
        return "query", "POST", f"/query_memory/{who}", {"query": queries[(client + number) % len(queries)]}

    return plan


def measure(label: str, tmp: Path, args: argparse.Namespace) -> list[Any]:
    root = tmp / label.replace("+", "_")
    env = {
        "NEKOMEM_MAX_ACTIVE_CHARACTERS": str(args.active),
        **({"NEKOMEM_EMBEDDING_ENABLED": "false"} if label == OFF else {"NEKOMEM_EMBEDDING_MODEL": label}),
        **dict(item.split("=", 1) for item in args.env),
    }
    server, _ = start_nekomem(root, env)
    try:
        assert server.proc is not None
        pid = server.proc.pid
        prepare(root, server.url, args.characters, args.facts)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            client.post(f"/query_memory/{character(0)}", json={"query": "what did we eat?"}).raise_for_status()
        time.sleep(REST_SECONDS)  # idle before the reading, not a test assertion
        rest = vm_rss_mb(pid)
        gen = Corpus(SEED)
        queries = [gen.query() for _ in range(100)]
        with PeakSampler(pid) as sampler:
            result = asyncio.run(
                run_load(server.url, make_plan(args.characters, queries), clients=args.clients, seconds=args.seconds, max_requests=10**9)
            )
        time.sleep(REST_SECONDS)
        after = vm_rss_mb(pid)
        total = result.total()
        return [label, rest, sampler.peak, ratio(sampler.peak, rest), after, len(total.latencies) / result.wall_seconds, total.errors]
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["use", "e5", "use+e5"])
    parser.add_argument("--characters", type=int, default=200)
    parser.add_argument("--active", type=int, default=20, help="max_active_characters of the servers")
    parser.add_argument("--facts", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--env", action="append", default=[], help="extra NEKOMEM_X=value for every server (repeatable)")
    parser.add_argument("--no-off", action="store_true", help="skip the embeddings-off reference server")
    parser.add_argument("--smoke", action="store_true", help="the smallest run that reaches the last line")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.characters, args.active, args.facts, args.clients, args.seconds = ["use"], 6, 2, 5, 2, 1.0
    print(
        f"memory: {args.characters} characters x {args.facts} facts, {args.active} active at most, {args.clients} clients x "
        f"{args.seconds:.0f} s of /cache + /query_memory; cores={os.cpu_count()}, loadavg(1m)={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="nekomem-memory-") as tmp:
        for label in ([] if args.no_off else [OFF]) + list(args.models):
            rows.append(measure(label, Path(tmp), args))
            print(f"  {label}: done", flush=True)
    print()
    print_table(["embeddings", "RSS at rest MB", "peak under load MB", "peak / rest", "RSS after MB", "requests/s", "errors"], rows)
    met = all(r[3] <= 1.5 for r in rows if r[0] != OFF)
    print(f"memory: peak under load <= 1.5x rest for every model: {'yes' if met else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
