"""Serving the memory browser's page: ``/ui`` (plain ES modules and CSS shipped as package
data in ``nekomem/ui/static``; no build step, nothing from a CDN).

The page holds no memory: it reads and changes memory through the API with same-origin
``fetch`` calls, so the same guards apply to it as to any client.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route

from nekomem.http.errors import ApiError

# The page's files hold no memory, and a browser cannot attach a bearer token to a page
# navigation: a request guard that asks for a token lets this prefix through (the API
# calls the page makes carry the token).
OPEN_PREFIX = "/ui"
STATIC = Path(__file__).resolve().parent.parent / "ui" / "static"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
}


async def asset(request: Request) -> Response:
    """A file of the page (``/ui/`` is index.html); 404 for anything else."""
    rel = request.path_params.get("path") or "index.html"
    target = (STATIC / rel).resolve()
    if STATIC not in target.parents or not target.is_file() or target.suffix not in TYPES:
        raise ApiError(404, "not_found", f"no file {rel} in the memory browser")
    return FileResponse(target, media_type=TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0], headers=HEADERS)


def routes() -> list[BaseRoute]:
    return [
        Route("/ui", asset, methods=["GET"]),
        Route("/ui/", asset, methods=["GET"]),
        Route("/ui/{path:path}", asset, methods=["GET"]),
    ]
