"""Erasure routes: forget stored turns, and delete a whole character.

- ``DELETE /api/characters/{name}``: the character's actors finish what is in flight and
  stop (requests for it meanwhile wait, then answer 409), and its folder is removed with
  every file in it. ``{"deleted": name, "files_removed": n}``; 404 for an unknown name.
- ``DELETE /api/characters/{name}/turns/{row_id}``: one stored turn (a row of
  time_indexed.db, the ``id`` of ``/api/browse/{name}/journal``).
- ``DELETE /api/characters/{name}/turns?from=&to=`` (ISO 8601, inclusive) or
  ``?ids=1,2,3``: several. Both answer ``{"forgotten": n, "rows": [ids]}``.

The forgetting of facts, reflections and persona entries is the ``DELETE`` of
``/api/characters/{name}/{layer}/{id}``; what each erasure removes is in docs/OPERATIONS.md,
"Forgetting".
"""

from __future__ import annotations

import asyncio
import re
import shutil
from datetime import date, datetime, time, timezone
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import ForgetTurns
from nekomem.domain.layers import RECENT
from nekomem.http.bodies import character_name
from nekomem.http.errors import ApiError
from nekomem.http.operations import NAME, Operation, Parameter
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.schemas import ExportRequest
from nekomem.http.wire import answer_response
from nekomem.runtime.registry import CharacterBusy
from nekomem.stores.character_summary import summary_of
from nekomem.stores.timeindex_read import to_utc_iso
from nekomem.wire.answers import ForgetTurnsAnswer

_REMOVE_ATTEMPTS = 3
_MAX_ROW_ID = 2**63 - 1  # SQLite's largest integer
_DATE_ONLY = re.compile(r"\d{4}-\d{2}-\d{2}")


ROW: Parameter = {"name": "row_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}}
TURNS: list[Parameter] = [
    {"name": "ids", "in": "query", "required": False, "schema": {"type": "string"}, "description": "row ids, comma-separated"},
    {"name": "from", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"}},
    {"name": "to", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"}},
]


def operations() -> list[Operation]:
    """Erasure and the consistent copies (``http/snapshot.py``)."""
    from nekomem.http.snapshot import export_character, export_knowledge

    c = "/api/characters/{name:str}"
    return [
        Operation(
            f"{c}/export",
            "POST",
            export_character,
            "The character as a nekomem-character document (holds the character: a POST with a JSON body, never a GET)",
            [NAME],
            ExportRequest,
        ),
        Operation(
            "/api/knowledge/export",
            "POST",
            export_knowledge,
            "The knowledge packs' registry and pack files, read under the service's lock (the source of nekomem backup)",
            body=ExportRequest,
        ),
        Operation(c, "DELETE", delete_character, "Delete a character: stop it and remove its folder", [NAME]),
        Operation(f"{c}/turns", "DELETE", forget_turns, "Forget stored turns (ids or a time range)", [NAME, *TURNS]),
        Operation(f"{c}/turns/{{row_id:str}}", "DELETE", forget_turns, "Forget one stored turn", [NAME, ROW]),
    ]


def _remove_folder(folder: Path) -> int:
    """Remove ``folder`` and everything in it; returns the files removed. A reader outside
    the actors (the memory browser's journal page opens the database itself) may create a
    file meanwhile: the removal is tried again, a few times, before the error is raised."""
    count = sum(1 for p in folder.rglob("*") if not p.is_dir())
    for attempt in range(_REMOVE_ATTEMPTS):
        try:
            shutil.rmtree(folder)
            return count
        except FileNotFoundError:
            return count
        except OSError:
            if attempt == _REMOVE_ATTEMPTS - 1:
                raise
    return count


async def delete_character(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        raise ApiError(404, "unknown_character", "no character of that name")
    paths = rt.character_paths(name)
    timeout = rt.settings.server.character_hold_timeout_seconds

    def run() -> int:
        # Held: no request can activate the character (and so reopen its files) while
        # the folder goes.
        with rt.registry.hold(name, timeout):
            # home: in a N.E.K.O. memory folder, the reference's files go with nekomem's.
            removed = _remove_folder(paths.home) if paths.home.exists() else 0
            rt.names.forget(name)
            summary_of(rt.memory_root).forget(name)  # the character list's summary
            rt.services.backlog.publish(name, 0)
            if rt.services.storage is not None:
                rt.services.storage.forget_character(name)
            return removed

    try:
        removed = await asyncio.to_thread(run)
    except CharacterBusy as exc:
        raise ApiError(409, "character_busy", f"not deleted: {exc}") from None
    return JSONResponse({"deleted": name, "files_removed": removed})


def _row_ids(request: Request) -> list[int]:
    raw = request.path_params.get("row_id") or request.query_params.get("ids")
    if raw is None:
        return []
    try:
        ids = [int(part) for part in str(raw).split(",") if part.strip()]
    except ValueError:
        raise ApiError(400, "bad_row_id", "a stored turn is addressed by its integer row id") from None
    if not ids or any(not 1 <= i <= _MAX_ROW_ID for i in ids):
        raise ApiError(400, "bad_row_id", "a stored turn is addressed by its integer row id")
    return ids


def time_range(start: str | None, end: str | None) -> tuple[str, str]:
    """The stored (UTC) form of a forget range's bounds. A bound without an offset is UTC;
    a date-only ``to`` (``2026-12-06``) is the end of that day, so ``from=D&to=D`` forgets
    the day D. Raises ApiError 400 ``bad_range`` for a missing or unreadable bound and
    for ``from`` after ``to``."""
    if start is None or end is None:
        raise ApiError(400, "bad_range", "a time range needs both 'from' and 'to' (ISO 8601)")
    try:
        first = to_utc_iso(start)
        if _DATE_ONLY.fullmatch(end.strip()):
            day = date.fromisoformat(end.strip())
            last = datetime.combine(day, time.max, tzinfo=timezone.utc).isoformat(timespec="microseconds")
        else:
            last = to_utc_iso(end)
    except ValueError as exc:
        raise ApiError(400, "bad_range", f"{exc}; 'from' and 'to' are ISO 8601 (a date, or a date and time)") from None
    if first > last:
        raise ApiError(400, "bad_range", f"'from' ({start}) is after 'to' ({end})")
    return first, last


async def forget_turns(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    ids = _row_ids(request)
    start, end = request.query_params.get("from"), request.query_params.get("to")
    if not ids and start is None and end is None:
        raise ApiError(400, "bad_query", "name the turns: a row id, ?ids=1,2 or ?from=...&to=... (ISO 8601)")
    if ids and (start is not None or end is not None):
        raise ApiError(400, "bad_query", "give row ids or a time range, not both")
    if start is not None or end is not None:
        start, end = time_range(start, end)
    if not await character_exists(request, name):
        raise ApiError(404, "unknown_character", "no character of that name")
    answer = await ask(rt, name, RECENT, lambda reply: ForgetTurns(row_ids=ids, start=start, end=end, reply=reply), ForgetTurnsAnswer)
    return answer_response(answer)
