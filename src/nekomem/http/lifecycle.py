"""Character lifecycle routes of the reference contract: ``/cancel_correction``,
``/reload`` and ``/release_character``.

- ``POST /cancel_correction/{name}``: the memory browser saved recent.json itself; the
  character adopts the file and drops a review in flight. ``{"status": "cancelled"}`` when
  a review was dropped, else ``{"status": "no_task"}``. An unknown character: ``no_task``.
- ``POST /reload``: every active character is stopped; each one reloads from disk at its
  next request. In a N.E.K.O. memory folder, character folders the main process added
  (a cloud-save download) or changed are adopted first (:mod:`nekomem.importer.neko_folder`),
  and a renamed or deleted folder is simply what the next request finds. The body's
  ``release_derived_task_claims`` (``{name: [token]}``) closes ``/release_character``
  claims and ``resume_derived_task_names`` / ``resume_derived_task_generations`` open
  published names again (:mod:`nekomem.runtime.release_claims`), and the characters named
  in ``resume_derived_task_names`` that have a folder are started again at once; an empty
  body is allowed. ``{"status": "success", "message", "resumed": [names started]}``.
- ``POST /release_character/{name}?hold_derived_task_admission=&derived_task_claim_token=&derived_task_claim_generation=``:
  a claim is opened (with the hold, fenced writes to the name answer 409 ``cancelled``
  and the name is not activated), the character's actors stop and every file handle of
  its folder is closed before the answer, so the chat server may rename or delete the
  folder. ``{"status": "success", "character_name", "cancelled_derived_tasks": n,
  "derived_task_claim_token"}``. Without a token or generation: 400. A token already
  released: 409 ``{"status": "cancelled"}``.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import CancelCorrection
from nekomem.domain.layers import RECENT
from nekomem.http.bodies import character_name, convert_body, read_json_object
from nekomem.http.errors import ApiError, error_response
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.wire import answer_response
from nekomem.importer import neko_folder
from nekomem.runtime.runtime import Runtime
from nekomem.stores.character_summary import summary_of
from nekomem.stores.layout import InvalidName, is_neko_folder, validate_name
from nekomem.wire.answers import StatusAnswer

log = logging.getLogger("nekomem.lifecycle")

# The query booleans FastAPI (the reference) accepts.
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


class ReloadBody(msgspec.Struct, kw_only=True):
    """``POST /reload``'s body (every field optional), as N.E.K.O.'s main process sends it."""

    resume_derived_task_names: list[str] = msgspec.field(default_factory=list)
    resume_derived_task_generations: dict[str, int] = msgspec.field(default_factory=dict)
    release_derived_task_claims: dict[str, list[str]] = msgspec.field(default_factory=dict)


async def cancel_correction(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        return answer_response(StatusAnswer(status="no_task"))
    return answer_response(await ask(rt, name, RECENT, lambda reply: CancelCorrection(reply=reply), StatusAnswer))


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
    try:
        names = rt.registry.active_names()
        for name in names:
            await asyncio.to_thread(rt.registry.release, name)
        adopted = await asyncio.to_thread(_adopt_changes, rt, names) if is_neko_folder(rt.memory_root) else None
    finally:
        # The end of a release transaction, whether or not the reload itself succeeded
        # (as in the reference): its claims close, published names open.
        for name, tokens in body.release_derived_task_claims.items():
            for token in tokens:
                rt.release_claims.release(name, token)
        for name in body.resume_derived_task_names:
            rt.release_claims.resume(name, body.resume_derived_task_generations.get(name))
    # The named characters are the ones the chat server just published (a new name after a
    # rename, a created or downloaded character): they are started again at once, reading
    # their folders, instead of at their first request. A name without a folder (deleted,
    # or renamed away) is not started. In cluster mode each node's owner starts its own.
    resumed = []
    if not rt.settings.cluster.cluster_etcd_url:
        for name in resume:
            # A name still held by a claim of the resumed generation (a concurrent
            # transaction) stays closed until that claim ends.
            if not rt.release_claims.held(name) and await character_exists(request, name):
                rt.registry.activate(name)
                resumed.append(name)
    message = f"reloaded; {len(names)} active characters will read their files again"
    if adopted:
        message += f"; {adopted} character folders adopted"
    return JSONResponse({"status": "success", "message": message, "resumed": resumed})


def _adopt_changes(rt: Runtime, released: list[str]) -> int:
    """Adopt character folders the main process added or changed (their actors are
    stopped; the serving root lock stays shared), and forget the spellings of released
    characters whose folder is gone (renamed or deleted). Returns how many folders were
    adopted or imported again. Raises OSError."""
    report = neko_folder.adopt(rt.memory_root, rt.settings)
    if report.adopted or report.refreshed:
        # Written outside the registry's holds: the character list compares every row again.
        summary_of(rt.memory_root).recheck()
    known = set(rt.known_characters())
    for name in released:
        if name not in known:
            rt.names.forget(name)
    storage = rt.services.storage
    for name in rt.services.backlog.snapshot():
        if name not in known:
            rt.services.backlog.publish(name, 0)  # /health's backlog drops a deleted or renamed name
    if storage is not None:
        reported = storage.snapshot()
        for item in reported["faults"] + reported["damaged_journals"] + reported["unrebuilt_views"]:
            if item["character"] not in known:
                storage.forget_character(str(item["character"]))  # nor its storage troubles
    return len(report.adopted) + len(report.refreshed)


async def release_character(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    query = request.query_params
    hold_raw = query.get("hold_derived_task_admission", "false").strip().lower()
    if hold_raw not in _TRUE | _FALSE:
        return error_response(400, "bad_query", "hold_derived_task_admission must be true or false", character_name=name)
    token = query.get("derived_task_claim_token", "").strip()
    generation_raw = query.get("derived_task_claim_generation", "").strip()
    try:
        generation = int(generation_raw) if generation_raw else None
    except ValueError:
        return error_response(400, "bad_query", "derived_task_claim_generation must be an integer", character_name=name)
    if not token or generation is None:
        return error_response(400, "claim_required", "derived task claim token and generation are required", character_name=name)
    if not rt.release_claims.claim(name, token, generation, hold_raw in _TRUE):
        return JSONResponse(
            {"status": "cancelled", "character_name": name, "message": "release claim was already withdrawn"}, status_code=409
        )
    busy = rt.pool.busy(name)
    try:
        await asyncio.to_thread(rt.registry.release, name)
    except BaseException:
        rt.release_claims.release(name, token)
        raise
    if not rt.release_claims.active(name, token):
        # Withdrawn meanwhile (a /reload closed it: the caller gave up and compensated).
        return JSONResponse(
            {"status": "cancelled", "character_name": name, "message": "release claim was withdrawn while draining"}, status_code=409
        )
    log.info("released a character for the main process (hold=%s)", hold_raw in _TRUE)
    return JSONResponse(
        {"status": "success", "character_name": name, "cancelled_derived_tasks": int(busy), "derived_task_claim_token": token}
    )
