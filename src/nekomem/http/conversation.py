"""Conversation routes: /cache, /process, /renew, /settle, /new_dialog and friends."""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from nekomem.actors.messages import AppendTurns, WriteMode
from nekomem.config.zones import display_zone
from nekomem.domain import theater
from nekomem.domain.context import gap_seconds, render_new_dialog, render_recent_history
from nekomem.domain.layers import RECENT
from nekomem.domain.locale.context import normalise_language
from nekomem.http.bodies import character_name, decode_history, parse_history, raw_header
from nekomem.http.character_origin import is_new, note_created
from nekomem.http.errors import ApiError
from nekomem.http.prompt_locale import remember_language, stored_language
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, recent_view, runtime_of
from nekomem.http.schemas import WriteAnswer
from nekomem.http.theater import checked_theater_turn, theater_write
from nekomem.runtime.clock import iso

# Write-request ids: unique per process start and request, without a random read per request.
_SESSION_PREFIX = uuid.uuid4().hex[:16]
_SESSION_SEQ = itertools.count(1)


# What each write answers for an empty list (the reference's /cache answer; /process and
# /renew answer "processed", /settle "settled" whatever they stored).
EMPTY_WRITE: dict[WriteMode, WriteAnswer] = {
    "cache": WriteAnswer(status="cached", count=0),
    "process": WriteAnswer(status="processed"),
    "renew": WriteAnswer(status="processed"),
    "settle": WriteAnswer(status="settled"),
}


def _session_id() -> str:
    return f"{_SESSION_PREFIX}{next(_SESSION_SEQ):016x}"


def display_now(request: Request) -> datetime:
    rt = runtime_of(request)
    # None (no zone set): astimezone's local zone at this instant.
    return rt.clock.now().astimezone(display_zone(rt.settings.server.display_timezone))


async def _write(request: Request, mode: WriteMode) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = await decode_history(request)
    server = rt.settings.server
    turns = parse_history(body, iso(rt.clock.now()), server.message_max_chars, server.batch_max_messages, server.body_max_depth)
    turns = [checked_theater_turn(turn, index) for index, turn in enumerate(turns)]
    new = await is_new(request, name)
    if new and not turns:
        # An empty write to an unknown character stores nothing, so it creates nothing.
        return _written(EMPTY_WRITE[mode])
    if mode == "cache" and (body.idempotency_key is not None or (len(turns) == 1 and theater.is_capsule(turns[0]))):
        answer = await theater_write(request, name, turns, body)
        if new:
            await note_created(request, name)
        return answer
    key = raw_header(request, b"idempotency-key")
    if key is not None:
        key = key.strip()
        if not key or len(key) > server.idempotency_key_max_length:
            raise ApiError(400, "bad_idempotency_key", f"Idempotency-Key must have 1 to {server.idempotency_key_max_length} characters")
    timeout = server.ask_timeout_seconds if mode == "cache" else server.settle_timeout_seconds
    result = await ask(
        rt,
        name,
        RECENT,
        lambda reply: AppendTurns(turns=turns, mode=mode, session_id=_session_id(), idempotency_key=key, reply=reply),
        WriteAnswer,
        timeout=timeout,
    )
    await remember_language(request, name, body.language)
    if new:
        await note_created(request, name)
    return _written(result)


def _written(answer: WriteAnswer) -> Response:
    """The wire form of a write's answer (``count`` for /cache only: WriteAnswer leaves a
    None out). Two short fields: msgspec encodes them without json.dumps."""
    return Response(msgspec.json.encode(answer), media_type="application/json")


async def cache(request: Request) -> Response:
    return await _write(request, "cache")


async def process(request: Request) -> Response:
    return await _write(request, "process")


async def renew(request: Request) -> Response:
    return await _write(request, "renew")


async def settle(request: Request) -> Response:
    return await _write(request, "settle")


def context_language(request: Request, name: str | None = None) -> str:
    """The language of a context text: ``language`` (query), else the character's stored
    language (``PUT /prompt-locale/{name}``), else ``render_language`` (query), else the
    ``context_language`` setting (the reference's order)."""
    default = runtime_of(request).settings.server.context_language
    params = request.query_params
    stored = stored_language(request, name) if name and not params.get("language") else None
    return normalise_language(params.get("language") or stored or params.get("render_language"), normalise_language(default))


def master_name(request: Request) -> str:
    """The master's name: the ``master_name`` query parameter, else the setting."""
    given = (request.query_params.get("master_name") or "").strip()
    return given[:100] if given else runtime_of(request).settings.recent.master_name


async def new_dialog(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        return PlainTextResponse("")  # the reference's answer for an unknown character
    await remember_language(request, name, request.query_params.get("language"))
    view = await recent_view(request, name, wait_settle=True)
    longterm = ""
    language, master = context_language(request, name), master_name(request)
    render = request.app.state.longterm_renderer
    if render is not None:
        longterm = await render(request, name, language, master)
    text = render_new_dialog(
        character_name=name,
        master_name=master,
        language=language,
        window=view.window,
        last_timestamp=view.last_timestamp,
        now=display_now(request),
        longterm=longterm,
        gap_notice_seconds=rt.settings.recent.gap_notice_seconds,
        gap_long_seconds=rt.settings.recent.gap_long_seconds,
        shown=view.shown,
    )
    return PlainTextResponse(text)


async def get_recent_history(request: Request) -> Response:
    name = character_name(request)
    language = context_language(request, name)
    if not await character_exists(request, name):
        return PlainTextResponse(render_recent_history([], master_name(request), name, language))
    view = await recent_view(request, name, wait_settle=False)
    return PlainTextResponse(render_recent_history(view.window, master_name(request), name, language, view.shown))


async def last_conversation_gap(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    if not await character_exists(request, name):
        return JSONResponse({"gap_seconds": -1})
    view = await recent_view(request, name, wait_settle=False)
    gap = gap_seconds(view.last_timestamp, rt.clock.now())
    return JSONResponse({"gap_seconds": -1 if gap is None else gap})
