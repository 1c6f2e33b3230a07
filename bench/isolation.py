"""Per-character isolation: while one character's LLM calls take 5 s each, /cache for the
other characters keeps its latency.

    python -m bench.isolation [--others 10] [--clients 8] [--seconds 15] [--delay 5]

A FakeLLM (tests/support/fake_llm.py, a real loopback server) answers ``summarize_recent``
only after ``--delay`` seconds; ``python -m nekomem serve`` runs in its own process with
NEKOMEM_LLM_BASE_URL pointing at it.

* Phase A (baseline): ``--clients`` clients post one-turn ``/cache`` requests round-robin
  over ``--others`` characters, pausing ``--pause`` s after each, for ``--seconds``.
* Phase B: ``--slow-clients`` clients keep posting ``--batch``-turn batches to
  ``/process/slow`` (each batch starts a compression, which waits for the slow summary
  model; the answer does not wait for it); once the fake has seen the first summary request, the same /cache
  measurement as in phase A runs for the other characters.

Prints p50/p99/max of /cache in both phases, the ratios B/A, and how many
``summarize_recent`` calls the fake saw (all of them carry the slow character's turns).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench._common import (
    PhaseResult,
    Plan,
    RouteStats,
    gather_limited,
    make_client,
    percentile,
    print_table,
    ratio,
    run_load,
    smoke_option,
    start_nekomem,
    turn_pair,
    wait_embeddings_settled,
)
from tests.support.fake_llm import FakeLLM, prompt_text

CACHE = "POST /cache/{other}"
SLOW_NAME = "slow"
SLOW_MARKER = "slowbatch"
SUMMARY_TASK = "summarize_recent"
SLOW_REQUEST_TIMEOUT_SECONDS = 120.0
FIRST_SUMMARY_TIMEOUT_SECONDS = 30.0
WARM_CONCURRENCY = 4
STALL_MS = 1000.0  # a /cache slower than this would mean it waited behind the slow model


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--others", type=int, default=10, help="characters whose /cache latency is measured (default 10)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent /cache clients (default 8)")
    parser.add_argument("--slow-clients", type=int, default=2, help="clients posting batches to /process/slow (default 2)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per phase (default 15)")
    parser.add_argument("--pause", type=float, default=0.25, help="pause of a /cache client after each request (default 0.25 s)")
    parser.add_argument("--max-requests", type=int, default=5_000, help="request cap per phase (default 5000)")
    parser.add_argument("--delay", type=float, default=5.0, help="seconds the fake summary model takes per call (default 5)")
    parser.add_argument("--batch", type=int, default=25, help="turns per /process/slow batch (default 25)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unrecorded /cache load before phase A (default 2 s)")
    return parser


def other_names(count: int) -> list[str]:
    return [f"other-{i:02d}" for i in range(count)]


def cache_plan(names: list[str]) -> Plan:
    def plan(client: int, number: int) -> tuple[str, str, str, Any]:
        name = names[(client + number) % len(names)]
        body = {
            "input_history": [
                {"role": "user" if number % 2 == 0 else "assistant", "content": f"client {client} turn {number}: a quiet day at home"}
            ]
        }
        return CACHE, "POST", f"/cache/{name}", body

    return plan


def slow_batch(client: int, round_no: int, size: int) -> dict[str, Any]:
    history = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{SLOW_MARKER} c{client} r{round_no} t{i}: we talked about the weather and the trip to the sea",
        }
        for i in range(size)
    ]
    return {"input_history": history}


async def keep_slow_busy(url: str, client: int, batch: int, stop: asyncio.Event, stats: RouteStats) -> None:
    """Post batches to /process/slow until ``stop`` is set; latencies go to ``stats``."""
    async with make_client(url, SLOW_REQUEST_TIMEOUT_SECONDS) as http:
        round_no = 0
        while not stop.is_set():
            started = time.perf_counter()
            try:
                response = await http.post(f"/process/{SLOW_NAME}", json=slow_batch(client, round_no, batch))
            except httpx.HTTPError:
                stats.errors += 1
                continue
            round_no += 1
            if response.is_success:
                stats.latencies.append(time.perf_counter() - started)
            else:
                stats.errors += 1


async def warm(url: str, names: list[str], args: argparse.Namespace) -> None:
    """Activate every character (one /cache each) and run a short unrecorded load."""
    async with make_client(url, 60.0, WARM_CONCURRENCY) as http:

        async def one(name: str) -> None:
            (await http.post(f"/cache/{name}", json=turn_pair("hello", "hello, master"))).raise_for_status()

        await gather_limited([lambda n=n: one(n) for n in [*names, SLOW_NAME]], WARM_CONCURRENCY)
    if args.warmup > 0:
        await run_load(
            url,
            cache_plan(names),
            clients=args.clients,
            seconds=args.warmup,
            max_requests=args.max_requests,
            pause_seconds=args.pause,
            record=False,
        )


def summary_calls(fake: FakeLLM) -> tuple[int, int]:
    """(all summarize_recent calls, those whose prompt carries the slow character's turns)."""
    calls = fake.calls(SUMMARY_TASK)
    return len(calls), sum(1 for c in calls if SLOW_MARKER in prompt_text(c["body"]))


async def run_phases(url: str, names: list[str], args: argparse.Namespace, fake: FakeLLM, pid: int) -> dict[str, Any]:
    await warm(url, names, args)
    plan = cache_plan(names)
    load = dict(clients=args.clients, seconds=args.seconds, max_requests=args.max_requests, pause_seconds=args.pause, server_pid=pid)
    phase_a = await run_load(url, plan, **load)

    stop = asyncio.Event()
    slow_stats = RouteStats()
    slow_tasks = [asyncio.create_task(keep_slow_busy(url, c, args.batch, stop, slow_stats)) for c in range(args.slow_clients)]
    try:
        seen = await asyncio.to_thread(fake.wait_for_calls, 1, SUMMARY_TASK, FIRST_SUMMARY_TIMEOUT_SECONDS)
        if not seen:
            raise RuntimeError("the fake never saw a summarize_recent call: the slow path is not exercised")
        calls_before = summary_calls(fake)
        phase_b = await run_load(url, plan, **load)
        calls_after = summary_calls(fake)
    finally:
        stop.set()
        for task in slow_tasks:
            task.cancel()
        await asyncio.gather(*slow_tasks, return_exceptions=True)
    return {"a": phase_a, "b": phase_b, "slow": slow_stats, "calls_before": calls_before, "calls_after": calls_after}


def phase_row(label: str, result: PhaseResult) -> list[Any]:
    stats = result.routes.get(CACHE, RouteStats())
    s = stats.summary(result.wall_seconds)
    stalls = sum(1 for v in stats.latencies if v * 1000 > STALL_MS)
    cpu = "n/a" if result.server_cpu_seconds is None else f"{100 * result.server_cpu_seconds / result.wall_seconds:.0f}%"
    return [label, s["count"], s["rps"], s["p50_ms"], s["p99_ms"], s["max_ms"], stalls, s["errors"], cpu]


def read_compressions(root: Path) -> int | None:
    try:
        return int(json.loads((root / SLOW_NAME / "recent_meta.json").read_text(encoding="utf-8")).get("compressions", 0))
    except (OSError, ValueError, AttributeError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    smoke_option(parser, argv, others=2, clients=2, slow_clients=1, seconds=1.0, max_requests=200, delay=0.3, batch=3, warmup=0.2)
    args = parser.parse_args(argv)
    names = other_names(args.others)
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"isolation: {args.others} other characters, {args.clients} /cache clients (pause {args.pause:g} s), "
        f"{args.seconds:g} s per phase; slow character: {args.slow_clients} clients x {args.batch}-turn /process batches, "
        f"summarize_recent takes {args.delay:g} s; cores={os.cpu_count()}, loadavg(1m) at start={load1:.2f}"
    )
    started = time.monotonic()
    with FakeLLM() as fake, tempfile.TemporaryDirectory(prefix="nekomem-isolation-") as tmp:
        fake.set_delay(SUMMARY_TASK, args.delay)
        root = Path(tmp)
        env = {"NEKOMEM_LLM_BASE_URL": fake.base_url, "NEKOMEM_LLM_MODEL": "fake"}
        server, stderr = start_nekomem(root, env=env)
        try:
            state = wait_embeddings_settled(server.url)
            health = httpx.get(server.url + "/health", timeout=5).json()
            print(f"nekomem: llm available={health['llm']['available']}, embeddings={state}")
            if not health["llm"]["available"]:
                raise RuntimeError("nekomem did not pick up the fake LLM")
            assert server.proc is not None
            out = asyncio.run(run_phases(server.url, names, args, fake, server.proc.pid))
        except Exception:
            print("nekomem stderr tail:\n" + stderr.text(), file=sys.stderr)
            raise
        finally:
            server.stop()
        compressions = read_compressions(root)
        total_calls, slow_calls = summary_calls(fake)

    a, b = out["a"], out["b"]
    print()
    print_table(
        ["phase", "count", "req/s", "p50 ms", "p99 ms", "max ms", f">{STALL_MS:.0f}ms", "errors", "server cpu"],
        [phase_row("A (alone)", a), phase_row("B (slow busy)", b)],
    )
    sa, sb = a.routes[CACHE].summary(a.wall_seconds), b.routes[CACHE].summary(b.wall_seconds)
    print(f"ratio B/A: p50 {ratio(sb['p50_ms'], sa['p50_ms']):.2f}, p99 {ratio(sb['p99_ms'], sa['p99_ms']):.2f}")
    slow = sorted(out["slow"].latencies)
    during = out["calls_after"][0] - out["calls_before"][0]
    print(
        f"summarize_recent calls seen by the fake: {total_calls} in all, {slow_calls} carrying the slow character's turns, "
        f"{during} started during phase B's measurement"
    )
    print(
        f"/process/{SLOW_NAME}: {len(slow)} answered (p50 {percentile(slow, 50):.2f} s, max {percentile(slow, 100):.2f} s), "
        f"{out['slow'].errors} errors; compressions recorded on disk: {compressions}"
    )
    print(f"total run time {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
