"""Serving the memory browser's page: ``/ui`` (plain ES modules and CSS shipped as package
data in ``nekomem/ui/static``; no build step, nothing from a CDN).

The page holds no memory: it reads and changes memory through the API with same-origin
``fetch`` calls, so the same guards apply to it as to any client.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response

from nekomem.http.errors import ApiError
from nekomem.http.operations import HTML, Operation, Parameter

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


def shipped_files() -> dict[str, Path]:
    """The page's files by their path under ``/ui/``, listed once from the package data.

    A request is looked up here rather than resolved on the disk: a path the page does
    not ship (too long for the file system, ``..``, a directory) is a 404 without a
    file-system call that could fail with an ``OSError``.
    """
    return {path.relative_to(STATIC).as_posix(): path for path in STATIC.rglob("*") if path.is_file() and path.suffix in TYPES}


FILES = shipped_files()


async def asset(request: Request) -> Response:
    """A file of the page (``/ui/`` is index.html); 404 for anything else."""
    rel = request.path_params.get("path") or "index.html"
    target = FILES.get(rel)
    if target is None:
        shown = rel if len(rel) <= 80 else rel[:80] + "…"
        raise ApiError(404, "not_found", f"no file {shown} in the memory browser")
    return FileResponse(target, media_type=TYPES[target.suffix], headers=HEADERS)


ASSET: Parameter = {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}


def operations() -> list[Operation]:
    return [
        Operation("/ui", "GET", asset, "The memory browser", answer=HTML),
        Operation("/ui/", "GET", asset, "The memory browser", answer=HTML),
        Operation("/ui/{path:path}", "GET", asset, "A file of the memory browser (scripts, styles)", [ASSET], answer=HTML),
    ]
