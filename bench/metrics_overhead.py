"""CPU cost of the /metrics request middleware per request, in process.

    python -m bench.metrics_overhead [--requests 20000] [--rounds 5]

Drives a Starlette router with one route (``/cache/{name}``, a trivial handler) through
ASGI calls on one event loop, without a socket: once bare and once wrapped in
:class:`nekomem.http.metrics_middleware.RequestMetrics`, in alternating rounds. Prints the CPU time per request of both and the difference, which is
what the middleware adds to every request (compare it with the server CPU per request of
``bench.http_load``, a few milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from starlette.responses import PlainTextResponse
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Message

from bench._common import smoke_option
from nekomem.http.metrics import REQUEST_BUCKETS
from nekomem.http.metrics_middleware import RequestMetrics, RequestStats, RouteLabels


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests per round and app (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    return parser


async def handler(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


def apps() -> tuple[ASGIApp, ASGIApp]:
    router = Router(routes=[Route("/cache/{name:str}", handler, methods=["POST"])])
    return router, RequestMetrics(router, RequestStats(REQUEST_BUCKETS), RouteLabels(lambda: router.routes))


async def drive(app: ASGIApp, count: int) -> float:
    """CPU seconds for ``count`` requests through ``app``."""

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        return None

    started = time.process_time()
    for i in range(count):
        scope = {
            "type": "http",
            "method": "POST",
            "path": f"/cache/bench-{i % 50}",
            "raw_path": b"",
            "query_string": b"",
            "headers": [],
            "root_path": "",
            "app": None,
        }
        await app(scope, receive, send)
    return time.process_time() - started


async def main_async(args: argparse.Namespace) -> None:
    bare, measured = apps()
    await drive(bare, 1000)  # warm-up: imports, caches, label children
    await drive(measured, 1000)
    bare_us: list[float] = []
    metered_us: list[float] = []
    for _ in range(args.rounds):
        bare_us.append(1e6 * await drive(bare, args.requests) / args.requests)
        metered_us.append(1e6 * await drive(measured, args.requests) / args.requests)
    b, m = statistics.median(bare_us), statistics.median(metered_us)
    print(
        f"metrics_overhead: {args.requests} requests x {args.rounds} rounds per app, cores={os.cpu_count()}, loadavg(1m)={os.getloadavg()[0]:.2f}"
    )
    print(f"  bare router:          {b:7.1f} us CPU per request (median of rounds: {', '.join(f'{x:.1f}' for x in bare_us)})")
    print(f"  with RequestMetrics:  {m:7.1f} us CPU per request (median of rounds: {', '.join(f'{x:.1f}' for x in metered_us)})")
    print(f"  middleware adds:      {m - b:7.1f} us CPU per request ({m / b:.2f}x the bare router)")


def main() -> None:
    parser = build_parser()
    smoke_option(parser, None, requests=300, rounds=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
