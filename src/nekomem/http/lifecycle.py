"""Character lifecycle routes of the reference contract: ``/cancel_correction``,
``/reload`` and ``/release_character``.

- ``POST /cancel_correction/{name}``: the memory browser saved recent.json itself; the
  character adopts the file and drops a review in flight. ``{"status": "cancelled"}`` when
  a review was dropped, else ``{"status": "no_task"}``. An unknown character: ``no_task``.
- ``POST /reload`` (body optional: ``resume_derived_task_names``,
  ``resume_derived_task_generations``, ``release_derived_task_claims``, the reference's):
  every active character is stopped; each one reloads from disk at its next request, and
  the characters named in ``resume_derived_task_names`` that have a folder are started
  again at once. ``{"status": "success", "message", "resumed": [names started]}``. The
  other two fields are checked (a malformed body is 422, a bad name 400) and name the
  generation and claim tokens of a ``/release_character`` hold to end; nekomem's
  release holds nothing past its answer, so there is nothing of theirs to end here.
- ``POST /release_character/{name}``: the character's actors stop and every file handle of
  its folder is closed before the answer, so the chat server may rename or delete the
  folder. ``{"status": "success", "character_name", "cancelled_derived_tasks": n}``.
"""

from __future__ import annotations

import asyncio

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import CancelCorrection
from nekomem.http.bodies import character_name, convert_body, read_json_object
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import JsonAnswer, ask, runtime_of
from nekomem.stores.layout import InvalidName, validate_name


async def cancel_correction(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        return JSONResponse({"status": "no_task"})
    return JSONResponse(await ask(rt, name, "recent", lambda reply: CancelCorrection(reply=reply), JsonAnswer))


class ReloadBody(msgspec.Struct, kw_only=True):
    """The reference chat server's ``/reload`` body (``notify_memory_server_reload``): the
    end of a rename, delete, card save or cloud download of characters."""

    resume_derived_task_names: list[str] = msgspec.field(default_factory=list)
    resume_derived_task_generations: dict[str, int] = msgspec.field(default_factory=dict)
    release_derived_task_claims: dict[str, list[str]] = msgspec.field(default_factory=dict)


def _names(request: Request, raw: list[str]) -> list[str]:
    server = runtime_of(request).settings.server
    try:
        return sorted({validate_name(n, max_length=server.name_max_length, max_units=server.name_max_units) for n in raw})
    except InvalidName as exc:
        raise ApiError(400, "invalid_name", str(exc)) from None


async def reload(request: Request) -> Response:
    rt = runtime_of(request)
    body = convert_body(await read_json_object(request, allow_empty=True), ReloadBody)
    resume = _names(request, body.resume_derived_task_names)
    _names(request, list(body.resume_derived_task_generations) + list(body.release_derived_task_claims))
    names = rt.registry.active_names()
    for name in names:
        await asyncio.to_thread(rt.registry.release, name)
    # The named characters are the ones the chat server just published (a new name after a
    # rename, a created or downloaded character): they are started again at once, reading
    # their folders, instead of at their first request. A name without a folder (deleted,
    # or renamed away) is not started. In cluster mode each node's owner starts its own.
    resumed = []
    if not rt.settings.cluster.cluster_etcd_url:
        for name in resume:
            if await character_exists(request, name):
                rt.registry.activate(name)
                resumed.append(name)
    return JSONResponse(
        {
            "status": "success",
            "message": f"reloaded; {len(names)} active characters will read their files again",
            "resumed": resumed,
        }
    )


async def release_character(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    busy = rt.pool.busy(name)
    await asyncio.to_thread(rt.registry.release, name)
    return JSONResponse({"status": "success", "character_name": name, "cancelled_derived_tasks": int(busy)})
