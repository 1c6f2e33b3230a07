"""``POST /api/characters/{name}/rename`` (``{"to": NEW}``) and
``POST /api/characters/{name}/merge`` (``{"into": TARGET}``): an operator's repair of a
character made by a mistyped name (the memory browser's buttons, ``nekomem characters``).

Both hold the characters involved (the registry's hold: their actors stop with their
views written, requests for them wait, see :mod:`nekomem.http.erasure`), change the
folders (:mod:`nekomem.stores.character_moves`) and let the next request activate the
result from disk, which rebuilds its recall index and replays its outbox. Guarded as
every write route (Host, Origin, token, application/json). Not in cluster mode: a name
decides its shard, so a rename there is an export and an import.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.http.bodies import character_name, decode_body
from nekomem.http.errors import ApiError
from nekomem.http.operations import NAME, Operation
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import runtime_of
from nekomem.http.schemas import MergeBody, RenameBody
from nekomem.runtime.clock import iso
from nekomem.runtime.registry import CharacterBusy
from nekomem.runtime.runtime import Runtime
from nekomem.stores.character_moves import MoveError, merge_characters, rename_character
from nekomem.stores.layout import InvalidName, validate_name

log = logging.getLogger("nekomem.http.moves")


def _other_name(rt: Runtime, raw: str) -> str:
    server = rt.settings.server
    try:
        name = validate_name(raw, server.name_max_length, server.name_max_units)
    except InvalidName as exc:
        raise ApiError(400, exc.code, exc.message) from None
    return str(rt.names.canonical(name))


def _refuse_in_cluster(rt: Runtime) -> None:
    if rt.services.character_root is not None:
        raise ApiError(409, "unsupported_in_cluster_mode", "rename or merge on a single node (export, then import under the new name)")


def _held(rt: Runtime, first: str, second: str, work: Callable[[], int]) -> int:
    timeout = rt.settings.server.character_hold_timeout_seconds
    with rt.registry.hold(first, timeout):
        if second == first:  # the same folder spelt otherwise on a case-folding disk
            return work()
        with rt.registry.hold(second, timeout):
            return work()


async def _run(rt: Runtime, first: str, second: str, work: Callable[[], int]) -> int:
    try:
        return await asyncio.to_thread(_held, rt, first, second, work)
    except CharacterBusy as exc:
        raise ApiError(409, "character_busy", f"nothing changed: {exc}") from None
    except MoveError as exc:
        raise ApiError(404 if exc.code == "unknown_character" else 409, exc.code, exc.message) from None
    except sqlite3.Error as exc:
        raise ApiError(503, "storage_unreadable", f"a journal could not be read or written: {type(exc).__name__}") from None


async def rename(request: Request) -> Response:
    """Rename the character; 404 when it does not exist, 409 when the new name does."""
    rt = runtime_of(request)
    _refuse_in_cluster(rt)
    old = character_name(request)
    new = _other_name(rt, (await decode_body(request, RenameBody)).to)
    if not await character_exists(request, old):
        raise ApiError(404, "unknown_character", "no character of that name")
    if new == old:
        raise ApiError(409, "same_character", "the new name is the character's name")

    def work() -> int:
        rename_character(rt.character_paths(old).folder, rt.character_paths(new).folder, iso(rt.clock.now()))
        rt.names.forget(old)
        rt.names.forget(new)
        return 0

    await _run(rt, old, new, work)
    log.info("a character was renamed")
    return JSONResponse({"name": new, "renamed_from": old})


async def merge(request: Request) -> Response:
    """Merge the character into another existing one; 404 when either does not exist."""
    rt = runtime_of(request)
    _refuse_in_cluster(rt)
    source = character_name(request)
    target = _other_name(rt, (await decode_body(request, MergeBody)).into)
    for name in (source, target):
        if not await character_exists(request, name):
            raise ApiError(404, "unknown_character", f"no character {name}")
    if source == target:
        raise ApiError(409, "same_character", "a character cannot be merged into itself")

    def work() -> int:
        rows = merge_characters(rt.character_paths(source).folder, rt.character_paths(target).folder, iso(rt.clock.now()))
        rt.names.forget(source)
        return rows

    rows = await _run(rt, source, target, work)
    log.info("a character was merged into another (%d journal rows)", rows)
    return JSONResponse({"name": target, "merged_from": source, "rows": rows})


def operations() -> list[Operation]:
    return [
        Operation(
            "/api/characters/{name:str}/rename",
            "POST",
            rename,
            "Rename a character (every layer moves; 409 when the new name exists)",
            [NAME],
            RenameBody,
        ),
        Operation(
            "/api/characters/{name:str}/merge",
            "POST",
            merge,
            "Merge a character into another existing one, then remove it",
            [NAME],
            MergeBody,
        ),
    ]
