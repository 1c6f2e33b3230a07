"""Recall routes: ``POST /query_memory/{name}`` and the ``recall_memory`` tool schema.

``/query_memory`` takes ``{"query"?: str, "time"?: str, "render"?: "markdown",
"language"?: str, "subjects"?: [{subject_kind, subject_id, scope?}]}``. Neither query nor
time is a no-op answered 200 with no rows (the reference's short-circuit); a field of the
wrong type is 422. ``subjects`` scopes the read to those group/participant subjects and
never returns the owner's private memory; an empty list is 422 (fail closed). Timestamps of
the rows are given in the display time zone, so their first 10 characters are the local
date. Time expressions resolve against the server clock in the
display time zone; one that does not parse is ignored; one longer than
``time_max_chars`` or with more than ``time_max_relations`` relation words is 422. Any failure inside recall answers
200 with ``results: []`` and ``error_code: "hybrid_recall_failed"``, never a 500.
With ``render: "markdown"`` the answer also carries ``markdown``, the text block a
``recall_memory`` tool call hands back to the model.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, tzinfo
from typing import Any

import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import QueryMemory
from nekomem.config.server import ServerSettings
from nekomem.domain.layers import RECALL
from nekomem.domain.recall_render import (
    no_result_text,
    normalise_language,
    recall_tool_schema,
    render_recall_block,
)
from nekomem.domain.subjects import Subject, SubjectError, subjects_from_request
from nekomem.domain.tokens import get_counter
from nekomem.http.bodies import character_name, decode_body
from nekomem.http.conversation import display_now
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists, local_iso
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.schemas import QueryBody, RecallAnswer, RecallResult
from nekomem.recall.response import empty_response
from nekomem.recall.timewindow import relation_count
from nekomem.runtime.reply import ActorFailure

log = logging.getLogger("nekomem.http.recall")


def _optional_str(body: dict[str, Any], key: str) -> str:
    """``body[key]`` stripped ("" when absent or null); ApiError 422 when not a string
    (for routes that read a JSON object by hand, such as the browser's recall_explain)."""
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ApiError(422, "schema_violation", f"'{key}' must be a string")
    return value.strip()


def checked_time(spec: str, settings: ServerSettings) -> str:
    """``spec`` when it is within the time bounds of ``settings``; ApiError 422
    ``time_too_long`` / ``time_too_deep`` otherwise (checked in linear time, before any
    parsing reaches an actor worker)."""
    if len(spec) > settings.time_max_chars:
        raise ApiError(422, "time_too_long", f"'time' has {len(spec)} characters; at most {settings.time_max_chars} are accepted")
    relations = relation_count(spec)
    if relations > settings.time_max_relations:
        raise ApiError(
            422,
            "time_too_deep",
            f"'time' nests {relations} relations ('before', 'after', 'of', の, 前...); at most {settings.time_max_relations} are accepted",
        )
    return spec


async def query_memory(request: Request) -> Response:
    name = character_name(request)
    body = await decode_body(request, QueryBody)
    spec = checked_time((body.time or "").strip(), runtime_of(request).settings.server)
    try:
        subjects = subjects_from_request(body.subjects)
    except SubjectError as exc:
        raise ApiError(422, "bad_subjects", str(exc)) from None
    answer = await _recall(request, name, (body.query or "").strip(), spec, subjects, body.render, body.language, explicit=True)
    return JSONResponse(msgspec.to_builtins(answer))


async def search_for_memory(request: Request) -> Response:
    """``GET /search_for_memory/{name}/{query}`` (the reference plugin server's memory query,
    which reads the answer as JSON): the recall block for ``query`` as one JSON string. The
    reference answers a placeholder there ("semantic memory offline"); nekomem answers the
    same block ``/query_memory`` renders for ``render: "markdown"``."""
    name = character_name(request)
    query = str(request.path_params.get("query") or "").strip()
    language = request.query_params.get("language")
    answer = await _recall(request, name, query, "", None, "markdown", language)
    return JSONResponse(answer.markdown)


async def _recall(
    request: Request,
    name: str,
    query: str,
    spec: str,
    subjects: list[Subject] | None,
    render: str | None,
    language_raw: str | None,
    explicit: bool = False,
) -> RecallAnswer:
    """The recall answer for ``query``/``spec`` (``explicit``: a /query_memory call, which
    recall_llm_rerank may re-rank)."""
    rt = runtime_of(request)
    now = display_now(request)
    if not query and not spec or not await character_exists(request, name):
        answer = empty_response(query)
    else:
        try:
            answer = await ask(
                rt,
                name,
                RECALL,
                lambda reply: QueryMemory(query=query, time=spec, now=now, subjects=subjects, explicit=explicit, reply=reply),
                RecallAnswer,
            )
        except (ActorFailure, TimeoutError) as exc:
            log.warning("recall failed for a character: %s", getattr(exc, "code", type(exc).__name__))
            answer = empty_response(query, error=True)
    return await _shaped(answer, request, now, render, language_raw, asked_both=bool(query and spec))


async def _shaped(
    answer: RecallAnswer, request: Request, now: datetime, render: str | None, language_raw: str | None, *, asked_both: bool
) -> RecallAnswer:
    """The recall layer's ``answer`` as the wire has it, finished here and only here: the
    rows' times in the display time zone (``now``'s), and with ``render: "markdown"`` the
    block for a model (in ``language_raw``, else the ``recall_render_language``
    setting; no rows for a query and a time: the hint to loosen one). Encoding it is
    ``msgspec.to_builtins`` (field order is key order, UNSET fields are left out)."""
    tz = now.tzinfo
    rows = [_local_row(row, tz) for row in answer.results]
    answer = msgspec.structs.replace(answer, results=rows)
    if render != "markdown":
        return answer
    rt = runtime_of(request)
    settings = rt.settings.recall
    language = normalise_language(language_raw, settings.recall_render_language)
    if rows:
        counter = get_counter(rt.settings.recent.recent_tokenizer_encoding)
        # Token counting of long texts is CPU work: off the event loop.
        markdown, _kept = await asyncio.to_thread(
            render_recall_block, msgspec.to_builtins(rows), now=now, language=language, counter=counter, settings=settings
        )
    else:
        loosen = asked_both and answer.error_code is UNSET
        markdown = no_result_text(language, answer.query, loosen=loosen)
    return msgspec.structs.replace(answer, markdown=markdown)


def _local_row(row: RecallResult, tz: tzinfo | None) -> RecallResult:
    """``row`` with its times in ``tz`` (a naive or unparsable time stays as stored)."""
    return msgspec.structs.replace(
        row,
        created_at=local_iso(row.created_at, tz),
        event_start_at=local_iso(row.event_start_at, tz),
        event_end_at=local_iso(row.event_end_at, tz),
    )


async def recall_tool(request: Request) -> Response:
    rt = runtime_of(request)
    language = normalise_language(request.query_params.get("language"), rt.settings.recall.recall_render_language)
    return JSONResponse(recall_tool_schema(language))
