"""The memory browser's character list on a small and a big install, in one run.

    python -m bench.character_list [--small 50] [--large 5000] [--facts 20] [--smoke]

For each size, that many characters (``--facts`` facts each, none active) are written
straight to a fresh memory root, ``python -m nekomem serve`` is started on it, and the
first page (50 rows) of ``GET /api/browse/characters`` is timed: sorted by name (the
default: only the page's characters are looked at) and by last conversation (every
character's summary stamp is checked), each the first time (the per-root summary is
built as it goes) and again (median of 5); then the server is restarted and its first
page by name is timed (the summary kept on disk is read). Prints the large install's time over the
small one's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

from bench._common import print_table, smoke_option, start_nekomem
from nekomem.domain.records import Fact, fact_hash
from nekomem.stores.layout import CharacterPaths

PAGE = 50


def seed(root: Path, count: int, facts: int) -> None:
    for c in range(count):
        paths = CharacterPaths(root, f"Char{c:05d}")
        paths.ensure()
        texts = [f"Character {c} remembers thing {i}" for i in range(facts)]
        paths.facts.write_bytes(msgspec.json.encode([Fact(id=f"f{i}", text=t, hash=fact_hash(t)) for i, t in enumerate(texts)]))


def time_pages(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=600) as client:
        for sort in ("name", "last_conversation"):
            params = {"limit": PAGE, "sort": sort}
            started = time.perf_counter()
            client.get("/api/browse/characters", params=params).raise_for_status()
            out[f"{sort} first"] = time.perf_counter() - started
            again = []
            for _ in range(5):
                started = time.perf_counter()
                client.get("/api/browse/characters", params=params).raise_for_status()
                again.append(time.perf_counter() - started)
            out[f"{sort} again"] = statistics.median(again)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", type=int, default=50)
    parser.add_argument("--large", type=int, default=5_000)
    parser.add_argument("--facts", type=int, default=20)
    smoke_option(parser, argv, small=10, large=200, facts=3)
    args = parser.parse_args(argv)
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="nekomem-list-bench-") as tmp:
        for count in (args.small, args.large):
            root = Path(tmp) / f"root-{count}"
            seed(root, count, args.facts)
            server, _ = start_nekomem(root, env={"NEKOMEM_EMBEDDING_ENABLED": "false"}, timeout=300)
            try:
                results[count] = time_pages(server.url)
            finally:
                server.stop()
            # The summary is kept on disk: a restarted server's first page reads it.
            server, _ = start_nekomem(root, env={"NEKOMEM_EMBEDDING_ENABLED": "false"}, timeout=300)
            try:
                started = time.perf_counter()
                httpx.get(f"{server.url}/api/browse/characters", params={"limit": PAGE}, timeout=600).raise_for_status()
                results[count]["name, first after a restart"] = time.perf_counter() - started
            finally:
                server.stop()
    keys = list(results[args.small])
    rows = [
        [k, results[args.small][k] * 1000, results[args.large][k] * 1000, results[args.large][k] / results[args.small][k]] for k in keys
    ]
    print_table(["first page of 50, sorted by", f"{args.small} chars ms", f"{args.large} chars ms", "large / small"], rows)


if __name__ == "__main__":
    main()
