"""``GET /get_persona/{name}``: the whole persona as the reference's ``persona.json`` shape,
``{section: {"facts": [entry, ...]}}`` (sections ``master``, ``neko``, ``relationship``,
scoped ``@subject/...`` ones), for the reference's UI. Read only: an unknown character
answers ``{}`` without being created; cached embeddings are left out.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import ListEntries
from nekomem.domain.layers import PERSONA
from nekomem.http.bodies import character_name
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.wire.answers import PageAnswer


async def get_persona(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        return JSONResponse({})
    page = await ask(rt, name, PERSONA, lambda reply: ListEntries(status=None, offset=0, limit=10**9, reply=reply), PageAnswer)
    sections: dict[str, dict[str, list[Any]]] = {}
    for item in page.items:
        entity = item.pop("entity", "master")
        item.pop("evidence_score", None)
        sections.setdefault(entity, {"facts": []})["facts"].append(item)
    return JSONResponse(sections)
