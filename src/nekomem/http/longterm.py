"""Long-term memory routes: /reflect, surfacing, and the /api/characters memory API."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import (
    DeleteEntry,
    EditEntry,
    EntryAnswer,
    Feedback,
    FollowupTopics,
    GetRecent,
    ImportCard,
    ImportFacts,
    ListEntries,
    RecentView,
    RecordSurfaced,
    ReflectNow,
    RenderBlock,
    RenderContext,
    Report,
)
from nekomem.domain.layers import FACTS, PERSONA, RECENT, REFLECTIONS, layers, listings
from nekomem.http.bodies import bounded_opaque, character_name, decode_body, decode_json, read_body
from nekomem.http.character_origin import is_new, note_created, require_character
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.schemas import CardBody, EntryEdit, FactsBody, FeedbackBody, RecentEdit, RecordSurfacedBody, ReflectAnswer
from nekomem.http.wire import answer_response
from nekomem.runtime.runtime import Runtime
from nekomem.wire.answers import (
    CardImportAnswer,
    DeleteAnswer,
    ImportAnswer,
    PageAnswer,
    SurfacedAnswer,
    TopicsAnswer,
)


async def render_longterm(request: Request, name: str, language: str = "en", master_name: str = "") -> str:
    """The persona + reflection sections of /new_dialog (used by the conversation routes),
    then the block of each layer declared with ``render``, in start order."""
    rt = runtime_of(request)
    text = await ask(rt, name, PERSONA, lambda reply: RenderContext(language=language, master_name=master_name, reply=reply), str)
    for spec in layers():
        if spec.render:
            block = await ask(
                rt, name, spec.address, lambda reply: RenderBlock(language=language, master_name=master_name, reply=reply), str
            )
            text = "\n\n".join(part for part in (text, block) if part)
    return text


# What /reflect answers for an unknown character (as for one with no facts), without creating it.
UNKNOWN_REFLECT = ReflectAnswer(reflection=None, synthesis={"status": "not_enough_facts"}, confirmed=[], promotion=[], auto_transitions=0)


async def reflect(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if await is_new(request, name):
        return answer_response(UNKNOWN_REFLECT)
    report = await ask(rt, name, FACTS, lambda reply: ReflectNow(reply=reply), Report, timeout=rt.settings.server.settle_timeout_seconds)
    return answer_response(_reflect_answer(report))


def _reflect_answer(report: Report) -> ReflectAnswer:
    """The wire form of /reflect's report: the reflection it created, if any, and how many
    reflections changed state on their own (confirmed, promoted, merged, duplicates)."""
    synthesis = report.synthesis or {}
    reflection = None
    if synthesis.get("status") == "created":
        reflection = {"id": synthesis["reflection_id"], "text": synthesis.get("text", "")}
    confirmed = report.confirmed or []
    promotion = report.promotion or []
    moved = sum(1 for p in promotion if p.get("kind") in ("promoted", "merged", "duplicate"))
    return ReflectAnswer(
        reflection=reflection,
        synthesis=synthesis,
        confirmed=list(confirmed),
        promotion=list(promotion),
        auto_transitions=len(confirmed) + moved,
    )


async def followup_topics(request: Request) -> Response:
    name = character_name(request)
    if not await character_exists(request, name):
        return answer_response(TopicsAnswer(topics=[]))
    return answer_response(await ask(runtime_of(request), name, REFLECTIONS, lambda reply: FollowupTopics(reply=reply), TopicsAnswer))


async def record_surfaced(request: Request) -> Response:
    name = character_name(request)
    raw = await read_body(request)
    if raw.strip():
        try:
            ids = decode_json(raw, RecordSurfacedBody, runtime_of(request).settings.server.body_max_depth).reflection_ids
        except ApiError as exc:
            if exc.code != "schema_violation":
                raise
            raise ApiError(422, "bad_reflection_ids", f"'reflection_ids' must be an array of strings: {exc.message}") from None
    else:
        ids = None
    if not ids:
        return answer_response(SurfacedAnswer(ok=True, recorded=0))  # the reference's no-op
    if not await character_exists(request, name):
        return answer_response(SurfacedAnswer(ok=True, recorded=0))
    return answer_response(
        await ask(runtime_of(request), name, REFLECTIONS, lambda reply: RecordSurfaced(ids=ids, reply=reply), SurfacedAnswer)
    )


async def list_all_characters(request: Request) -> Response:
    rt = runtime_of(request)
    names = await asyncio.to_thread(rt.known_characters)
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
    rt = runtime_of(request)
    name = character_name(request)
    layer = request.path_params["layer"]
    if layer == "export":  # the export holds the character: never a GET a page can send
        raise ApiError(405, "method_not_allowed", f"an export is POST /api/characters/{name}/export with the JSON body {{}}")
    if layer not in listings() and layer != "recent":
        raise ApiError(404, "not_found", f"no layer {layer}")
    if not await character_exists(request, name):
        raise ApiError(404, "unknown_character", "no character of that name")
    if layer == "recent":
        view = await ask(rt, name, RECENT, lambda reply: GetRecent(reply=reply), RecentView)
        items = [{"index": i, "role": t.role, "text": t.text, "ts": t.ts} for i, t in enumerate(view.window)]
        return JSONResponse({"total": len(items), "offset": 0, "items": items, "stored_total": view.stored_total})
    if layer not in listings():
        raise ApiError(404, "not_found", f"no layer {layer}")
    limit_max = rt.settings.server.api_page_max
    status = request.query_params.get("status")
    entity = request.query_params.get("entity")
    offset = _int_param(request, "offset", 0, 0, 10**9)
    limit = _int_param(request, "limit", min(100, limit_max), 1, limit_max)
    return answer_response(
        await ask(
            rt,
            name,
            listings()[layer],
            lambda reply: ListEntries(status=status, entity=entity, offset=offset, limit=limit, reply=reply),
            PageAnswer,
        )
    )


def _bounded_text(text: str, rt: Runtime) -> str:
    """``text`` of an edit when within ``message_max_chars`` (the limit of a message, so an
    edit cannot store what /cache would refuse); ApiError 422 ``text_too_long`` otherwise."""
    limit = rt.settings.server.message_max_chars
    if len(text) > limit:
        raise ApiError(422, "text_too_long", f"text has {len(text)} characters; the limit is {limit}")
    return text


async def edit_entry(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    layer = request.path_params["layer"]
    entry_id = request.path_params["entry_id"]
    await require_character(request, name)
    if layer == "recent":
        from nekomem.actors.messages import EditRecent

        try:
            index = int(entry_id)
        except ValueError:
            raise ApiError(400, "bad_index", "a recent item is addressed by its index") from None
        if request.method == "DELETE":
            text = None
        else:
            text = _bounded_text((await decode_body(request, RecentEdit)).text, rt)
        view = await ask(rt, name, RECENT, lambda reply: EditRecent(index=index, text=text, reply=reply), RecentView)
        return JSONResponse({"total": len(view.window)})
    if layer not in listings():
        raise ApiError(404, "not_found", f"no layer {layer}")
    if request.method == "DELETE":
        return answer_response(await ask(rt, name, listings()[layer], lambda reply: DeleteEntry(id=entry_id, reply=reply), DeleteAnswer))
    edit = await decode_body(request, EntryEdit)
    if isinstance(edit.text, str):
        _bounded_text(edit.text, rt)
    changes = {k: v for k, v in msgspec.structs.asdict(edit).items() if v is not msgspec.UNSET}
    edited = await ask(rt, name, listings()[layer], lambda reply: EditEntry(id=entry_id, changes=changes, reply=reply), EntryAnswer)
    return JSONResponse(edited.entry)


async def feedback(request: Request) -> Response:
    name = character_name(request)
    value = (await decode_body(request, FeedbackBody)).feedback
    rid = request.path_params["reflection_id"]
    await require_character(request, name)
    answer = await ask(runtime_of(request), name, REFLECTIONS, lambda reply: Feedback(id=rid, feedback=value, reply=reply), EntryAnswer)
    return JSONResponse(answer.entry)


async def import_card(request: Request) -> Response:
    name = character_name(request)
    body = await decode_body(request, CardBody)
    entries = [{"entity": e.entity, "text": e.text} for e in body.entries]
    new = await is_new(request, name)
    if new and not entries:
        return answer_response(CardImportAnswer(added=[], skipped_existing=0))  # nothing to store: nothing created
    answer = await ask(runtime_of(request), name, PERSONA, lambda reply: ImportCard(entries=entries, reply=reply), CardImportAnswer)
    if new:
        await note_created(request, name)
    return answer_response(answer)


async def import_facts(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = await decode_body(request, FactsBody)
    facts: list[Mapping[str, object]] = []
    for index, item in enumerate(body.facts):
        fact = {k: v for k, v in msgspec.structs.asdict(item).items() if v is not None}
        if item.source is not None:
            fact["source"] = bounded_opaque(item.source, f"facts[{index}].source", request)
        facts.append(fact)
    new = await is_new(request, name)
    if new and not facts:
        return answer_response(ImportAnswer(added=[], skipped_duplicates=0))  # nothing to store: nothing created
    answer = await ask(
        rt,
        name,
        FACTS,
        lambda reply: ImportFacts(facts=facts, reply=reply),
        ImportAnswer,
        timeout=rt.settings.server.settle_timeout_seconds,
    )
    if new:
        await note_created(request, name)
    return answer_response(answer)
