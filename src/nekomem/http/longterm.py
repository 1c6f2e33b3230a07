"""Long-term memory routes: /reflect, surfacing, and the /api/characters memory API."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import (
    DeleteEntry,
    EditEntry,
    Feedback,
    FollowupTopics,
    GetRecent,
    ImportCard,
    ImportFacts,
    ListEntries,
    RecordSurfaced,
    ReflectNow,
    RenderContext,
)
from nekomem.http.bodies import character_name, read_json_object
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.stores.layout import list_characters

LAYERS = {"facts": "facts", "reflections": "reflections", "persona": "persona"}
FEEDBACK = ("confirmed", "denied", "ignored")


def _rt(request: Request) -> Any:
    return request.app.state.runtime


async def render_longterm(request: Request, name: str, language: str = "en", master_name: str = "") -> str:
    """The persona + reflection sections of /new_dialog (used by the conversation routes)."""
    return await _rt(request).registry.ask(
        name, "persona", lambda reply: RenderContext(language=language, master_name=master_name, reply=reply)
    )


async def reflect(request: Request) -> Response:
    rt = _rt(request)
    name = character_name(request)
    report = await rt.registry.ask(name, "facts", lambda reply: ReflectNow(reply=reply), timeout=rt.settings.server.settle_timeout_seconds)
    synthesis = report.get("synthesis") or {}
    reflection = None
    if synthesis.get("status") == "created":
        reflection = {"id": synthesis["reflection_id"], "text": synthesis.get("text", "")}
    promotion = report.get("promotion", [])
    return JSONResponse(
        {
            "reflection": reflection,
            "synthesis": synthesis,
            "confirmed": report.get("confirmed", []),
            "promotion": promotion,
            "auto_transitions": len(report.get("confirmed", [])) + sum(1 for p in promotion if p.get("kind") in ("promoted", "merged", "duplicate")),
        }
    )


async def followup_topics(request: Request) -> Response:
    name = character_name(request)
    if not await character_exists(request, name):
        return JSONResponse({"topics": []})
    return JSONResponse(await _rt(request).registry.ask(name, "reflections", lambda reply: FollowupTopics(reply=reply)))


async def record_surfaced(request: Request) -> Response:
    name = character_name(request)
    body = await read_json_object(request, allow_empty=True)
    ids = body.get("reflection_ids")
    if ids is None or ids == []:
        return JSONResponse({"ok": True, "recorded": 0})  # the reference's no-op
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ApiError(422, "bad_reflection_ids", "'reflection_ids' must be an array of strings")
    if not await character_exists(request, name):
        return JSONResponse({"ok": True, "recorded": 0})
    return JSONResponse(await _rt(request).registry.ask(name, "reflections", lambda reply: RecordSurfaced(ids=ids, reply=reply)))


async def list_all_characters(request: Request) -> Response:
    rt = _rt(request)
    names = await asyncio.to_thread(list_characters, rt.memory_root)
    active = set(rt.registry.active_names())
    return JSONResponse({"characters": [{"name": n, "active": n in active} for n in names]})


def _int_param(request: Request, key: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "bad_query", f"{key} must be an integer") from None
    if not low <= value <= high:
        raise ApiError(400, "bad_query", f"{key} must be between {low} and {high}")
    return value


async def list_layer(request: Request) -> Response:
    rt = _rt(request)
    name = character_name(request)
    layer = request.path_params["layer"]
    if layer not in LAYERS and layer != "recent":
        raise ApiError(404, "not_found", f"no layer {layer}")
    if not await character_exists(request, name):
        raise ApiError(404, "unknown_character", "no character of that name")
    if layer == "recent":
        view = await rt.registry.ask(name, "recent", lambda reply: GetRecent(reply=reply))
        items = [{"index": i, "role": t.role, "text": t.text, "ts": t.ts} for i, t in enumerate(view.window)]
        return JSONResponse({"total": len(items), "offset": 0, "items": items, "stored_total": view.stored_total})
    if layer not in LAYERS:
        raise ApiError(404, "not_found", f"no layer {layer}")
    limit_max = rt.settings.server.api_page_max
    msg = dict(
        status=request.query_params.get("status"),
        entity=request.query_params.get("entity"),
        offset=_int_param(request, "offset", 0, 0, 10**9),
        limit=_int_param(request, "limit", min(100, limit_max), 1, limit_max),
    )
    return JSONResponse(await rt.registry.ask(name, LAYERS[layer], lambda reply: ListEntries(reply=reply, **msg)))


async def edit_entry(request: Request) -> Response:
    rt = _rt(request)
    name = character_name(request)
    layer = request.path_params["layer"]
    entry_id = request.path_params["entry_id"]
    if layer == "recent":
        from nekomem.actors.messages import EditRecent

        try:
            index = int(entry_id)
        except ValueError:
            raise ApiError(400, "bad_index", "a recent item is addressed by its index") from None
        if request.method == "DELETE":
            text = None
        else:
            body = await read_json_object(request)
            text = body.get("text")
            if not isinstance(text, str) or not text.strip():
                raise ApiError(422, "bad_text", "'text' must be a non-empty string")
        view = await rt.registry.ask(name, "recent", lambda reply: EditRecent(index=index, text=text, reply=reply))
        return JSONResponse({"total": len(view.window)})
    if layer not in LAYERS:
        raise ApiError(404, "not_found", f"no layer {layer}")
    if request.method == "DELETE":
        return JSONResponse(await rt.registry.ask(name, LAYERS[layer], lambda reply: DeleteEntry(id=entry_id, reply=reply)))
    body = await read_json_object(request)
    return JSONResponse(await rt.registry.ask(name, LAYERS[layer], lambda reply: EditEntry(id=entry_id, changes=body, reply=reply)))


async def feedback(request: Request) -> Response:
    name = character_name(request)
    body = await read_json_object(request)
    value = body.get("feedback")
    if value not in FEEDBACK:
        raise ApiError(422, "bad_feedback", "'feedback' must be one of confirmed, denied, ignored")
    rid = request.path_params["reflection_id"]
    return JSONResponse(await _rt(request).registry.ask(name, "reflections", lambda reply: Feedback(id=rid, feedback=value, reply=reply)))


async def import_card(request: Request) -> Response:
    name = character_name(request)
    body = await read_json_object(request)
    entries = body.get("entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ApiError(422, "bad_entries", "'entries' must be an array of {entity, text} objects")
    return JSONResponse(await _rt(request).registry.ask(name, "persona", lambda reply: ImportCard(entries=entries, reply=reply)))


async def import_facts(request: Request) -> Response:
    rt = _rt(request)
    name = character_name(request)
    body = await read_json_object(request)
    facts = body.get("facts")
    if not isinstance(facts, list) or not all(isinstance(f, dict) for f in facts):
        raise ApiError(422, "bad_facts", "'facts' must be an array of fact objects")
    for index, fact in enumerate(facts):
        if not isinstance(fact.get("text"), str) or not fact["text"].strip():
            raise ApiError(422, "bad_fact", f"facts[{index}].text must be a non-empty string")
        importance = fact.get("importance", 5)
        if not isinstance(importance, int) or isinstance(importance, bool) or not 1 <= importance <= 10:
            raise ApiError(422, "bad_fact", f"facts[{index}].importance must be an integer from 1 to 10")
        for key in ("event_start_at", "event_end_at"):
            if fact.get(key) is not None and not isinstance(fact[key], str):
                raise ApiError(422, "bad_fact", f"facts[{index}].{key} must be an ISO 8601 string or null")
    return JSONResponse(
        await rt.registry.ask(name, "facts", lambda reply: ImportFacts(facts=facts, reply=reply), timeout=rt.settings.server.settle_timeout_seconds)
    )
