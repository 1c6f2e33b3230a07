"""Density: how nekomem behaves with many characters active in one process.

    python -m bench.density [--active 100,1000] [--known 10000] [--requests 5000]

Starts one real server (``python -m nekomem serve``, temp memory root, no LLM, default
settings except ``max_active_characters`` raised above the largest N so nothing is
passivated mid-run). ``--known`` character folders exist on disk: one is made through the
HTTP API with a short conversation, the rest are copies of its folder (real files the
server wrote, under other names). Then, in one run, side by side:

1. the baseline: 10 characters active (each activated by one /cache), then a bounded warm
   load (``--requests`` requests from ``--clients`` clients, 4 /cache : 1 /new_dialog)
   spread over those 10;
2. for each N of ``--active``: characters are activated (one /cache each) up to N active;
   the latency of each of those first requests is "activation" (the character was passive:
   its folder is read on an actor worker); then the same warm load spread over all N.

Prints per N: warm throughput and p50/p99 per route, errors (any non-2xx), process threads
and RSS (from /proc), RSS per active character beyond the 10-active base, activation
p50/p99, and the ratios the runtime issue asks for (throughput and p99 vs 10 active,
activation p99 vs warm /cache p99). Loopback only; every phase is bounded in requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._common import (
    PhaseResult,
    RouteStats,
    gather_limited,
    make_client,
    print_table,
    ratio,
    run_load,
    smoke_option,
    start_nekomem,
    timed_request,
    turn_pair,
    wait_embeddings_settled,
)

WRITE = "POST /cache/{name}"
READ = "GET /new_dialog/{name}"
BASE_ACTIVE = 10
ACTIVATION_CONCURRENCY = 16
REQUEST_TIMEOUT_SECONDS = 60.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.density", description=__doc__.split("\n\n")[0])
    parser.add_argument("--active", default="100,1000", help="active character counts to compare with 10 (default 100,1000)")
    parser.add_argument("--known", type=int, default=10_000, help="character folders on disk (default 10000)")
    parser.add_argument(
        "--requests",
        type=int,
        default=5000,
        help="warm requests per phase (default 5000: one stall of the machine delays every request in flight, up to --clients of them; "
        "with 1,200 /cache samples that alone was more than 1%%, so the p99 measured the longest stall, not the server)",
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="bound of each warm phase (default 120)")
    parser.add_argument("--seed", type=int, default=11)
    return parser


def name(i: int) -> str:
    return f"dens-{i:05d}"


def proc_status(pid: int) -> dict[str, int]:
    """Threads and VmRSS (kB) of a process, from /proc."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Threads", "VmRSS"):
            values[key] = int(rest.split()[0])
    return values


def make_known(root: Path, url: str, count: int) -> None:
    """Character 0 through the API (a short conversation), the others copies of its folder."""
    with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_SECONDS) as client:
        for turn in range(3):
            client.post(f"/cache/{name(0)}", json=turn_pair(f"hello, this is turn {turn}", f"nice to hear, turn {turn}")).raise_for_status()
    template = root / name(0)
    # The server keeps the folder's files open while the character is active; copying reads
    # them only (SQLite in WAL mode: the -wal file is copied too, so the copy is complete).
    for i in range(1, count):
        shutil.copytree(template, root / name(i), ignore=shutil.ignore_patterns("*-shm"))


def plan_for(names: list[str], seed: int, clients: int) -> Any:
    rngs = [random.Random(seed * 7919 + c) for c in range(clients)]

    def plan(client: int, number: int) -> tuple[str, str, str, Any]:
        who = rngs[client].choice(names)
        if number % 5 == 4:
            return READ, "GET", f"/new_dialog/{who}", None
        return (
            WRITE,
            "POST",
            f"/cache/{who}",
            turn_pair(f"client {client} turn {number}: what did you cook today?", f"turn {number}: a warm curry, master."),
        )

    return plan


async def activate(url: str, names: list[str]) -> RouteStats:
    """The first request of each character in ``names`` (each is passive until then)."""
    stats = RouteStats()
    async with make_client(url, REQUEST_TIMEOUT_SECONDS, ACTIVATION_CONCURRENCY) as client:

        async def one(who: str) -> None:
            await timed_request(client, "POST", f"/cache/{who}", turn_pair("I am back", "welcome back"), stats)

        await gather_limited([lambda w=w: one(w) for w in names], ACTIVATION_CONCURRENCY)
    return stats


class Phase:
    def __init__(
        self, active: int, warm: PhaseResult, status: dict[str, int], activation: RouteStats | None, health: dict[str, Any]
    ) -> None:
        self.active = active
        self.warm = warm
        self.status = status
        self.activation = activation
        self.health = health

    def route(self, label: str) -> dict[str, float]:
        stats = self.warm.routes.get(label, RouteStats())
        return stats.summary(self.warm.wall_seconds)

    def errors(self) -> int:
        return self.warm.total().errors + (self.activation.errors if self.activation else 0)


def run_phase(url: str, pid: int, names: list[str], newly: list[str], args: argparse.Namespace) -> Phase:
    activation = asyncio.run(activate(url, newly)) if newly else None
    plan = plan_for(names, args.seed, args.clients)
    warm = asyncio.run(run_load(url, plan, clients=args.clients, seconds=args.max_seconds, max_requests=args.requests, server_pid=pid))
    health = httpx.get(url + "/health", timeout=10).json()
    return Phase(len(names), warm, proc_status(pid), activation, health)


def report(phases: list[Phase]) -> None:
    base = phases[0]
    rows = []
    for p in phases:
        for label in (WRITE, READ):
            s = p.route(label)
            rows.append([p.active, label, s["count"], s["rps"], s["p50_ms"], s["p99_ms"], s["errors"]])
    print_table(["active", "route", "count", "req/s", "p50 ms", "p99 ms", "errors"], rows)
    print()
    rows = []
    for p in phases:
        rss_mb = p.status["VmRSS"] / 1024
        extra = (p.status["VmRSS"] - base.status["VmRSS"]) / 1024 / max(1, p.active - base.active) if p is not base else float("nan")
        act = sorted(p.activation.latencies) if p.activation else []
        act_s = p.activation.summary(1.0) if p.activation else {"p50_ms": float("nan"), "p99_ms": float("nan")}
        rows.append([p.active, p.status["Threads"], rss_mb, extra, len(act), act_s["p50_ms"], act_s["p99_ms"], p.errors()])
    print_table(
        ["active", "threads", "RSS MB", "MB per extra active", "activations", "activation p50 ms", "activation p99 ms", "errors"], rows
    )
    print()
    print(f"ratios against {base.active} active (targets: throughput >= 0.8, p99 <= 2, activation p99 <= 10x warm /cache p99):")
    rows = []
    for p in phases[1:]:
        total_b, total_p = base.warm.total().summary(base.warm.wall_seconds), p.warm.total().summary(p.warm.wall_seconds)
        wb, wp = base.route(WRITE), p.route(WRITE)
        rb, rp = base.route(READ), p.route(READ)
        act_p99 = p.activation.summary(1.0)["p99_ms"] if p.activation else float("nan")
        rows.append(
            [
                p.active,
                ratio(total_p["rps"], total_b["rps"]),
                ratio(wp["p99_ms"], wb["p99_ms"]),
                ratio(rp["p99_ms"], rb["p99_ms"]),
                ratio(act_p99, wp["p99_ms"]),
            ]
        )
    print_table(["active", "throughput", "/cache p99", "/new_dialog p99", "activation p99 / warm /cache p99"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    smoke_option(parser, argv, active="20", known=50, clients=2, max_seconds=5.0, requests=100)
    args = parser.parse_args(argv)
    actives = sorted({int(x) for x in args.active.split(",") if x.strip()})
    if not actives or actives[0] <= BASE_ACTIVE or actives[-1] > args.known or args.requests < 1:
        print(f"density: every --active must be > {BASE_ACTIVE} and <= --known; --requests >= 1", file=sys.stderr)
        return 2
    print(
        f"density: known={args.known}, active={BASE_ACTIVE} then {actives}, {args.requests} warm requests per phase, "
        f"{args.clients} clients, loopback; cores={os.cpu_count()}, loadavg(1m)={os.getloadavg()[0]:.2f}"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nekomem-density-") as tmp:
        root = Path(tmp)
        env = {"NEKOMEM_MAX_ACTIVE_CHARACTERS": str(actives[-1] + 100), "NEKOMEM_PASSIVATE_IDLE_SECONDS": "86400"}
        server, stderr = start_nekomem(root, env)
        try:
            assert server.proc is not None
            pid = server.proc.pid
            state = wait_embeddings_settled(server.url)
            t0 = time.monotonic()
            make_known(root, server.url, args.known)
            print(f"density: {args.known} character folders on disk in {time.monotonic() - t0:.1f} s (embeddings={state})")
            phases = [run_phase(server.url, pid, [name(i) for i in range(BASE_ACTIVE)], [name(i) for i in range(1, BASE_ACTIVE)], args)]
            active = BASE_ACTIVE
            for n in actives:
                names = [name(i) for i in range(n)]
                phases.append(run_phase(server.url, pid, names, names[active:], args))
                active = n
            print(f"density: server reports {phases[-1].health.get('active_characters', '?')} active characters")
        except Exception:
            print("nekomem stderr tail:\n" + stderr.text(), file=sys.stderr)
            raise
        finally:
            server.stop()
    print()
    report(phases)
    print(f"total run time {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
