"""The baseline of bench.http_load: a bare Starlette app with the same two paths as the
measured nekomem routes but trivial handlers, to be served by ``python -m uvicorn
bench._baseline_app:app``.

``POST /cache/{name}`` parses the JSON body and answers a small JSON object;
``GET /new_dialog/{name}`` answers a short text. Nothing is stored.
"""

from __future__ import annotations

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
