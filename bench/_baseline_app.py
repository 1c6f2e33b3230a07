"""The baseline of bench.http_load: a bare Starlette app with the same two paths as the
measured nekomem routes but trivial handlers, to be served by ``python -m uvicorn
bench._baseline_app:app``.

``POST /cache/{name}`` parses the JSON body and answers a small JSON object;
``GET /new_dialog/{name}`` answers a short text. Nothing is stored.

``durable_app`` (``bench._baseline_app:durable_app``, for bench.turn_cost) is the same app
whose ``/cache`` also makes the body durable before it answers, as a nekomem turn must: on
a worker thread (one hop there and one back to the event loop), the body is written over
the start of one file per character and ``fdatasync``'d. That is the floor of any
acknowledged durable turn served from Python on this machine: the bare route plus one
flush, one thread hand-off each way, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


async def cache(request: Request) -> Response:
    body = await request.json()
    history = body.get("input_history") if isinstance(body, dict) else None
    return JSONResponse({"status": "cached", "count": len(history) if isinstance(history, list) else 0})


async def new_dialog(request: Request) -> Response:
    return PlainTextResponse(f"baseline context for {request.path_params['name']}\n")


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


app = Starlette(
    routes=[
        Route("/cache/{name:str}", cache, methods=["POST"]),
        Route("/new_dialog/{name:str}", new_dialog, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
)


class _DurableFiles:
    """One open file per character name in a temporary folder (removed at shutdown)."""

    def __init__(self) -> None:
        self.folder = ""
        self.fds: dict[str, int] = {}

    def write(self, name: str, data: bytes) -> None:
        """Write ``data`` at the start of ``name``'s file and flush it to the disk (runs
        on a worker thread)."""
        fd = self.fds.get(name)
        if fd is None:
            fd = self.fds[name] = os.open(os.path.join(self.folder, f"{len(self.fds)}.bin"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, data, 0)
        os.fdatasync(fd)


_durable = _DurableFiles()


async def durable_cache(request: Request) -> Response:
    raw = await request.body()
    body = json.loads(raw)
    history = body.get("input_history") if isinstance(body, dict) else None
    await asyncio.to_thread(_durable.write, request.path_params["name"], raw)
    return JSONResponse({"status": "cached", "count": len(history) if isinstance(history, list) else 0})


@contextlib.asynccontextmanager
async def _durable_files(_app: Starlette) -> AsyncIterator[None]:
    _durable.folder = tempfile.mkdtemp(prefix="nekomem-bench-durable-")
    try:
        yield
    finally:
        for fd in _durable.fds.values():
            os.close(fd)
        shutil.rmtree(_durable.folder, ignore_errors=True)


durable_app = Starlette(
    routes=[
        Route("/cache/{name:str}", durable_cache, methods=["POST"]),
        Route("/new_dialog/{name:str}", new_dialog, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ],
    lifespan=_durable_files,
)
