"""Chaos: steady load over 20 characters while the model fails 30% of calls, answers
garbage 30% and takes 5 s each, against the same load with a healthy (fast, valid) model.

Prints per route p50/p99 (chaos vs healthy and the ratio), model calls per character per
minute, and every 5xx. Loopback only, bounded in time (two phases of ``--seconds``).
Usage: ``python -m bench.chaos [--seconds 60] [--characters 20] [--clients 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import print_table, ratio, run_load, start_nekomem, turn_pair
from nekomem.config import load_settings
from tests.support.fake_llm import DEFAULT_HANDLERS, FakeLLM, Reply

ROUTES = ("cache", "new_dialog", "query_memory", "recent")
# Schedules shortened (same in both phases) so that a one-minute phase reaches the
# background model work: batch extraction and reflection synthesis, besides compression.
SCHEDULES = {
    "NEKOMEM_FACT_EXTRACT_IDLE_SECONDS": "5",
    "NEKOMEM_FACT_EXTRACT_INTERVAL_MINUTES": "0.1666667",
    "NEKOMEM_REFLECTION_SYNTHESIS_INITIAL_DELAY_SECONDS": "20",
    "NEKOMEM_REFLECTION_SYNTHESIS_INTERVAL_SECONDS": "30",
    "NEKOMEM_LONGTERM_IDLE_MAINTENANCE_INITIAL_DELAY_SECONDS": "10",
}


def plan_for(names: list[str]):  # type: ignore[no-untyped-def]
    def plan(index: int, number: int) -> tuple[str, str, str, Any]:
        name = names[(index * 7 + number) % len(names)]
        kind = ROUTES[number % len(ROUTES)]
        if kind == "cache":
            return "cache", "POST", f"/cache/{name}", turn_pair(f"turn {number} of client {index}: I had tea", "nice")
        if kind == "new_dialog":
            return "new_dialog", "GET", f"/new_dialog/{name}", None
        if kind == "query_memory":
            return "query_memory", "POST", f"/query_memory/{name}", {"query": "tea"}
        return "recent", "GET", f"/get_recent_history/{name}", None

    return plan


def chaotic(fake: FakeLLM, seed: int, delay: float) -> None:
    rng = random.Random(seed)

    def handler_for(task: str):  # type: ignore[no-untyped-def]
        def handle(request: dict[str, Any]) -> Any:
            roll = rng.random()
            if roll < 0.3:
                return Reply.status(500, "model exploded")
            if roll < 0.6:
                return Reply.text("}{ not json at all " + "x" * rng.randint(0, 200))
            return DEFAULT_HANDLERS[task](request)

        return handle

    for task in DEFAULT_HANDLERS:
        fake.on(task, handler_for(task))
    fake.set_delay(None, delay)


async def phase(url: str, names: list[str], args: argparse.Namespace, pid: int) -> Any:
    return await run_load(
        url,
        plan_for(names),
        clients=args.clients,
        seconds=args.seconds,
        max_requests=10**7,
        pause_seconds=args.pause,
        request_timeout=60.0,
        server_pid=pid,
    )


def run(kind: str, args: argparse.Namespace, names: list[str]) -> tuple[Any, float, dict[str, int]]:
    with FakeLLM() as fake, tempfile.TemporaryDirectory(prefix=f"nekomem-chaos-{kind}-") as tmp:
        if kind == "chaos":
            chaotic(fake, args.seed, args.delay)
        env = {"NEKOMEM_LLM_BASE_URL": fake.base_url, "NEKOMEM_LLM_MODEL": "fake", **SCHEDULES}
        server, log = start_nekomem(Path(tmp), env=env)
        try:
            assert server.proc is not None
            started = time.monotonic()
            result = asyncio.run(phase(server.url, names, args, server.proc.pid))
            minutes = (time.monotonic() - started) / 60
            calls = fake.calls()
            per_task: dict[str, float] = {}
            for call in calls:
                task = call.get("task", "?")
                per_task[task] = per_task.get(task, 0) + 1
            scale = 1 / len(names) / minutes
            return result, len(calls) * scale, {t: round(n * scale, 2) for t, n in per_task.items()}
        except Exception:
            print(log.text(), file=sys.stderr)
            raise
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--characters", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pause", type=float, default=0.05)
    parser.add_argument("--delay", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    names = [f"chaos{i:02d}" for i in range(args.characters)]
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"chaos: {args.characters} characters, {args.clients} clients, {args.seconds:g} s per phase; "
        f"chaos model: 30% 500, 30% garbage, {args.delay:g} s each; cores={os.cpu_count()}, loadavg={load1:.2f}"
    )
    print("schedules (both phases): " + ", ".join(f"{k.removeprefix('NEKOMEM_').lower()}={v}" for k, v in SCHEDULES.items()))
    healthy, healthy_rate, healthy_tasks = run("healthy", args, names)
    chaos, chaos_rate, per_task = run("chaos", args, names)
    rows = []
    fivexx = 0
    fivexx_only = 0
    for route in ROUTES:
        h = healthy.routes.get(route)
        c = chaos.routes.get(route)
        if h is None or c is None:
            continue
        hs, cs = h.summary(healthy.wall_seconds), c.summary(chaos.wall_seconds)
        rows.append(
            [
                route,
                hs["count"],
                cs["count"],
                f"{hs['p50_ms']:.1f}",
                f"{cs['p50_ms']:.1f}",
                f"{hs['p99_ms']:.1f}",
                f"{cs['p99_ms']:.1f}",
                f"{ratio(cs['p99_ms'], hs['p99_ms']):.2f}",
                hs["errors"],
                cs["errors"],
            ]
        )
        fivexx += cs["errors"] + hs["errors"]
        fivexx_only += h.server_errors + c.server_errors
    print_table(
        [
            "route",
            "n healthy",
            "n chaos",
            "p50 healthy ms",
            "p50 chaos ms",
            "p99 healthy ms",
            "p99 chaos ms",
            "p99 ratio",
            "errors healthy",
            "errors chaos",
        ],
        rows,
    )
    print(f"model calls per character per minute: healthy {healthy_rate:.2f}, chaos {chaos_rate:.2f}")
    print(f"healthy model calls per character per minute by task: {dict(sorted(healthy_tasks.items()))}")
    print(f"chaos model calls per character per minute by task: {dict(sorted(per_task.items()))}")
    defaults = load_settings(None, env=SCHEDULES)
    attempts = 1 + defaults.llm.llm_max_retries
    interval = defaults.longterm.fact_extract_interval_minutes * 60
    bound = 60 / interval * attempts
    print(
        f"schedule bound for extract_facts: {bound:.1f} calls per character per minute "
        f"(one batch per {interval:g} s interval x {attempts} attempts)"
    )
    print(f"non-2xx answers (both phases): {fivexx}; 5xx: {fivexx_only}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
