"""Characters are created only by a write that stores something, and each creation is
noted in the character's ``origin.json`` (:mod:`nekomem.stores.origin`).

A write route asks :func:`is_new` before it reaches the actors (activation creates the
folder); an empty write to an unknown character answers what it would have answered
without activating anything, and a write that did create the character calls
:func:`note_created` once it has been answered by the actors. Reads never activate an
unknown character (:mod:`nekomem.http.readonly`).
"""

from __future__ import annotations

import asyncio
import logging
import re

from starlette.requests import Request

from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import runtime_of
from nekomem.runtime.clock import iso
from nekomem.stores.origin import CharacterOrigin, client_kind, record_creation

log = logging.getLogger("nekomem.http.origin")
_CONVERTER = re.compile(r"\{(\w+):\w+\}")  # "{name:str}" -> "{name}"


async def is_new(request: Request, name: str) -> bool:
    """True when ``name`` has no stored memory yet (the next write creates it)."""
    return not await character_exists(request, name)


async def require_character(request: Request, name: str) -> None:
    """Raise 404 ``unknown_character`` when ``name`` does not exist (a change to an entry
    of an unknown character must not create it)."""
    if await is_new(request, name):
        raise ApiError(404, "unknown_character", "no character of that name")


def route_label(request: Request) -> str:
    """``METHOD /route/{template}`` of the request (the template, never the path's values)."""
    route = request.scope.get("route")
    template = getattr(route, "path", None) or "(unknown route)"
    return request.method + " " + _CONVERTER.sub(r"{\1}", template)


async def note_created(request: Request, name: str) -> None:
    """Store when, through which route and from which kind of client ``name`` was created
    (once: the first creation wins). A failure is logged, never raised: the write itself
    succeeded."""
    rt = runtime_of(request)
    origin = CharacterOrigin(
        created_at=iso(rt.clock.now()), route=route_label(request), client=client_kind(request.headers.get("user-agent"))
    )
    try:
        folder = rt.character_paths(name).folder
        if await asyncio.to_thread(folder.is_dir) and await asyncio.to_thread(record_creation, folder, origin):
            log.info("character created through %s (client %s)", origin.route, origin.client or "-")
    except OSError as exc:
        log.warning("the origin of a new character could not be stored: %s", type(exc).__name__)
