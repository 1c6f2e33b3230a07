"""Recall under concurrent queries: the default embedding models against BM25 only, side by side.

    python -m bench.recall_concurrency [--models use+e5] [--clients 8 32] [--seconds 4] [--smoke]

Starts real servers (``python -m nekomem serve``, temp memory roots, no LLM): one with
embeddings off (``recall_legs`` stays hybrid, the model is simply absent, so recall is BM25
only) and one per ``--models`` value. Each gets ``--characters`` characters with ``--facts``
facts each through ``POST /api/characters/{name}/facts`` and waits until every fact has its
vector. Then, for each client count, every server in turn takes ``--seconds`` of N clients
posting ``/query_memory`` (a random character, a random query of ``bench.recall_latency``'s
synthetic corpus). Printed: queries/s, p50/p95/p99 ms, how many answers carried an
``error_code``, and for each model the ratios against the BM25-only server of the same client
count (issue 39's targets: throughput >= 0.15x, p95 <= 10x). ``--smoke``: 2 characters of 5
facts, 1 s per phase, 2 clients, ``use`` only (the smallest run that reaches the last line).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._common import PhaseResult, client_pool, percentile, print_table, ratio, run_load, start_nekomem
from bench.recall_latency import SEED, Corpus
from tests.support.live import ServerProcess

ROUTE = "POST /query_memory/{name}"
SETTLE_SECONDS = 600.0
OFF = "off"


@dataclass
class Row:
    server: str
    clients: int
    result: PhaseResult
    error_answers: int

    def stats(self) -> dict[str, float]:
        values = sorted(self.result.total().latencies)
        wall = self.result.wall_seconds
        return {
            "count": len(values),
            "rps": len(values) / wall if wall else float("nan"),
            "p50": percentile(values, 50) * 1000,
            "p95": percentile(values, 95) * 1000,
            "p99": percentile(values, 99) * 1000,
            "errors": self.result.total().errors,
        }


def character(i: int) -> str:
    return f"conc-{i:03d}"


def seed_facts(url: str, characters: int, facts: int, corpus: Corpus) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(characters):
            body = {"facts": [{"text": corpus.fact()} for _ in range(facts)]}
            client.post(f"/api/characters/{character(i)}/facts", json=body).raise_for_status()


def wait_vectors(url: str, characters: int, timeout: float) -> dict[str, Any]:
    """Wait until the model has loaded, no fact waits for its vector and the model pool is
    idle (the backfill and the duplicate checks burn CPU that would land inside a
    measurement); one query per character activates its recall."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(characters):
            client.post(f"/query_memory/{character(i)}", json={"query": "warm up"}).raise_for_status()
        while time.monotonic() < deadline:
            emb = client.get("/health").json()["embeddings"]
            if emb["state"] != "loading" and not emb.get("pending") and model_jobs(client) == 0:
                return dict(emb)
            time.sleep(0.2)
    raise RuntimeError(f"vectors not settled after {timeout:.0f} s")


def model_jobs(client: httpx.Client) -> float:
    """The model pool's queued and running jobs (the facts' duplicate checks after an import
    embed their texts there), from /metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("nekomem_model_jobs "):
            return float(line.split()[1])
    return 0.0


def make_plan(characters: int, queries: Sequence[str], seed: int) -> Any:
    rngs: dict[int, random.Random] = {}

    def plan(client: int, number: int) -> tuple[str, str, str, Any]:
        rng = rngs.setdefault(client, random.Random(seed * 7919 + client))
        return ROUTE, "POST", f"/query_memory/{character(rng.randrange(characters))}", {"query": rng.choice(queries)}

    return plan


async def measure(url: str, pid: int, clients: int, seconds: float, plan: Any) -> tuple[PhaseResult, int]:
    """One phase; also counts 200 answers with an error_code (a failed or timed-out recall)."""
    errors = 0
    async with client_pool(url, clients) as pool:
        # A short warm-up on the same connections, not recorded.
        await run_load(url, plan, clients=clients, seconds=min(0.5, seconds), max_requests=clients * 4, pool=pool, record=False)
        originals = [c.request for c in pool]

        def wrap(original: Any) -> Any:
            async def request(*a: Any, **k: Any) -> httpx.Response:
                nonlocal errors
                response: httpx.Response = await original(*a, **k)
                if response.status_code == 200 and "error_code" in response.json():
                    errors += 1
                return response

            return request

        for c, original in zip(pool, originals, strict=True):
            c.request = wrap(original)  # type: ignore[method-assign]
        result = await run_load(url, plan, clients=clients, seconds=seconds, max_requests=10**9, pool=pool, server_pid=pid)
    return result, errors


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recall_concurrency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["use+e5"], help="embedding_model values to compare with BM25 only")
    parser.add_argument("--clients", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per server and client count")
    parser.add_argument("--characters", type=int, default=20)
    parser.add_argument("--facts", type=int, default=50)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--env", action="append", default=[], help="extra NEKOMEM_X=value for the model servers (repeatable)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="one more model server, LABEL:MODEL:NEKOMEM_X=v,NEKOMEM_Y=w (settings compared side by side; repeatable)",
    )
    parser.add_argument("--smoke", action="store_true", help="the smallest run that reaches the last line")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.clients, args.seconds, args.characters, args.facts = ["use"], [2], 1.0, 2, 5
    extra = dict(item.split("=", 1) for item in args.env)
    print(
        f"recall_concurrency: {args.characters} characters x {args.facts} facts, clients {args.clients}, {args.seconds:.1f} s per phase; "
        f"cores={os.cpu_count()}, loadavg(1m)={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    corpus = Corpus(args.seed)
    queries = [corpus.query() for _ in range(200)]
    servers: dict[str, ServerProcess] = {}
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="nekomem-conc-") as tmp:
        try:
            setups: list[tuple[str, dict[str, str]]] = [(OFF, {"NEKOMEM_EMBEDDING_ENABLED": "false"})]
            setups += [(model, {"NEKOMEM_EMBEDDING_MODEL": model, **extra}) for model in args.models]
            for variant in args.variant:
                label, model, pairs = (variant.split(":", 2) + ["", ""])[:3]
                setups.append((label, {"NEKOMEM_EMBEDDING_MODEL": model, **extra, **dict(p.split("=", 1) for p in pairs.split(",") if p)}))
            for label, env in setups:
                root = Path(tmp) / label.replace("+", "_")
                server, _ = start_nekomem(root, env)
                servers[label] = server
                seed_facts(server.url, args.characters, args.facts, Corpus(args.seed + 1))
                state = wait_vectors(server.url, args.characters, SETTLE_SECONDS)
                assert server.proc is not None
                print(
                    f"  server {label}: embeddings {state['state']} {state.get('model', '')}, RSS {rss_mb(server.proc.pid):.0f} MB",
                    flush=True,
                )
            for clients in args.clients:
                for label, server in servers.items():
                    assert server.proc is not None
                    plan = make_plan(args.characters, queries, args.seed)
                    result, errors = asyncio.run(measure(server.url, server.proc.pid, clients, args.seconds, plan))
                    rows.append(Row(label, clients, result, errors))
        finally:
            for server in servers.values():
                server.stop()
    table = []
    for row in rows:
        s = row.stats()
        table.append([row.server, row.clients, s["count"], s["rps"], s["p50"], s["p95"], s["p99"], s["errors"], row.error_answers])
    print()
    print_table(["embeddings", "clients", "queries", "queries/s", "p50 ms", "p95 ms", "p99 ms", "errors", "error_code"], table)
    print()
    ratios = []
    verdict = True
    for row in rows:
        if row.server == OFF:
            continue
        base = next(r for r in rows if r.server == OFF and r.clients == row.clients).stats()
        s = row.stats()
        thru, p95 = ratio(s["rps"], base["rps"]), ratio(s["p95"], base["p95"])
        ok = thru >= 0.15 and p95 <= 10
        verdict = verdict and ok
        ratios.append([row.server, row.clients, thru, p95, "yes" if ok else "NO"])
    print("against BM25 only at the same client count (targets: throughput >= 0.15x, p95 <= 10x):")
    print_table(["embeddings", "clients", "throughput x", "p95 x", "meets"], ratios)
    print(f"recall_concurrency: {'all targets met' if verdict else 'some target missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
