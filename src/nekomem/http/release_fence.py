"""The write fence of ``/release_character``'s hold (see :mod:`nekomem.runtime.release_claims`).

While an open claim holds a character, the writes the reference fences answer 409
``{"status": "cancelled", ...}`` before any route runs, so nothing reopens or recreates the
character's folder while N.E.K.O.'s main process renames or deletes it. The fenced routes
are the reference's (its memory server's ``_CHARACTER_WRITE_ROUTES`` and scoped write
operations): ``POST /cache|process|renew|settle|reflect|record_surfaced/{name}``,
``PUT /prompt-locale/{name}`` and ``POST /internal/memory/{name}/<op>`` for the scoped
writes and theater forget/retract. Reads are not fenced (as in the reference).
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from nekomem.runtime.runtime import Runtime
from nekomem.stores.layout import InvalidName, validate_name

_WRITE_PREFIXES: tuple[tuple[str, frozenset[str]], ...] = (
    ("/cache/", frozenset({"POST"})),
    ("/process/", frozenset({"POST"})),
    ("/renew/", frozenset({"POST"})),
    ("/settle/", frozenset({"POST"})),
    ("/reflect/", frozenset({"POST"})),
    ("/record_surfaced/", frozenset({"POST"})),
    ("/prompt-locale/", frozenset({"PUT"})),
)
_SCOPED_PREFIX = "/internal/memory/"
_SCOPED_WRITES = frozenset({"scoped_facts", "scoped_history", "scoped_forget", "scoped_mentions", "theater/forget", "theater/retract"})


def fenced_name(path: str, method: str) -> str | None:
    """The character a fenced write of ``method path`` (decoded path) is for, canonical;
    None for any other request (or a name the route itself will refuse)."""
    raw: str | None = None
    for prefix, methods in _WRITE_PREFIXES:
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            if method in methods and rest and "/" not in rest:
                raw = rest
            break
    if raw is None and method == "POST" and path.startswith(_SCOPED_PREFIX):
        head, _, op = path[len(_SCOPED_PREFIX) :].partition("/")
        if head and op in _SCOPED_WRITES:
            raw = head
    if raw is None:
        return None
    try:
        return validate_name(raw)
    except InvalidName:
        return None


class ReleaseFence:
    """ASGI middleware: 409 ``cancelled`` for fenced writes to a held character."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name = fenced_name(scope.get("path", ""), scope.get("method", ""))
            if name is not None and self.runtime.release_claims.held(self.runtime.names.canonical(name)):
                # The reference's body ({"status": "cancelled", "message"}) with nekomem's error_code.
                body = {"status": "cancelled", "error_code": "character_release_in_progress", "message": "character release in progress"}
                response = JSONResponse(body, status_code=409)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
