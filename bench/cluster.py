"""nekomem on 1, 2, 3 nodes behind HAProxy on this machine: warm ``/cache`` throughput and
p99 side by side, the cost of the forwarding hop, and a failover timeline around kill -9.

    python -m bench.cluster [--nodes 1,2] [--seconds 10] [--clients 16] [--characters 48]

Each cluster is real: etcd (Debian's etcd-server) on a temp data dir, nekomem nodes as
``python -m nekomem serve`` processes on one shared memory root (embeddings off, no LLM),
HAProxy with the shipped deploy/haproxy.cfg (consistent hashing on the character name).
Every phase: ``--clients`` asyncio clients with one keep-alive connection each post one
turn per request to a random warm character through HAProxy.

Forwarding hop: one client, sequential requests for characters owned by node A, sent to A
directly and then to node B (which forwards to A): p50 of each.

Failover timeline (the largest cluster of the run, at least 2 nodes): the load runs through
HAProxy, one node is killed with SIGKILL after a few seconds, and requests / errors per
second are printed (errors: 503 with Retry-After, the only error a client should see).

The load generator runs on the same cores as the nodes: on a 2-core machine shared with
other work, read the ratios, not the absolute numbers. The last line reads
``2 nodes: X.XXx the throughput of 1 node``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from nekomem.cluster.ring import owner_of
from nekomem.stores.shard_layout import shard_of
from tests.support.cluster import SHARDS, Cluster, cluster


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load(
    url: str,
    names: list[str],
    clients: int,
    seconds: float,
    timeline: dict[int, list[int]] | None = None,
    kinds: Counter[str] | None = None,
) -> tuple[int, list[float], int]:
    """(acknowledged requests, latencies in seconds, error answers) over ``seconds``;
    ``kinds`` counts the errors by status (and Retry-After) or exception."""
    latencies: list[float] = []
    errors = 0
    start = time.monotonic()
    end = start + seconds

    async def one(seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            i = 0
            while time.monotonic() < end:
                name = rng.choice(names)
                t0 = time.monotonic()
                kind = ""
                try:
                    r = await client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": f"b{seed}-{i}"}]})
                    ok = r.status_code == 200
                    kind = f"{r.status_code}{' + Retry-After' if r.headers.get('retry-after') else ''}"
                except httpx.HTTPError as exc:
                    ok = False
                    kind = type(exc).__name__
                if not ok and kinds is not None:
                    kinds[kind] += 1
                i += 1
                second = int(t0 - start)
                if ok:
                    latencies.append(time.monotonic() - t0)
                else:
                    errors += 1
                if timeline is not None:
                    timeline.setdefault(second, [0, 0])[0 if ok else 1] += 1

    await asyncio.gather(*(one(s) for s in range(clients)))
    return len(latencies), latencies, errors


def warm(c: Cluster, names: list[str]) -> None:
    with httpx.Client(base_url=c.proxy.url, timeout=30) as client:
        for name in names:
            for _attempt in range(5):  # HAProxy may still be taking the unused slots out
                r = client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": "warm"}]})
                if r.status_code == 200:
                    break
                print(f"warm-up: {r.status_code} {r.text[:120]}", flush=True)
            else:
                raise SystemExit(f"warm-up of {name} failed")


def hop_cost(c: Cluster, names: list[str], requests: int) -> tuple[float, float]:
    """(p50 direct to the owner, p50 through another node) in seconds."""
    members = sorted(n.node_id for n in c.nodes)
    a, b = c.nodes[0], c.nodes[1]
    owned = [n for n in names if owner_of(shard_of(n, SHARDS), members) == a.node_id] or names[:1]
    result = []
    for node in (a, b):
        times = []
        with httpx.Client(base_url=node.url, timeout=30) as client:
            for i in range(requests):
                name = owned[i % len(owned)]
                t0 = time.perf_counter()
                client.get(f"/get_recent_history/{name}")
                times.append(time.perf_counter() - t0)
        result.append(statistics.median(times))
    return result[0], result[1]


async def failover(
    c: Cluster, names: list[str], clients: int, seconds: float, timeline: dict[int, list[int]], kinds: Counter[str]
) -> float:
    """The load through HAProxy with the last node killed (SIGKILL) 5 s in; the kill's second."""
    task = asyncio.create_task(load(c.proxy.url, names, clients, seconds, timeline, kinds))
    await asyncio.sleep(5.0)
    c.nodes[-1].kill()
    await task
    return 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2", help="cluster sizes, comma-separated (1 to 3: the shipped HAProxy config names three)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--characters", type=int, default=48)
    parser.add_argument("--hop-requests", type=int, default=300)
    parser.add_argument("--failover-seconds", type=float, default=20.0)
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    names = [f"bench{i:03d}" for i in range(args.characters)]
    rows: dict[int, tuple[float, float, int]] = {}
    hop: tuple[float, float] | None = None
    timeline: dict[int, list[int]] = {}
    kinds: Counter[str] = Counter()
    killed_at = 0.0
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="nekomem-cluster-bench-") as tmp, cluster(Path(tmp), size=size) as c:
            warm(c, names)
            asyncio.run(load(c.proxy.url, names, args.clients, 2.0))  # connections and caches warm
            count, latencies, errors = asyncio.run(load(c.proxy.url, names, args.clients, args.seconds))
            rows[size] = (count / args.seconds, pct(latencies, 0.99), errors)
            print(
                f"{size} node(s): {count / args.seconds:8.1f} req/s  p50 {pct(latencies, 0.5) * 1000:6.1f} ms  p99 {pct(latencies, 0.99) * 1000:6.1f} ms  errors {errors}",
                flush=True,
            )
            if size >= 2 and hop is None:
                hop = hop_cost(c, names, args.hop_requests)
            if size == max(sizes) and size >= 2:
                killed_at = asyncio.run(failover(c, names, args.clients, args.failover_seconds, timeline, kinds))
    print()
    print(f"{'nodes':>5} {'req/s':>9} {'p99 ms':>8} {'errors':>7}")
    for size, (rps, p99, errors) in rows.items():
        print(f"{size:>5} {rps:>9.1f} {p99 * 1000:>8.1f} {errors:>7}")
    if hop is not None:
        print(
            f"\nforwarding hop (GET /get_recent_history, sequential): direct p50 {hop[0] * 1000:.2f} ms, forwarded p50 {hop[1] * 1000:.2f} ms, {hop[1] / hop[0]:.2f}x"
        )
    if timeline:
        print(f"\nfailover timeline ({max(sizes)} nodes, kill -9 of one at t={killed_at:.0f}s): second  ok/s  errors/s")
        for second in sorted(timeline):
            ok, bad = timeline[second]
            mark = "  <- kill -9" if second == int(killed_at) else ""
            print(f"  {second:>3}  {ok:>5}  {bad:>5}{mark}")
        print(
            "  errors by kind (bucketed by the second the request started): "
            + (", ".join(f"{k}: {n}" for k, n in kinds.most_common()) or "none")
        )
    if 1 in rows and 2 in rows:
        print(f"2 nodes: {rows[2][0] / rows[1][0]:.2f}x the throughput of 1 node")


if __name__ == "__main__":
    main()
