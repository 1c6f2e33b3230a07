"""Routes of the memory browser (``/ui``) that the ``/api/characters`` API lacks.

``/api/browse/...`` reads: characters with counts, a filtered page of time_indexed.db, a
filtered page of facts, archived reflections, the persona contradiction queue; and two
writes: suppress/unsuppress a persona entry and the recent-review switch
(``/api/memory/review_config``, the reference's route). Every change goes through the
character's actors and journal like any other client's. The explained recall, the working
context and the evidence history live in :mod:`nekomem.http.browse_insight`; the page
itself in :mod:`nekomem.http.ui_static`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import BrowseFacts, CorrectionsAnswer, CountEntries, EntryCounts, ListCorrections, SetSuppressed
from nekomem.domain.browse import FACT_STATUSES, FactFilter
from nekomem.domain.layers import FACTS, PERSONA, disk_counts, layers
from nekomem.http import browse_insight, schemas, ui_static
from nekomem.http import browse_store as store
from nekomem.http.bodies import character_name, read_json_object
from nekomem.http.character_origin import require_character
from nekomem.http.errors import ApiError
from nekomem.http.longterm import _int_param
from nekomem.http.operations import BROWSE_PAGE, ID, NAME, RID, Operation, query
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.system import _toggle_lock, fact_backlog_of
from nekomem.http.wire import answer_response
from nekomem.runtime.runtime import Runtime
from nekomem.runtime.switches import REVIEW, SwitchError
from nekomem.stores.character_summary import CharacterRow, journal_totals, summary_of
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.origin import read_origin
from nekomem.stores.timeindex import to_utc_iso
from nekomem.wire.answers import PageAnswer, SuppressAnswer

ENTITIES = ("master", "neko", "relationship")


def _paths(request: Request, name: str) -> CharacterPaths:
    rt = runtime_of(request)
    return rt.character_paths(name)


def _time_param(request: Request, key: str) -> str | None:
    raw = request.query_params.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        return to_utc_iso(raw.strip())
    except ValueError:
        raise ApiError(400, "bad_query", f"{key} must be an ISO 8601 time") from None


def _bool_param(request: Request, key: str) -> bool | None:
    raw = request.query_params.get(key)
    if raw is None or raw == "":
        return None
    if raw not in ("true", "false"):
        raise ApiError(400, "bad_query", f"{key} must be true or false")
    return raw == "true"


def _page(request: Request, default: int) -> tuple[int, int]:
    limit_max = runtime_of(request).settings.server.api_page_max
    return _int_param(request, "offset", 0, 0, 10**9), _int_param(request, "limit", min(default, limit_max), 1, limit_max)


# -- characters --------------------------------------------------------------------------
async def _live_counts(rt: Runtime, name: str) -> dict[str, Any]:
    """Counts asked of an active character's actors (exact, including unflushed changes):
    each layer that declares counts answers its own, in start order."""
    counts: dict[str, Any] = {}
    for spec in layers():
        if spec.counts:
            answer = await ask(rt, name, spec.address, lambda reply: CountEntries(reply=reply), EntryCounts)
            counts.update(answer.counts)
    return counts


def _origin(paths: CharacterPaths) -> dict[str, Any] | None:
    try:
        origin = read_origin(paths.folder)
    except OSError:
        return None
    return None if origin is None else msgspec.to_builtins(origin)


CHARACTER_SORTS = ("name", "last_conversation")


def _character_rows(
    rt: Runtime, names: list[str], everyone: list[str], *, sort: str, offset: int, limit: int
) -> tuple[list[str], dict[str, CharacterRow]]:
    """The page of ``names`` in ``sort`` order and the summary rows of its names. Sorted by
    name only the page's characters are looked at. Sorted by last conversation, a
    single-node server sorts by the summary's kept times, comparing only the rows of the
    characters it may have written since (:meth:`CharacterSummary.order`); a cluster node,
    which shares the root with other writers, compares every row (a few ``stat`` calls
    each, no file read while the summary holds)."""
    summary = summary_of(rt.memory_root)
    single = rt.services.character_root is None
    if sort == "last_conversation":
        writing: set[str] | None = None
        if single:
            summary.check(everyone, rt.character_paths, journal_totals)  # done at start-up: returns at once
            writing = rt.registry.writing_names()
        names = summary.order(names, rt.character_paths, journal_totals, writing=writing)
    page = names[offset : offset + limit]
    known = None if single else set(everyone)  # a single root's listing drops the rows of folders gone
    return page, summary.rows(page, rt.character_paths, journal_totals, disk_counts, known)


async def characters(request: Request) -> Response:
    """``GET /api/browse/characters?offset=&limit=&sort=name|last_conversation&q=&brief=``:
    a page of the characters on disk (``q``: a part of the name, any case) with their
    counts per layer, whether each is active, its last conversation time and any storage
    trouble; ``total`` counts the characters the filter keeps. The counts of a passive
    character come from the per-root summary (:mod:`nekomem.stores.character_summary`),
    so a page costs the same with 50 or 5,000 characters on disk; an active character's
    are asked of its actors. ``brief=true`` leaves out what needs more than the summary
    (trouble, backlog, origin, live counts): the browser's character picker."""
    rt = runtime_of(request)
    offset, limit = _page(request, rt.settings.server.api_page_max)
    sort = request.query_params.get("sort") or "name"
    if sort not in CHARACTER_SORTS:
        raise ApiError(400, "bad_query", f"sort must be one of {', '.join(CHARACTER_SORTS)}")
    brief = bool(_bool_param(request, "brief"))
    needle = (request.query_params.get("q") or "").strip().casefold()
    if rt.services.character_root is None:
        # One root: its listing is kept by the summary (a directory read, no look inside).
        everyone = await asyncio.to_thread(summary_of(rt.memory_root).names, rt.settings.server.name_max_length)
    else:
        everyone = await asyncio.to_thread(rt.known_characters)
    names = [n for n in everyone if needle in n.casefold()] if needle else everyone
    page, summary = await asyncio.to_thread(_character_rows, rt, names, everyone, sort=sort, offset=offset, limit=limit)
    active = set(rt.registry.active_names())
    rows = []
    for name in page:
        kept = summary[name]
        row: dict[str, Any] = {
            "name": name,
            "active": name in active,
            "turns": kept.turns,
            "last_conversation_at": kept.last_conversation_at,
            "counts": dict(kept.counts or {}),
        }
        if not brief:
            row.update(await _row_details(request, rt, name, name in active, kept))
        rows.append(row)
    return JSONResponse({"characters": rows, "total": len(names), "offset": offset, "limit": limit, "sort": sort})


async def _row_details(request: Request, rt: Runtime, name: str, active: bool, kept: CharacterRow) -> dict[str, Any]:
    """What a full row adds to the summary's: live counts of an active character, storage
    trouble, pending vectors, the fact backlog (an active character's published count, a
    passive one's from its summary row ``kept``, just compared) and the origin."""
    paths = _paths(request, name)
    trouble = await asyncio.to_thread(store.storage_trouble, paths)
    details: dict[str, Any] = {}
    if active:
        details["counts"] = await _live_counts(rt, name)
        described = await asyncio.to_thread(rt.registry.describe, name)
        failed = (described or {}).get("failed", {})
        trouble += [f"{child} layer failed: {error}" for child, error in failed.items()]
    details.update(
        {
            # Stored entries still without a vector (searchable by BM25 only until then).
            "embeddings_pending": rt.services.pending.of(name),
            # Stored turns still waiting for fact extraction (from before a model):
            # the count /health shows (one tally, nekomem.http.system.fact_backlog_of).
            "fact_backlog": await asyncio.to_thread(fact_backlog_of, rt, name, None if active else kept.backlog),
            "trouble": trouble,
            "damaged": store.journal_damaged(trouble),
            # When and through which route it was created, and renames/merges since
            # (nekomem.stores.origin); null for a folder from before origins.
            "origin": await asyncio.to_thread(_origin, paths),
        }
    )
    return details


# -- journal -----------------------------------------------------------------------------
async def journal(request: Request) -> Response:
    """``GET /api/browse/{name}/journal?since&until&q&order&offset&limit``: a page of the
    raw conversation in time_indexed.db."""
    name = character_name(request)
    offset, limit = _page(request, 50)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "bad_query", "order must be asc or desc")
    q = store.JournalQuery(
        since=_time_param(request, "since"),
        until=_time_param(request, "until"),
        text=request.query_params.get("q", ""),
        order=order,
        offset=offset,
        limit=limit,
    )
    try:
        page = await asyncio.to_thread(store.read_journal, _paths(request, name), q)
    except sqlite3.Error as exc:
        raise ApiError(503, "storage_unreadable", f"time_indexed.db cannot be read: {type(exc).__name__}") from None
    return JSONResponse(page)


# -- facts -------------------------------------------------------------------------------
def _importance(request: Request, key: str) -> int | None:
    if request.query_params.get(key) in (None, ""):
        return None
    return _int_param(request, key, 0, 1, 10)


async def facts(request: Request) -> Response:
    """``GET /api/browse/{name}/facts``: facts filtered by status (active, archived, all),
    entity, importance range, absorbed, event time range, text and ids; newest first."""
    rt = runtime_of(request)
    name = character_name(request)
    offset, limit = _page(request, 50)
    status = request.query_params.get("status", "active")
    if status not in FACT_STATUSES:
        raise ApiError(400, "bad_query", "status must be active, archived or all")
    entity = request.query_params.get("entity") or None
    if entity is not None and entity not in ENTITIES:
        raise ApiError(400, "bad_query", "entity must be master, neko or relationship")
    ids = tuple(i for i in request.query_params.get("ids", "").split(",") if i)
    if not await character_exists(request, name):
        return JSONResponse({"total": 0, "offset": offset, "items": []})  # reads never create a character
    flt = FactFilter(
        status=status,
        entity=entity,
        importance_min=_importance(request, "importance_min"),
        importance_max=_importance(request, "importance_max"),
        absorbed=_bool_param(request, "absorbed"),
        event_from=_time_param(request, "event_from"),
        event_to=_time_param(request, "event_to"),
        text=request.query_params.get("q", ""),
        ids=ids,
    )
    answer = await ask(rt, name, FACTS, lambda reply: BrowseFacts(filter=flt, offset=offset, limit=limit, reply=reply), PageAnswer)
    return answer_response(answer)


# -- reflections and persona -------------------------------------------------------------
async def archived_reflections(request: Request) -> Response:
    """``GET /api/browse/{name}/reflections_archived``: a page of reflection_archive/."""
    name = character_name(request)
    offset, limit = _page(request, 50)
    items = await asyncio.to_thread(store.archived_reflections, _paths(request, name))
    return JSONResponse({"total": len(items), "offset": offset, "items": items[offset : offset + limit]})


async def corrections(request: Request) -> Response:
    """``GET /api/browse/{name}/corrections``: the persona contradiction queue."""
    name = character_name(request)
    if not await character_exists(request, name):
        return answer_response(CorrectionsAnswer(total=0, items=[], inflight=False))
    return answer_response(await ask(runtime_of(request), name, PERSONA, lambda reply: ListCorrections(reply=reply), CorrectionsAnswer))


async def suppress(request: Request) -> Response:
    """``POST /api/browse/{name}/persona/{entry_id}/suppress`` with ``{"suppress": bool}``."""
    name = character_name(request)
    body = await read_json_object(request)
    value = body.get("suppress")
    if not isinstance(value, bool):
        raise ApiError(422, "bad_suppress", "'suppress' must be true or false")
    entry_id = request.path_params["entry_id"]
    await require_character(request, name)
    return answer_response(
        await ask(runtime_of(request), name, PERSONA, lambda reply: SetSuppressed(id=entry_id, suppress=value, reply=reply), SuppressAnswer)
    )


# -- the review switch -------------------------------------------------------------------
async def review_get(request: Request) -> Response:
    rt = runtime_of(request)
    async with _toggle_lock(request):
        try:
            enabled = await asyncio.to_thread(rt.switches.get, REVIEW)
        except SwitchError as exc:
            raise ApiError(503, "invalid_memory_setting", str(exc)) from None
    return JSONResponse({"enabled": enabled})


async def review_post(request: Request) -> Response:
    rt = runtime_of(request)
    body = await read_json_object(request)
    enabled = body.get("enabled")
    if not isinstance(enabled, bool):
        raise ApiError(400, "bad_enabled", "'enabled' must be true or false")
    async with _toggle_lock(request):
        await asyncio.to_thread(rt.switches.set, REVIEW, enabled)
    return JSONResponse({"success": True, "enabled": enabled})


def operations() -> list[Operation]:
    """Every route of the memory browser; registered before the generic
    ``/api/characters/{name}/{layer}`` routes."""
    b, i = "/api/browse/{name:str}", browse_insight
    facts_query = query("status", "entity", "importance_min", "importance_max", "absorbed", "event_from", "event_to", "q", "ids")
    return [
        Operation("/api/browse/characters", "GET", characters, "Every character with counts, last conversation and trouble"),
        Operation(
            f"{b}/journal",
            "GET",
            journal,
            "A page of the raw conversation (order asc or desc)",
            [NAME, *BROWSE_PAGE, *query("since", "until", "q", "order")],
        ),
        Operation(
            f"{b}/facts",
            "GET",
            facts,
            "Facts by status, entity, importance, absorbed, event time, text or ids",
            [NAME, *BROWSE_PAGE, *facts_query],
        ),
        Operation(f"{b}/reflections_archived", "GET", archived_reflections, "A page of archived reflections", [NAME, *BROWSE_PAGE]),
        Operation(
            f"{b}/reflections/{{reflection_id:str}}/evidence",
            "GET",
            i.evidence_history,
            "A reflection's evidence changes and decayed curve",
            [NAME, RID],
        ),
        Operation(f"{b}/corrections", "GET", corrections, "The persona contradiction queue", [NAME]),
        Operation(f"{b}/persona/{{entry_id:str}}/suppress", "POST", suppress, "Suppress a persona entry", [NAME, ID], schemas.SuppressBody),
        Operation(f"{b}/recall_explain", "POST", i.recall_explain, "Recall with every leg's scores", [NAME], schemas.BrowseRecallBody),
        Operation(f"{b}/context", "GET", i.context_sections, "The /new_dialog text by section", [NAME, *query("language", "master_name")]),
        Operation("/api/memory/review_config", "GET", review_get, "The recent-memory review switch", answer=schemas.EnabledAnswer),
        Operation(
            "/api/memory/review_config",
            "POST",
            review_post,
            "Set the recent-memory review switch",
            body=schemas.ReviewConfigBody,
            answer=schemas.ToggleAnswer,
        ),
        *ui_static.operations(),
    ]
