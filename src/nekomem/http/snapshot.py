"""``POST /api/characters/{name}/export`` (body ``{}``, ``Content-Type: application/json``):
one character as a ``nekomem-character`` document (:mod:`nekomem.stores.snapshot`), the
source of ``nekomem backup`` and ``nekomem export`` against a running server; and
``POST /api/knowledge/export`` (same body): the knowledge packs' registry and pack files,
read under the knowledge service's lock (:mod:`nekomem.stores.knowledge_backup`), the
packs' share of ``nekomem backup``.

A POST with a JSON body, because the export *holds* the character (its actors stop): a
web page cannot send such a request to another origin without a CORS preflight, which
nekomem never grants, while any page could make a browser send a GET (an ``<img>`` tag,
without an Origin header). ``GET`` on the route answers 405.

The copy is consistent: the character is held (its actors finish what is in flight, write
their views and stop; requests for it wait) while its folder is read, so the views, the
logs and the journal are one state, the one after the last acknowledged write. Then the
hold ends and the next request activates the character again from disk. 404 for an
unknown character, 400 for a body that is not a JSON object, 409 ``character_busy``
when it does not go idle in time (a second export waits for the first).
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from nekomem.http.bodies import character_name, decode_json, read_body
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import runtime_of
from nekomem.http.schemas import ExportRequest
from nekomem.runtime.registry import CharacterBusy
from nekomem.stores.atomic import encode_json
from nekomem.stores.knowledge import KnowledgeFileError
from nekomem.stores.snapshot import read_character


async def export_character(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    decode_json(await read_body(request), ExportRequest, rt.settings.server.body_max_depth)
    if not await character_exists(request, name):
        raise ApiError(404, "unknown_character", "no character of that name")
    paths = rt.character_paths(name)

    def run() -> bytes:
        with rt.registry.hold(name, rt.settings.server.character_hold_timeout_seconds):
            return encode_json(read_character(paths.folder, paths.recent))

    try:
        body = await asyncio.to_thread(run)
    except CharacterBusy as exc:
        raise ApiError(409, "character_busy", f"not exported: {exc}") from None
    return Response(body, media_type="application/json")


async def export_knowledge(request: Request) -> Response:
    """``{"copy": {"registry", "packs"}, "broken": [pack ids left out]}``; 503
    ``knowledge_unavailable`` when the registry cannot be read."""
    rt = runtime_of(request)
    decode_json(await read_body(request), ExportRequest, rt.settings.server.body_max_depth)

    def run() -> bytes:
        copy, broken = rt.knowledge.backup_copy()
        return encode_json({"copy": copy, "broken": broken})

    try:
        body = await asyncio.to_thread(run)
    except (KnowledgeFileError, OSError) as exc:
        raise ApiError(503, "knowledge_unavailable", f"the knowledge packs cannot be read: {type(exc).__name__}") from None
    return Response(body, media_type="application/json")
