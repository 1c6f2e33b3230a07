"""What one acknowledged ``/cache`` turn costs the server, beside a bare Starlette route on
the same uvicorn, in one run: server CPU per turn, and the futex calls per turn (thread
hand-offs: the event loop waking an actor worker, the worker waking the loop, threads
waiting for the interpreter lock), counted with ``strace -c -f -e trace=futex``.

    python -m bench.turn_cost [--clients 16] [--characters 32] [--seconds 8] [--rounds 3] [--strace-seconds 4]

Three servers run as processes of their own: the bare route (``bench/_baseline_app.py``:
the same path, parsing the same JSON, storing nothing), the durable floor (the same route
that also writes the body and ``fdatasync``s it on a worker thread before answering: one
flush and one hand-off each way, what any acknowledged durable turn costs at least) and
nekomem (``python -m nekomem serve``, temp memory root, no LLM, embeddings off, default
settings). Every character is warmed first. The load: ``--clients`` keep-alive connections, each posting one turn at a
time to a random character (the load generator of bench/cluster.py, on uvloop). Each round
measures the baseline then nekomem for ``--seconds``; the CPU per turn is the server
process's user + system CPU over the phase divided by the turns acknowledged, and the
ratios (nekomem against the bare route, the issue's measure, and against the durable
floor) are the medians over the rounds. Then, when strace is installed (apt-get install
strace), each server is traced for ``--strace-seconds`` under the same load (traced, it is
slower: the count per turn is what matters) and the futex calls per turn are printed.
The last line reads ``/cache: X.XXx the bare route's CPU per turn; F futex calls per turn``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench._common import UvicornProcess, smoke_option, start_nekomem
from bench.cluster import cpu_seconds, load, run

STRACE = shutil.which("strace")


def warm(url: str, names: list[str]) -> None:
    with httpx.Client(base_url=url, timeout=60) as client:
        for name in names:
            r = client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": "warm"}]})
            if r.status_code != 200:
                raise SystemExit(f"warm-up of {name} failed: {r.status_code} {r.text[:200]}")


def phase(url: str, pid: int, names: list[str], clients: int, seconds: float) -> tuple[int, float]:
    """(turns acknowledged, server CPU seconds) over one load phase."""
    before = cpu_seconds(pid)
    count, _, errors = run(load(url, names, clients, seconds))
    used = cpu_seconds(pid) - before
    if errors:
        print(f"    ({errors} error answers)", flush=True)
    return count, used


_FUTEX = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)(?:\s+\d+)?\s+futex\s*$", re.M)


def futex_per_turn(url: str, pid: int, names: list[str], clients: int, seconds: float) -> float | None:
    """Futex calls per acknowledged turn, every thread of ``pid`` traced with strace over
    one load phase; None when strace cannot attach (not installed, or ptrace refused)."""
    if STRACE is None:
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen([STRACE, "-c", "-f", "-e", "trace=futex", "-o", out.name, "-p", str(pid)], stderr=subprocess.PIPE)
        time.sleep(0.5)  # strace attaches every thread before the load starts
        if tracer.poll() is not None:
            print(f"    strace could not attach: {tracer.stderr.read().decode()[-300:] if tracer.stderr else ''}", flush=True)
            return None
        count, _, _ = run(load(url, names, clients, seconds))
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
        match = _FUTEX.search(Path(out.name).read_text())
    calls = int(match.group(1)) if match else 0
    return calls / max(count, 1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--characters", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per server and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--actor-workers", type=int, default=0, help="nekomem's actor_workers (0: the setting's default)")
    parser.add_argument("--strace-seconds", type=float, default=4.0, help="traced seconds per server (0: no futex count)")
    smoke_option(parser, None, clients=4, characters=4, seconds=1.0, rounds=1, strace_seconds=1.0)
    args = parser.parse_args()
    names = [f"turn{i:03d}" for i in range(args.characters)]
    baseline = UvicornProcess("bench._baseline_app:app")
    baseline.start("/health")
    floor = UvicornProcess("bench._baseline_app:durable_app")
    floor.start("/health")
    with tempfile.TemporaryDirectory(prefix="nekomem-turn-cost-") as tmp:
        env = {"NEKOMEM_EMBEDDING_ENABLED": "false"}
        if args.actor_workers:
            env["NEKOMEM_ACTOR_WORKERS"] = str(args.actor_workers)
        server, _ = start_nekomem(Path(tmp) / "memory", env=env)
        try:
            assert baseline.proc is not None and floor.proc is not None and server.proc is not None
            targets = {
                "bare route": (baseline.url, baseline.proc.pid),
                "bare+fsync": (floor.url, floor.proc.pid),
                "nekomem": (server.url, server.proc.pid),
            }
            for url, _ in targets.values():
                warm(url, names)
                run(load(url, names, args.clients, min(2.0, args.seconds)))  # connections and caches warm
            per_turn: dict[str, list[float]] = {k: [] for k in targets}
            for round_ in range(1, args.rounds + 1):
                for what, (url, pid) in targets.items():
                    count, used = phase(url, pid, names, args.clients, args.seconds)
                    per_turn[what].append(used / max(count, 1))
                    print(
                        f"round {round_}: {what:>10}: {count / args.seconds:7.1f} turns/s, server CPU {used / max(count, 1) * 1000:.3f} ms per turn",
                        flush=True,
                    )
            futex: dict[str, float | None] = {}
            if args.strace_seconds > 0:
                for what, (url, pid) in targets.items():
                    futex[what] = futex_per_turn(url, pid, names, args.clients, args.strace_seconds)
        finally:
            server.stop()
            floor.stop()
            baseline.stop()
    ratios = [n / b for b, n in zip(per_turn["bare route"], per_turn["nekomem"], strict=True) if b > 0]
    floor_ratios = [n / f for f, n in zip(per_turn["bare+fsync"], per_turn["nekomem"], strict=True) if f > 0]
    floor_share = [f / b for b, f in zip(per_turn["bare route"], per_turn["bare+fsync"], strict=True) if b > 0]
    for what, values in per_turn.items():
        count = futex.get(what)
        calls = f", {count:.1f} futex calls per turn" if count is not None else ""
        print(f"{what:>10}: server CPU {statistics.median(values) * 1000:.3f} ms per turn (median of {len(values)}){calls}")
    if STRACE is None:
        print("(strace is not installed: no futex count; apt-get install strace)")
    count = futex.get("nekomem")
    tail = f"; {count:.1f} futex calls per turn" if count is not None else ""
    print(f"durable floor: {statistics.median(floor_share):.2f}x the bare route's CPU per turn")
    print(f"nekomem: {statistics.median(floor_ratios):.2f}x the durable floor's CPU per turn")
    print(f"/cache: {statistics.median(ratios):.2f}x the bare route's CPU per turn{tail}")


if __name__ == "__main__":
    main()
