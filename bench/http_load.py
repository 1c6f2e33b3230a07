"""HTTP throughput and latency of nekomem's conversation routes against a bare Starlette
baseline, both served by uvicorn in their own process on 127.0.0.1.

    python -m bench.http_load [--characters 50] [--clients 32] [--seconds 15] [--rounds 1]

Each of ``--clients`` asyncio clients (one keep-alive httpx connection each) loops: four
``POST /cache/{name}`` turns (one user + one assistant message) for a random character,
then one ``GET /new_dialog/{name}``. The same generator, mix and concurrency hit first the
baseline (``bench/_baseline_app.py``: the same two paths with trivial handlers) and then
nekomem (``python -m nekomem serve``, temp memory root, no LLM, default settings). Every
phase is bounded by ``--seconds`` and ``--max-requests``. Prints req/s and p50/p99 per route
for both servers and the nekomem/baseline ratios.

Both servers are measured the same way: the clients (one httpx AsyncClient each, whose
construction alone costs ~40 ms of CPU for its TLS context) are made before the warm-up,
and the warm-up and the measurement share them and their keep-alive connections, so the
measured window holds requests only. (Until this was so, building 32 clients inside the
window was charged to the load generator per request of whichever server was measured,
about twice as much against the slower one.) Without an LLM the recent window grows with
every turn, so nekomem's per-request work grows over a run: compare ratios of runs of equal
length. This machine's cores are shared with other work: ``--rounds N`` keeps both servers
up and measures them N times each, alternating, and prints the median ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._common import (
    PhaseResult,
    Plan,
    UvicornProcess,
    client_pool,
    gather_limited,
    make_client,
    print_table,
    ratio,
    run_load,
    smoke_option,
    start_nekomem,
    turn_pair,
    wait_embeddings_settled,
)

WRITE = "POST /cache/{name}"
READ = "GET /new_dialog/{name}"
ACTIVATION_CONCURRENCY = 8
ACTIVATION_TIMEOUT_SECONDS = 60.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.http_load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--characters", type=int, default=50, help="distinct character names (default 50)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per server (default 15)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unrecorded load seconds before each measurement (default 2)")
    parser.add_argument("--max-requests", type=int, default=200_000, help="request cap per measured phase (default 200000)")
    parser.add_argument("--read-every", type=int, default=5, help="every Nth request of a client is a read (default 5: 4 writes : 1 read)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the character choice")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure baseline and nekomem this many times each, alternating, both servers up (default 1); "
        "prints every round and the median ratios",
    )
    return parser


def character_names(count: int, round_number: int = 1) -> list[str]:
    """The characters of one round: each round has its own, so every round starts from the
    same short windows (without an LLM a window only grows)."""
    prefix = "bench-char" if round_number == 1 else f"bench-r{round_number}-char"
    return [f"{prefix}-{i:03d}" for i in range(count)]


def make_plan(names: list[str], read_every: int, seed: int, clients: int) -> Plan:
    rngs = [random.Random(seed * 100_003 + c) for c in range(clients)]

    def plan(client: int, number: int) -> tuple[str, str, str, Any]:
        name = rngs[client].choice(names)
        if read_every > 0 and number % read_every == read_every - 1:
            return READ, "GET", f"/new_dialog/{name}", None
        body = turn_pair(
            f"client {client} says message {number}: how was your day, did you finish the book?",
            f"reply {number} to client {client}: it was lovely, I read two more chapters this afternoon.",
        )
        return WRITE, "POST", f"/cache/{name}", body

    return plan


async def activate(url: str, names: list[str]) -> float:
    """One /cache per character (activates its actors and opens its files); seconds taken."""
    started = time.perf_counter()
    async with make_client(url, ACTIVATION_TIMEOUT_SECONDS, ACTIVATION_CONCURRENCY) as client:

        async def one(name: str) -> None:
            response = await client.post(f"/cache/{name}", json=turn_pair("hello", "hello, master"))
            response.raise_for_status()

        await gather_limited([lambda n=n: one(n) for n in names], ACTIVATION_CONCURRENCY)
    return time.perf_counter() - started


async def measure(url: str, args: argparse.Namespace, names: list[str], server_pid: int) -> PhaseResult:
    plan = make_plan(names, args.read_every, args.seed, args.clients)
    # The clients (and, after the warm-up, their connections) exist before the measured
    # window opens, so both servers are charged for requests only.
    async with client_pool(url, args.clients) as pool:
        if args.warmup > 0:
            await run_load(url, plan, clients=args.clients, seconds=args.warmup, max_requests=args.max_requests, record=False, pool=pool)
        return await run_load(
            url, plan, clients=args.clients, seconds=args.seconds, max_requests=args.max_requests, server_pid=server_pid, pool=pool
        )


def report_rows(server: str, result: PhaseResult) -> list[list[Any]]:
    rows = []
    for label in (WRITE, READ):
        stats = result.routes.get(label)
        if stats is None:
            continue
        s = stats.summary(result.wall_seconds)
        rows.append([server, label, s["count"], s["rps"], s["p50_ms"], s["p99_ms"], s["max_ms"], s["errors"], s["mean_bytes"]])
    t = result.total().summary(result.wall_seconds)
    rows.append([server, "all", t["count"], t["rps"], t["p50_ms"], t["p99_ms"], t["max_ms"], t["errors"], t["mean_bytes"]])
    return rows


def server_cpu_ms_per_request(result: PhaseResult) -> float:
    count = len(result.total().latencies)
    if result.server_cpu_seconds is None or not count:
        return float("nan")
    return 1000 * result.server_cpu_seconds / count


def cpu_line(server: str, result: PhaseResult) -> str:
    client = 100 * result.client_cpu_seconds / result.wall_seconds
    count = max(1, len(result.total().latencies))
    if result.server_cpu_seconds is None:
        server_cpu = "n/a"
    else:
        server_cpu = (
            f"{100 * result.server_cpu_seconds / result.wall_seconds:.0f}% ({server_cpu_ms_per_request(result):.2f} ms CPU per request)"
        )
    return (
        f"  {server}: load generator {client:.0f}% of one core ({1000 * result.client_cpu_seconds / count:.2f} ms CPU per request), "
        f"server process {server_cpu}, wall {result.wall_seconds:.1f} s"
    )


def print_report(base: PhaseResult, neko: PhaseResult) -> None:
    headers = ["server", "route", "count", "req/s", "p50 ms", "p99 ms", "max ms", "errors", "avg bytes"]
    print_table(headers, report_rows("baseline", base) + report_rows("nekomem", neko))
    print("cpu (100% = one core; this machine's cores are shared by both sides):")
    print(cpu_line("baseline", base))
    print(cpu_line("nekomem", neko))
    print("ratios nekomem / baseline:")
    rows = []
    for label in (WRITE, READ, "all"):
        b = base.total() if label == "all" else base.routes.get(label)
        n = neko.total() if label == "all" else neko.routes.get(label)
        if b is None or n is None:
            continue
        bs, ns = b.summary(base.wall_seconds), n.summary(neko.wall_seconds)
        rows.append([label, ratio(ns["rps"], bs["rps"]), ratio(ns["p50_ms"], bs["p50_ms"]), ratio(ns["p99_ms"], bs["p99_ms"])])
    print_table(["route", "throughput", "p50", "p99"], rows)
    print(f"server CPU per request: {ratio(server_cpu_ms_per_request(neko), server_cpu_ms_per_request(base)):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    smoke_option(parser, argv, characters=3, clients=2, seconds=1.0, warmup=0.2, max_requests=200)
    args = parser.parse_args(argv)
    if args.characters < 1 or args.clients < 1 or args.seconds <= 0 or args.rounds < 1:
        print("http_load: --characters, --clients and --rounds must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    mix = f"{args.read_every - 1} writes : 1 read" if args.read_every > 0 else "writes only"
    print(
        f"http_load: {args.characters} characters, {args.clients} clients, {args.seconds:g} s measured "
        f"(+{args.warmup:g} s warm-up) per server and round, {args.rounds} round(s), {mix}, loopback only; "
        f"cores={os.cpu_count()}, loadavg(1m) at start={os.getloadavg()[0]:.2f}"
    )
    run_started = time.monotonic()
    rounds: list[tuple[PhaseResult, PhaseResult]] = []
    baseline = UvicornProcess("bench._baseline_app:app")
    with tempfile.TemporaryDirectory(prefix="nekomem-bench-") as root:
        server, stderr = start_nekomem(Path(root))
        try:
            baseline.start("/health")
            assert baseline.proc is not None and server.proc is not None
            state = wait_embeddings_settled(server.url)
            health = httpx.get(server.url + "/health", timeout=5).json()
            print(f"nekomem: llm available={health['llm']['available']}, embeddings={state}")
            for number in range(1, args.rounds + 1):
                # Alternating rounds: a change in the machine's load reaches both sides.
                names = character_names(args.characters, number)
                seconds = asyncio.run(activate(server.url, names))
                print(f"nekomem: activated {len(names)} characters in {seconds:.2f} s (round {number})")
                base = asyncio.run(measure(baseline.url, args, names, baseline.proc.pid))
                neko = asyncio.run(measure(server.url, args, names, server.proc.pid))
                rounds.append((base, neko))
        except Exception:
            print("nekomem stderr tail:\n" + stderr.text(), file=sys.stderr)
            raise
        finally:
            server.stop()
            baseline.stop()

    for number, (base, neko) in enumerate(rounds, 1):
        print()
        if len(rounds) > 1:
            print(f"round {number} of {len(rounds)}:")
        print_report(base, neko)
    if len(rounds) > 1:
        print_medians(rounds)
    print(f"total run time {time.monotonic() - run_started:.1f} s")
    return 0


def print_medians(rounds: list[tuple[PhaseResult, PhaseResult]]) -> None:
    """The median over rounds of the throughput and server-CPU ratios (whole mix)."""
    throughput = [ratio(n.total().summary(n.wall_seconds)["rps"], b.total().summary(b.wall_seconds)["rps"]) for b, n in rounds]
    cpu = [ratio(server_cpu_ms_per_request(n), server_cpu_ms_per_request(b)) for b, n in rounds]
    print()
    print(f"rounds: throughput ratios {', '.join(f'{r:.2f}' for r in throughput)}; median {statistics.median(throughput):.2f}")
    print(f"rounds: server CPU per request ratios {', '.join(f'{r:.2f}' for r in cpu)}; median {statistics.median(cpu):.2f}")


if __name__ == "__main__":
    sys.exit(main())
