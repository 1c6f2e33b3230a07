"""The memory browser's character list on a small and a big install, in one run.

    python -m bench.character_list [--small 50] [--large 5000] [--facts 20] [--smoke]

For each size, that many characters (``--facts`` facts each and a journal of two turns,
none active; their last conversations at 60 different times) are written straight to a
fresh memory root and ``python -m nekomem serve`` is started on it (its start-up builds
the per-root summary, ``character_summary.json``). The first page (50 rows) of
``GET /api/browse/characters`` is timed three ways: sorted by name (the default), sorted
by last conversation, and sorted by name with a name filter (``q=0``: the filter runs over
every name and keeps a full page at both sizes); each the first
time and again (median of 5). Then, for each way, the server is restarted and its very
first request is that page (the summary kept on disk is checked at start-up, before the
server reports ready; the start time is printed too). Prints the large install's time
over the small one's: the target is at most 1.5.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

from bench._common import print_table, smoke_option, start_nekomem
from nekomem.domain.records import Fact, fact_hash
from nekomem.domain.turns import Turn
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.timeindex import TimeIndex

PAGE = 50
WAYS = {
    "name": {"limit": PAGE},
    "last conversation": {"limit": PAGE, "sort": "last_conversation"},
    "name, filter q=0": {"limit": PAGE, "q": "0"},  # every name has a 0: a full page at both sizes
}
ENV = {"NEKOMEM_EMBEDDING_ENABLED": "false"}


def seed(root: Path, count: int, facts: int) -> None:
    """``count`` characters with ``facts`` facts each and a journal of two turns, their
    last conversations spread over 60 times (so every row of any page costs the same:
    a page by last conversation holds characters with a journal at every size)."""
    templates = root / ".templates"
    templates.mkdir(parents=True, exist_ok=True)
    for minute in range(60):
        with TimeIndex(templates / f"{minute:02d}.db") as db:
            db.append(
                "seed",
                [
                    Turn(role="human", text="hello", ts=f"2026-01-01T08:{minute:02d}:00+00:00"),
                    Turn(role="ai", text="hi", ts=f"2026-01-01T08:{minute:02d}:30+00:00"),
                ],
            )
    for c in range(count):
        paths = CharacterPaths(root, f"Char{c:05d}")
        paths.ensure()
        texts = [f"Character {c} remembers thing {i}" for i in range(facts)]
        paths.facts.write_bytes(msgspec.json.encode([Fact(id=f"f{i}", text=t, hash=fact_hash(t)) for i, t in enumerate(texts)]))
        shutil.copyfile(templates / f"{c * 7 % 60:02d}.db", paths.time_index_db)
    shutil.rmtree(templates)


def timed_get(client: httpx.Client, params: dict[str, object]) -> float:
    started = time.perf_counter()
    client.get("/api/browse/characters", params=params).raise_for_status()  # type: ignore[arg-type]
    return time.perf_counter() - started


def time_pages(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=600) as client:
        for way, params in WAYS.items():
            out[f"{way}: first"] = timed_get(client, params)
            out[f"{way}: again (median of 5)"] = statistics.median(timed_get(client, params) for _ in range(5))
    return out


def after_restarts(root: Path) -> dict[str, float]:
    """Each way's page as the very first request of a restarted server, and the start."""
    out: dict[str, float] = {}
    starts = []
    for way, params in WAYS.items():
        started = time.perf_counter()
        server, _ = start_nekomem(root, env=ENV, timeout=300)
        starts.append(time.perf_counter() - started)
        try:
            with httpx.Client(base_url=server.url, timeout=600) as client:
                out[f"{way}: first after a restart"] = timed_get(client, params)
        finally:
            server.stop()
    out["server start until ready (median)"] = statistics.median(starts)
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
            server, _ = start_nekomem(root, env=ENV, timeout=300)
            try:
                results[count] = time_pages(server.url)
            finally:
                server.stop()
            results[count].update(after_restarts(root))
    keys = list(results[args.small])
    rows = [
        [k, results[args.small][k] * 1000, results[args.large][k] * 1000, results[args.large][k] / results[args.small][k]] for k in keys
    ]
    print_table(["first page of 50 rows", f"{args.small} chars ms", f"{args.large} chars ms", "large / small"], rows)
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
