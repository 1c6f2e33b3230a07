"""The group-chat memory routes of the reference (its QQ plugin's memory bridge):
``/internal/memory/{name}/scoped_{context,mentions,history,forget,facts,subjects}``.

Every read is fail-closed (nekomem.domain.subjects): it serves only entries of the named
subjects, never the owner's private memory. Shapes follow the reference:

- ``POST scoped_facts`` ``{subject, facts: [{text, importance?, source?}] (1..32)}`` ->
  ``{"status": "stored", "subject", "created", "fact_ids"}``;
- ``POST scoped_history`` ``{subject, input_history (1..200 messages), speaker_label?}`` ->
  ``{"status": "processed", "subject", "created", "fact_ids", "trust", "trust_events"}``;
  502 when extraction fails (retry later). The batched shape ``{segments: [{subject,
  input_history, speaker_label}] (1..8, 200 messages in all)}`` answers ``{"status":
  "processed", "segments": [{"subject", "status": "ok" | "failed", "created", "dropped",
  "fact_ids", "trust"}]}`` in request order (one extraction per segment here, where the
  reference makes one call for the batch); 502 only when every segment failed;
- ``POST scoped_context`` ``{subjects (1..8), language?}`` -> ``text/plain`` context;
- ``POST scoped_mentions`` ``{response_text, subjects}`` -> ``{"status": "recorded" |
  "skipped"}``;
- ``POST scoped_forget`` ``{subject}`` -> ``{"status": "forgotten", "subject", "removed"}``;
- ``GET scoped_subjects?platform=`` -> ``{"subjects": [...]}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from nekomem.actors.messages import AddScopedFacts, DeleteEntry, ExtractScoped, ListEntries, RenderContext, ScopedMentions
from nekomem.domain.context_locale import normalise_language
from nekomem.domain.subjects import Subject, SubjectError, entry_subject, filter_visible, subject_from_request, subjects_from_request
from nekomem.http import scoped_epochs as ep
from nekomem.http.bodies import character_name, convert_body, parse_history, read_json_object
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import JsonAnswer, ask, runtime_of
from nekomem.runtime.clock import iso
from nekomem.runtime.reply import ActorFailure, Reply

MAX_FACTS = 32
MAX_FACT_CHARS = 2000
MAX_HISTORY_MESSAGES = 200
MAX_SEGMENTS = 8
LAYER_STATUS = {"facts": "all", "reflections": None, "persona": None}
NO_TRUST = {"resolved": None, "persisted": None, "signals_applied": 0, "activity_applied": 0, "gated": None, "channel_collision": False}


class ScopedFactItem(msgspec.Struct, kw_only=True):
    text: str
    importance: int = 5
    source: str | None = None


class ScopedFactsBody(msgspec.Struct, kw_only=True):
    subject: dict[str, Any]
    facts: list[ScopedFactItem]
    display_name: str | None = None
    language: str | None = None


class ScopedSegment(msgspec.Struct, kw_only=True):
    subject: dict[str, Any]
    input_history: Any
    speaker_label: str = ""


class ScopedHistoryBody(msgspec.Struct, kw_only=True):
    """The speaker-trust fields of the reference (speaker_tier, speaker_id, speaker_is_owner,
    speaker_activity_events, speaker_channel, display_name, ...) are accepted and not used
    (docs/NEKO.md: "Scoped memory: forget epochs, and what is ignored")."""

    subject: dict[str, Any] | None = None
    input_history: Any = None
    segments: list[ScopedSegment] | None = None
    speaker_label: str | None = None
    language: str | None = None
    subject_epochs: Any = None


class ScopedContextBody(msgspec.Struct, kw_only=True):
    subjects: Any = None
    language: str | None = None


class ScopedMentionsBody(msgspec.Struct, kw_only=True):
    response_text: str
    subjects: Any = None


class ScopedForgetBody(msgspec.Struct, kw_only=True):
    subject: dict[str, Any]
    forget_epoch: int | None = None


def _subject(raw: Any) -> Subject:
    try:
        return subject_from_request(raw)
    except SubjectError as exc:
        raise ApiError(422, "bad_subject", str(exc)) from None


def _subjects(raw: Any) -> list[Subject]:
    try:
        subjects = subjects_from_request(raw)
    except SubjectError as exc:
        raise ApiError(422, "bad_subjects", str(exc)) from None
    if subjects is None:
        raise ApiError(422, "bad_subjects", "subjects are required (1..8 items)")
    return subjects


async def _entries(request: Request, name: str, layer: str) -> list[dict[str, Any]]:
    rt = runtime_of(request)
    status = LAYER_STATUS[layer]
    page = await ask(rt, name, layer, lambda reply: ListEntries(status=status, offset=0, limit=10**9, reply=reply), JsonAnswer)
    return [item for item in page["items"] if isinstance(item, dict)]


async def scoped_facts(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedFactsBody)
    subject = _subject(body.subject)
    if not 1 <= len(body.facts) <= MAX_FACTS:
        raise ApiError(422, "bad_facts", f"facts must contain 1..{MAX_FACTS} items")
    items: list[Mapping[str, object]] = []
    for item in body.facts:
        text = item.text.strip()
        if not text or len(text) > MAX_FACT_CHARS:
            raise ApiError(422, "bad_facts", f"each fact text must contain 1..{MAX_FACT_CHARS} characters")
        items.append({"text": text, "importance": item.importance, "entity": "master"})
    result = await ask(rt, name, "facts", lambda reply: AddScopedFacts(subject=subject, facts=items, reply=reply), JsonAnswer)
    return JSONResponse({"status": "stored", "subject": subject.fields(), **result})


async def scoped_history(request: Request) -> Response:
    name = character_name(request)
    raw = await read_json_object(request)
    body = convert_body(raw, ScopedHistoryBody)
    if body.segments is not None:
        if body.subject is not None or body.input_history is not None or body.speaker_label is not None:
            raise ApiError(422, "bad_history", "segments is exclusive with the single-subject fields")
        return await _history_segments(request, name, body.segments, ep.check_epochs(body.subject_epochs))
    if body.subject is None or body.input_history is None:
        raise ApiError(422, "bad_history", "either segments or input_history+subject is required")
    subject = _subject(body.subject)
    turns = _turns(request, body.input_history, "")
    label = _label(body.speaker_label, "")
    if await ep.fenced(request, name, [subject], ep.check_epochs(body.subject_epochs)):
        result = {"created": 0, "fact_ids": [], "dropped": len(turns), "fenced": True}
    else:
        result = await _extract(request, name, subject, turns, label)
    return JSONResponse({"status": "processed", "subject": subject.fields(), **result, "trust": dict(NO_TRUST), "trust_events": []})


def _turns(request: Request, history: Any, where: str) -> list[Any]:
    rt = runtime_of(request)
    turns = parse_history({"input_history": history}, iso(rt.clock.now()), rt.settings.server.message_max_chars, MAX_HISTORY_MESSAGES)
    if not turns:
        raise ApiError(422, "bad_history", f"{where}input_history must contain 1..{MAX_HISTORY_MESSAGES} messages")
    return turns


def _label(raw: str | None, where: str) -> str:
    label = (raw or "").strip()
    if len(label) > 64:
        raise ApiError(422, "bad_speaker_label", f"{where}speaker_label must contain at most 64 characters")
    return label


async def _extract(request: Request, name: str, subject: Subject, turns: list[Any], label: str) -> dict[str, Any]:
    rt = runtime_of(request)
    return await ask(
        rt,
        name,
        "facts",
        lambda reply: ExtractScoped(subject=subject, turns=turns, speaker_label=label, reply=reply),
        JsonAnswer,
        timeout=rt.settings.server.settle_timeout_seconds,
    )


async def _history_segments(request: Request, name: str, segments: list[ScopedSegment], epochs: dict[str, int] | None) -> Response:
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise ApiError(422, "bad_history", f"segments must contain 1..{MAX_SEGMENTS} items")
    parsed = []
    for position, segment in enumerate(segments, start=1):
        where = f"segment {position}: "
        subject = _subject(segment.subject)
        parsed.append((subject, _turns(request, segment.input_history, where), _label(segment.speaker_label, where) or subject.subject_id))
    if sum(len(turns) for _s, turns, _l in parsed) > MAX_HISTORY_MESSAGES:
        raise ApiError(422, "bad_history", f"segments must contain at most {MAX_HISTORY_MESSAGES} messages in total")
    fence = await ep.fenced(request, name, [s for s, _t, _l in parsed], epochs)
    kept = [(s, t, lbl) for s, t, lbl in parsed if s.key not in fence]
    done = await asyncio.gather(*(_extract(request, name, s, t, lbl) for s, t, lbl in kept), return_exceptions=True)
    by_subject = iter(done)
    outcomes: list[Any] = [
        {"created": 0, "fact_ids": [], "dropped": len(t), "fenced": True} if s.key in fence else next(by_subject) for s, t, _l in parsed
    ]
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, (ActorFailure, asyncio.TimeoutError)):
            raise outcome
    if all(isinstance(o, BaseException) for o in outcomes):
        raise ApiError(502, "extraction_failed", "scoped fact extraction failed; retry later")
    rows = []
    for (subject, _, _), outcome in zip(parsed, outcomes, strict=True):
        ok = not isinstance(outcome, BaseException)
        result = outcome if ok else {"created": 0, "fact_ids": []}
        rows.append({"subject": subject.fields(), "trust": dict(NO_TRUST), "status": "ok" if ok else "failed", "dropped": 0, **result})
    return JSONResponse({"status": "processed", "segments": rows})


def _facts_block(facts: list[dict[str, Any]], subjects: list[Subject], limit: int) -> str:
    blocks = []
    for subject in subjects:
        rows = sorted(filter_visible(facts, [subject]), key=lambda f: (-int(f.get("importance") or 0), str(f.get("created_at") or "")))
        if rows[:limit]:
            blocks.append("\n".join([f"### {subject.key}", *(f"- {row['text']}" for row in rows[:limit])]))
    return "\n\n".join(blocks)


async def scoped_context(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedContextBody)
    subjects = _subjects(body.subjects)
    if not await character_exists(request, name):
        return PlainTextResponse("")
    language = normalise_language(body.language, normalise_language(rt.settings.server.context_language))
    longterm = await ask(rt, name, "persona", lambda reply: RenderContext(subjects=subjects, language=language, reply=reply), str)
    facts = [f for f in await _entries(request, name, "facts") if not f.get("archived_at")]
    parts = [p for p in (longterm, _facts_block(facts, subjects, rt.settings.server.scoped_context_max_facts)) if p]
    return PlainTextResponse("\n\n".join(parts))


async def scoped_mentions(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedMentionsBody)
    subjects = _subjects(body.subjects)
    if not body.response_text.strip() or not await character_exists(request, name):
        return JSONResponse({"status": "skipped", "mentioned": 0})
    return JSONResponse(
        await ask(rt, name, "persona", lambda reply: ScopedMentions(subjects=subjects, text=body.response_text, reply=reply), JsonAnswer)
    )


def _delete_entry(entry_id: str) -> Callable[[Reply], DeleteEntry]:
    """The message that deletes entry ``entry_id`` (bound now: it is built in a loop)."""
    return lambda reply: DeleteEntry(id=entry_id, reply=reply)


async def scoped_forget(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedForgetBody)
    subject = _subject(body.subject)
    removed = {layer: 0 for layer in LAYER_STATUS}
    # The tombstone first: a stamped write produced before this erase is dropped even
    # when the deletions below fail and the client retries the forget.
    epoch = await ep.record_forget(request, name, subject, body.forget_epoch)
    if await character_exists(request, name):
        for layer in LAYER_STATUS:
            for entry in filter_visible(await _entries(request, name, layer), [subject]):
                await ask(rt, name, layer, _delete_entry(entry["id"]), JsonAnswer)
                removed[layer] += 1
    answer: dict[str, Any] = {"status": "forgotten", "subject": subject.fields(), "removed": removed}
    if epoch is not None:
        answer["forget_epoch"] = epoch
    return JSONResponse(answer)


async def scoped_subjects(request: Request) -> Response:
    name = character_name(request)
    platform = (request.query_params.get("platform") or "").strip()
    if not await character_exists(request, name):
        return JSONResponse({"subjects": []})
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for layer in LAYER_STATUS:
        for entry in await _entries(request, name, layer):
            subject = entry_subject(entry)
            if subject is not None and (not platform or subject.subject_id.split(":", 1)[0] == platform):
                seen.setdefault(subject.marker, subject.fields())
    return JSONResponse({"subjects": list(seen.values())})
