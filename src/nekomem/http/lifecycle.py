"""Character lifecycle routes of the reference contract: ``/cancel_correction``,
``/reload`` and ``/release_character``.

- ``POST /cancel_correction/{name}``: the memory browser saved recent.json itself; the
  character adopts the file and drops a review in flight. ``{"status": "cancelled"}`` when
  a review was dropped, else ``{"status": "no_task"}``. An unknown character: ``no_task``.
- ``POST /reload``: every active character is stopped; each one reloads from disk at its
  next request. ``{"status": "success", "message": ...}``.
- ``POST /release_character/{name}``: the character's actors stop and every file handle of
  its folder is closed before the answer, so the chat server may rename or delete the
  folder. ``{"status": "success", "character_name", "cancelled_derived_tasks": n}``.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import CancelCorrection
from nekomem.http.bodies import character_name
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import JsonAnswer, ask, runtime_of


async def cancel_correction(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        return JSONResponse({"status": "no_task"})
    return JSONResponse(await ask(rt, name, "recent", lambda reply: CancelCorrection(reply=reply), JsonAnswer))


async def reload(request: Request) -> Response:
    rt = runtime_of(request)
    names = rt.registry.active_names()
    for name in names:
        await asyncio.to_thread(rt.registry.release, name)
    return JSONResponse({"status": "success", "message": f"reloaded; {len(names)} active characters will read their files again"})


async def release_character(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    busy = rt.pool.busy(name)
    await asyncio.to_thread(rt.registry.release, name)
    return JSONResponse({"status": "success", "character_name": name, "cancelled_derived_tasks": int(busy)})
