"""Shared pieces of the HTTP benchmarks: server processes, a paced asyncio load loop,
latency statistics and table printing.

Everything binds and connects to 127.0.0.1 only. Servers run as separate processes so that
the load generator does not share their GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nekomem.config.settings import field_index
from tests.support.live import ROOT, ServerProcess, free_port

LOOPBACK = "127.0.0.1"
# The benches want the same uvicorn log level on both servers, and a quiet stderr pipe.
BENCH_LOG_LEVEL = "warning"
STDERR_TAIL_LINES = 200
READY_POLL_SECONDS = 0.05


SMOKE_HELP = "the smallest run that reaches the last line (make test runs every bench so; explicit flags still win)"


def smoke_option(parser: argparse.ArgumentParser, argv: Sequence[str] | None, **smallest: Any) -> bool:
    """Add ``--smoke`` to ``parser``: when it is on the command line (``argv``, else
    ``sys.argv``), ``smallest`` become the defaults. Returns whether it is."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    given = sys.argv[1:] if argv is None else list(argv)
    if "--smoke" not in given:
        return False
    parser.set_defaults(**smallest)
    return True


# --- statistics -------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of an ascending sequence; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


@dataclass
class RouteStats:
    """Latencies (seconds) and error count of one route during one measured phase."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    response_bytes: int = 0
    server_errors: int = 0  # the 5xx among ``errors``

    def summary(self, wall_seconds: float) -> dict[str, float]:
        values = sorted(self.latencies)
        count = len(values)
        return {
            "count": count,
            "errors": self.errors,
            "rps": count / wall_seconds if wall_seconds > 0 else float("nan"),
            "p50_ms": percentile(values, 50) * 1000,
            "p99_ms": percentile(values, 99) * 1000,
            "max_ms": (values[-1] * 1000) if values else float("nan"),
            "mean_bytes": self.response_bytes / count if count else 0.0,
        }


@dataclass
class PhaseResult:
    """What one load phase measured, per route label, plus CPU use of both sides."""

    routes: dict[str, RouteStats]
    wall_seconds: float
    client_cpu_seconds: float
    server_cpu_seconds: float | None

    def total(self) -> RouteStats:
        merged = RouteStats()
        for stats in self.routes.values():
            merged.latencies.extend(stats.latencies)
            merged.errors += stats.errors
            merged.response_bytes += stats.response_bytes
        return merged


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a plain left/right aligned text table (text columns left, numbers right)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) if rows else False for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if numeric[i] else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=False)))

    print(line(headers))
    for row in cells:
        print(line(row))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


# --- CPU accounting ---------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads), from /proc; None
    where /proc is not available."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[0] is the state (field 3 of stat); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / ticks


# --- servers ----------------------------------------------------------------------------------


class _LogTail:
    """The last lines of a server's log file (ServerProcess writes its stderr to a file,
    so a chatty child never blocks on a full pipe)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def text(self) -> str:
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-STDERR_TAIL_LINES:])


# NEKOMEM_* variables that are not settings but are read by the command line.
_NON_SETTING_VARIABLES = {"NEKOMEM_CONFIG", "NEKOMEM_URL"}


def check_setting_variables(env: Mapping[str, str]) -> None:
    """Raise ValueError naming every ``NEKOMEM_*`` variable of ``env`` that is no setting: a
    bench that sets a renamed or removed setting fails instead of measuring the default."""
    known = {f"NEKOMEM_{name.upper()}" for name in field_index()} | _NON_SETTING_VARIABLES
    unknown = sorted(k for k in env if k.startswith("NEKOMEM_") and k not in known)
    if unknown:
        raise ValueError(f"no such setting: {', '.join(unknown)} (see docs/CONFIGURATION.md)")


def start_nekomem(memory_root: Path, env: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[ServerProcess, _LogTail]:
    """``python -m nekomem serve`` on a free loopback port with a quiet log level; waits
    until start-up recovery is over. Returns the process and its log tail. Raises
    ValueError when ``env`` names a ``NEKOMEM_*`` variable that is no setting."""
    check_setting_variables(env or {})
    values = {"NEKOMEM_LOG_LEVEL": BENCH_LOG_LEVEL.upper(), "NEKOMEM_HOST": LOOPBACK}
    values.update(env or {})
    server = ServerProcess(memory_root, env=values)
    server.start(timeout=timeout)
    return server, _LogTail(server.log_path)


def wait_embeddings_settled(url: str, timeout: float = 60.0) -> str:
    """Wait until /health no longer reports the embedding model as loading (its load burns
    CPU that would otherwise land inside a measurement). Returns the final state."""
    deadline = time.monotonic() + timeout
    state = "unknown"
    while time.monotonic() < deadline:
        try:
            state = httpx.get(url + "/health", timeout=2).json()["embeddings"]["state"]
        except (httpx.HTTPError, ValueError, KeyError):
            state = "unknown"
        if state not in ("loading", "unknown"):
            return state
        time.sleep(READY_POLL_SECONDS * 4)
    return state


class UvicornProcess:
    """``python -m uvicorn <app>`` on a free loopback port, as a child process."""

    def __init__(self, app: str, port: int | None = None) -> None:
        self.app = app
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: _LogTail | None = None

    def start(self, ready_path: str, timeout: float = 30.0) -> None:
        """Start and wait until GET ``ready_path`` answers 200. Raises RuntimeError."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
        log_path = Path(tempfile.gettempdir()) / f"nekomem-bench-baseline-{self.port}.log"
        log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                self.app,
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--log-level",
                BENCH_LOG_LEVEL,
                "--no-access-log",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        self.stderr = _LogTail(log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("uvicorn exited:\n" + self.stderr.text())
            try:
                if httpx.get(self.url + ready_path, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(READY_POLL_SECONDS)
        raise RuntimeError("uvicorn did not become ready")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --- load generation --------------------------------------------------------------------------

# A request plan: client index and that client's request number -> (route label, method,
# path, JSON body or None).
Plan = Callable[[int, int], tuple[str, str, str, Any]]


def turn_pair(user_text: str, ai_text: str) -> dict[str, Any]:
    """A /cache body with one user and one assistant message (OpenAI shape)."""
    return {"input_history": [{"role": "user", "content": user_text}, {"role": "assistant", "content": ai_text}]}


def make_client(base_url: str, timeout: float, connections: int = 1) -> httpx.AsyncClient:
    """An AsyncClient with keep-alive connections to ``base_url``."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits)


async def timed_request(client: httpx.AsyncClient, method: str, path: str, body: Any, stats: RouteStats) -> httpx.Response | None:
    """Send one request and record its latency (successes only) or an error in ``stats``."""
    started = time.perf_counter()
    try:
        response = await client.request(method, path, json=body)
    except httpx.HTTPError:
        stats.errors += 1
        return None
    elapsed = time.perf_counter() - started
    if response.is_success:
        stats.latencies.append(elapsed)
        stats.response_bytes += len(response.content)
    else:
        stats.errors += 1
        if response.status_code >= 500:
            stats.server_errors += 1
    return response


async def run_load(
    base_url: str,
    plan: Plan,
    *,
    clients: int,
    seconds: float,
    max_requests: int,
    pause_seconds: float = 0.0,
    request_timeout: float = 30.0,
    server_pid: int | None = None,
    record: bool = True,
    pool: Sequence[httpx.AsyncClient] | None = None,
) -> PhaseResult:
    """Run ``clients`` concurrent request loops (one keep-alive connection each) until
    ``seconds`` have passed or ``max_requests`` were sent in total, whichever comes first.
    A request in flight at the deadline is allowed to finish (bounded by
    ``request_timeout``). ``pause_seconds`` is slept after each request of a client.

    ``pool``: one client per loop, made by :func:`client_pool` and kept open by the caller
    (a warm-up and the measurement then share their connections). Without it the clients
    are made here, before the clock and the CPU counters start: building an httpx client
    costs ~40 ms of CPU (its TLS context loads the CA bundle), which would otherwise be
    charged to the requests of whichever server was measured."""
    if pool is not None:
        if len(pool) < clients:
            raise ValueError(f"a pool of {len(pool)} clients for {clients} loops")
        return await _run_loops(plan, pool[:clients], seconds, max_requests, pause_seconds, request_timeout, server_pid, record)
    async with contextlib.AsyncExitStack() as stack:
        made = [await stack.enter_async_context(make_client(base_url, request_timeout)) for _ in range(clients)]
        return await _run_loops(plan, made, seconds, max_requests, pause_seconds, request_timeout, server_pid, record)


@contextlib.asynccontextmanager
async def client_pool(base_url: str, count: int, request_timeout: float = 30.0) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``count`` keep-alive clients of ``base_url`` for :func:`run_load`'s ``pool``."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(make_client(base_url, request_timeout)) for _ in range(count)]


async def _run_loops(
    plan: Plan,
    pool: Sequence[httpx.AsyncClient],
    seconds: float,
    max_requests: int,
    pause_seconds: float,
    request_timeout: float,
    server_pid: int | None,
    record: bool,
) -> PhaseResult:
    routes: dict[str, RouteStats] = collections.defaultdict(RouteStats)
    sent = 0
    deadline = time.monotonic() + seconds
    cpu_client0 = time.process_time()
    cpu_server0 = process_cpu_seconds(server_pid) if server_pid else None

    async def worker(index: int, client: httpx.AsyncClient) -> None:
        nonlocal sent
        number = 0
        while time.monotonic() < deadline and sent < max_requests:
            sent += 1
            label, method, path, body = plan(index, number)
            number += 1
            await timed_request(client, method, path, body, routes[label] if record else RouteStats())
            if pause_seconds:
                await asyncio.sleep(pause_seconds)

    started = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker(i, c) for i, c in enumerate(pool))), timeout=seconds + request_timeout + 5)
    wall = time.perf_counter() - started
    cpu_server1 = process_cpu_seconds(server_pid) if server_pid else None
    server_cpu = None if cpu_server0 is None or cpu_server1 is None else cpu_server1 - cpu_server0
    return PhaseResult(dict(routes), wall, time.process_time() - cpu_client0, server_cpu)


async def gather_limited(coros: Sequence[Callable[[], Awaitable[Any]]], concurrency: int) -> list[Any]:
    """Run the coroutine factories with at most ``concurrency`` at once; returns results."""
    gate = asyncio.Semaphore(concurrency)

    async def one(factory: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await factory()

    return await asyncio.gather(*(one(f) for f in coros))
