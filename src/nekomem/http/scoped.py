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
  reference makes one call for the batch); 502 only when every segment failed. With
  ``idempotency_key`` (and ``client_requested_at``) a completed write is recorded in the
  character's ``idempotency_keys.json`` (:mod:`nekomem.stores.scoped_keys`): a retry under
  the key answers the recorded answer with ``duplicate: true`` and extracts nothing; the
  same key on a different request is 422 ``idempotency_key_reused``; a keyed batch with a
  failed segment leaves its key open;
- ``POST scoped_context`` ``{subjects (1..8), language?}`` -> ``text/plain`` context;
- ``POST scoped_mentions`` ``{response_text, subjects}`` -> ``{"status": "recorded" |
  "skipped"}``;
- ``POST scoped_forget`` ``{subject}`` -> ``{"status": "forgotten", "subject", "removed"}``;
- ``GET scoped_subjects?platform=`` -> ``{"subjects": [...]}``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from nekomem.actors.messages import (
    AddScopedFacts,
    CorrectionsAnswer,
    DeleteEntry,
    ExtractScoped,
    ListCorrections,
    ListEntries,
    RenderContext,
    ScopedMentions,
)
from nekomem.domain.layers import FACTS, PERSONA, Address, layers
from nekomem.domain.locale.context import normalise_language
from nekomem.domain.neko_fields import retired
from nekomem.domain.speaker_identity import normalize_account_id
from nekomem.domain.subjects import (
    Subject,
    SubjectError,
    entry_subject,
    filter_visible,
    make_subject,
    subject_from_request,
    subjects_from_request,
)
from nekomem.http import scoped_epochs as ep
from nekomem.http.bodies import character_name, convert_body, parse_history, read_json_object
from nekomem.http.character_origin import is_new, note_created
from nekomem.http.errors import ApiError
from nekomem.http.prompt_locale import full_code, stored_language
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.wire import answer_response
from nekomem.runtime.clock import iso
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.stores.scoped_keys import KeyStateError, ScopedKeys
from nekomem.stores.scoped_meta import ScopedMeta
from nekomem.wire.answers import DeleteAnswer, MentionsAnswer, PageAnswer, PublicEntry, ScopedCreated

MAX_FACTS = 32
MAX_FACT_CHARS = 2000
MAX_HISTORY_MESSAGES = 200
MAX_SEGMENTS = 8
# One lock per (character, idempotency key), dropped once no request holds or awaits it.
_key_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()
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
    display_name: str | None = None
    speaker_id: str | None = None


class ScopedHistoryBody(msgspec.Struct, kw_only=True):
    """The speaker-trust fields of the reference (speaker_tier, speaker_id, speaker_is_owner,
    speaker_activity_events, speaker_channel, ...) are accepted and not used (docs/NEKO.md:
    "Scoped memory: forget epochs, and what is ignored"); ``display_name`` and ``language``
    are kept for the subject (:mod:`nekomem.stores.scoped_meta`)."""

    subject: dict[str, Any] | None = None
    display_name: str | None = None
    # The speaker's account (``platform:actor``): kept on the facts it yields, with its
    # entity in the trust pool, so an identity forget finds them.
    speaker_id: str | None = None
    input_history: Any = None
    segments: list[ScopedSegment] | None = None
    speaker_label: str | None = None
    language: str | None = None
    subject_epochs: Any = None
    # A keyed write: a retry under the same key is answered from idempotency_keys.json
    # (``duplicate: true``), never extracted again. client_requested_at is kept with it.
    idempotency_key: str | None = None
    client_requested_at: float | None = None


class ScopedContextBody(msgspec.Struct, kw_only=True):
    subjects: Any = None
    language: str | None = None


class ScopedMentionsBody(msgspec.Struct, kw_only=True):
    response_text: str
    subjects: Any = None


class ScopedForgetBody(msgspec.Struct, kw_only=True):
    subject: dict[str, Any]
    forget_epoch: int | None = None


_meta_locks: dict[str, asyncio.Lock] = {}
_STRUCTURAL = str.maketrans("", "", "[]|\r\n\t")


def _display_name(raw: str | None, where: str) -> str | None:
    """A subject's display name from a write: at most 64 characters (422 otherwise),
    structural characters removed (it is shown in a section header); None when empty."""
    value = (raw or "").strip()
    if len(value) > 64:
        raise ApiError(422, "bad_display_name", f"{where}display_name must contain at most 64 characters")
    value = "".join(ch for ch in value.translate(_STRUCTURAL) if ch.isprintable()).strip()
    return value or None


async def _note_write(request: Request, name: str, subject: Subject, display_name: str | None, language: str | None) -> None:
    """Record a write to ``subject``: when, and the display name and language it carried."""
    rt = runtime_of(request)
    locale = full_code(language) if isinstance(language, str) else None
    meta = ScopedMeta(rt.character_paths(name).folder)
    async with _meta_locks.setdefault(name, asyncio.Lock()):
        await asyncio.to_thread(
            functools.partial(meta.update, subject.key, iso(rt.clock.now()), display_name=display_name, prompt_locale=locale)
        )


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


def scoped_layers() -> dict[Address, str | None]:
    """The layers whose entries the scoped routes filter by subject (those whose
    declaration has ``scoped``), each with the ``ListEntries`` status it is listed by."""
    return {spec.address: spec.scoped.status for spec in layers() if spec.scoped is not None}


async def _entries(request: Request, name: str, layer: Address) -> list[PublicEntry]:
    rt = runtime_of(request)
    status = scoped_layers()[layer]
    page = await ask(rt, name, layer, lambda reply: ListEntries(status=status, offset=0, limit=10**9, reply=reply), PageAnswer)
    return page.items


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
    display_name = _display_name(body.display_name, "")
    result = await ask(rt, name, FACTS, lambda reply: AddScopedFacts(subject=subject, facts=items, reply=reply), ScopedCreated)
    await _note_write(request, name, subject, display_name, body.language)
    return JSONResponse({"status": "stored", "subject": subject.fields(), **msgspec.to_builtins(result)})


async def scoped_history(request: Request) -> Response:
    name = character_name(request)
    raw = await read_json_object(request)
    body = convert_body(raw, ScopedHistoryBody)
    new = await is_new(request, name)
    response = await _keyed_history(request, name, raw, body)
    if new:
        await note_created(request, name)  # only noted when the extraction activated it
    return response


async def _keyed_history(request: Request, name: str, raw: dict[str, Any], body: ScopedHistoryBody) -> Response:
    if body.idempotency_key is None:
        return JSONResponse(await _history(request, name, body))
    key = body.idempotency_key.strip()
    limit = runtime_of(request).settings.server.idempotency_key_max_length
    if not key or len(key) > limit:
        raise ApiError(422, "bad_idempotency_key", f"idempotency_key must have 1 to {limit} characters")
    # What the keyed request is, without its retry identity: a retry must be this request.
    fingerprint = hashlib.sha256(
        msgspec.json.encode({k: v for k, v in raw.items() if k not in ("idempotency_key", "client_requested_at")}, order="sorted")
    ).hexdigest()
    rt = runtime_of(request)
    keys = ScopedKeys(rt.character_paths(name).folder)
    lock = _key_locks.setdefault((name, key), asyncio.Lock())
    async with lock:  # a retry arriving while the first attempt runs waits for its outcome
        try:
            record = await asyncio.to_thread(keys.get, key)
        except KeyStateError as exc:
            raise ApiError(503, "idempotency_state_unreadable", str(exc)) from None
        if record is not None and record.get("state") == "done":
            if record.get("request_sha256") not in (None, fingerprint):
                raise ApiError(422, "idempotency_key_reused", "this idempotency_key was used for a different request")
            if isinstance(record.get("answer"), dict):
                return JSONResponse({**record["answer"], "duplicate": True})
        answer = await _history(request, name, body)
        if all(row.get("status") == "ok" for row in answer.get("segments", [])):
            # A keyed batch is done as a whole; with a failed segment the key stays open.
            done = functools.partial(
                keys.mark_done, key, fingerprint, answer, rt.clock.now().timestamp(), client_requested_at=body.client_requested_at
            )
            try:
                await asyncio.to_thread(done)
            except KeyStateError as exc:
                raise ApiError(503, "idempotency_state_unreadable", str(exc)) from None
        return JSONResponse(answer)


async def _history(request: Request, name: str, body: ScopedHistoryBody) -> dict[str, Any]:
    if body.segments is not None:
        if body.subject is not None or body.input_history is not None or body.speaker_label is not None:
            raise ApiError(422, "bad_history", "segments is exclusive with the single-subject fields")
        return await _history_segments(request, name, body.segments, ep.check_epochs(body.subject_epochs), body.language)
    if body.subject is None or body.input_history is None:
        raise ApiError(422, "bad_history", "either segments or input_history+subject is required")
    subject = _subject(body.subject)
    turns = _turns(request, body.input_history, "")
    label = _label(body.speaker_label, "")
    display_name = _display_name(body.display_name, "")
    provenance = await _provenance(request, body.speaker_id, label, "")
    if await ep.fenced(request, name, [subject], ep.check_epochs(body.subject_epochs)):
        result = {"created": 0, "fact_ids": [], "dropped": len(turns), "fenced": True}
    else:
        result = await _extract(request, name, subject, turns, label, provenance)
        await _note_write(request, name, subject, display_name, body.language)
    return {"status": "processed", "subject": subject.fields(), **result, "trust": dict(NO_TRUST), "trust_events": []}


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


async def _provenance(request: Request, raw_id: str | None, label: str, where: str) -> dict[str, str] | None:
    """Who said a scoped history: its account, label and entity (when the pool knows it);
    None without a ``speaker_id``. ApiError 422 for a malformed one (as the reference)."""
    if raw_id is None:
        return None
    account = normalize_account_id(raw_id)
    if account is None:
        raise ApiError(422, "bad_speaker_id", f"{where}invalid speaker_id (expected platform:actor)")
    provenance = {"speaker_id": account}
    if label:
        provenance["speaker_label"] = label
    entity = await asyncio.to_thread(runtime_of(request).speaker_trust.entity_for, account)
    if entity:
        provenance["speaker_entity_id"] = entity
    return provenance


async def _extract(
    request: Request, name: str, subject: Subject, turns: list[Any], label: str, provenance: dict[str, str] | None = None
) -> dict[str, Any]:
    """The facts extracted from one subject's turns, as the JSON fields of its answer."""
    rt = runtime_of(request)
    created = await ask(
        rt,
        name,
        FACTS,
        lambda reply: ExtractScoped(subject=subject, turns=turns, speaker_label=label, provenance=provenance, reply=reply),
        ScopedCreated,
        timeout=rt.settings.server.settle_timeout_seconds,
    )
    fields: dict[str, Any] = msgspec.to_builtins(created)
    return fields


async def _history_segments(
    request: Request, name: str, segments: list[ScopedSegment], epochs: dict[str, int] | None, language: str | None
) -> dict[str, Any]:
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise ApiError(422, "bad_history", f"segments must contain 1..{MAX_SEGMENTS} items")
    parsed = []
    names: list[str | None] = []
    speakers: list[dict[str, str] | None] = []
    for position, segment in enumerate(segments, start=1):
        where = f"segment {position}: "
        subject = _subject(segment.subject)
        label = _label(segment.speaker_label, where)
        parsed.append((subject, _turns(request, segment.input_history, where), label or subject.subject_id))
        names.append(_display_name(segment.display_name, where))
        speakers.append(await _provenance(request, segment.speaker_id, label, where))
    if sum(len(turns) for _s, turns, _l in parsed) > MAX_HISTORY_MESSAGES:
        raise ApiError(422, "bad_history", f"segments must contain at most {MAX_HISTORY_MESSAGES} messages in total")
    fence = await ep.fenced(request, name, [s for s, _t, _l in parsed], epochs)
    kept = [(s, t, lbl, who) for (s, t, lbl), who in zip(parsed, speakers, strict=True) if s.key not in fence]
    done = await asyncio.gather(*(_extract(request, name, s, t, lbl, who) for s, t, lbl, who in kept), return_exceptions=True)
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
    for (subject, _, _), outcome, display_name in zip(parsed, outcomes, names, strict=True):
        ok = not isinstance(outcome, BaseException)
        if ok and subject.key not in fence:
            await _note_write(request, name, subject, display_name, language)
        result = outcome if ok else {"created": 0, "fact_ids": []}
        rows.append({"subject": subject.fields(), "trust": dict(NO_TRUST), "status": "ok" if ok else "failed", "dropped": 0, **result})
    return {"status": "processed", "segments": rows}


def _facts_block(facts: list[PublicEntry], subjects: list[Subject], limit: int) -> str:
    blocks = []
    for subject in subjects:
        rows = sorted(filter_visible(facts, [subject]), key=lambda f: (-int(f.get("importance") or 0), str(f.get("created_at") or "")))
        if rows[:limit]:
            blocks.append("\n".join([f"### {subject.key}", *(f"- {row['text']}" for row in rows[:limit])]))
    return "\n\n".join(blocks)


async def _context_language(request: Request, name: str, subjects: list[Subject], explicit: str | None) -> str:
    """The reference's order: the request's language, else the first subject's kept
    language (from its writes), else the character's stored language, else the setting."""
    if isinstance(explicit, str) and full_code(explicit):
        return explicit
    kept = await asyncio.to_thread(ScopedMeta(runtime_of(request).character_paths(name).folder).read)
    for subject in subjects:
        locale = (kept.get(subject.key) or {}).get("prompt_locale")
        if isinstance(locale, str) and full_code(locale):
            return locale
    return stored_language(request, name) or runtime_of(request).settings.server.context_language


async def scoped_context(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedContextBody)
    subjects = _subjects(body.subjects)
    if not await character_exists(request, name):
        return PlainTextResponse("")
    language = normalise_language(await _context_language(request, name, subjects, body.language), "en")
    longterm = await ask(rt, name, PERSONA, lambda reply: RenderContext(subjects=subjects, language=language, reply=reply), str)
    facts = [f for f in await _entries(request, name, FACTS) if not f.get("archived_at") and not retired(f.get("source_ref"))]
    parts = [p for p in (longterm, _facts_block(facts, subjects, rt.settings.server.scoped_context_max_facts)) if p]
    return PlainTextResponse("\n\n".join(parts))


async def scoped_mentions(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedMentionsBody)
    subjects = _subjects(body.subjects)
    if not body.response_text.strip() or not await character_exists(request, name):
        return answer_response(MentionsAnswer(status="skipped", mentioned=0))
    return answer_response(
        await ask(rt, name, PERSONA, lambda reply: ScopedMentions(subjects=subjects, text=body.response_text, reply=reply), MentionsAnswer)
    )


def _list_entries(status: str | None) -> Callable[[Reply], ListEntries]:
    """The message that lists every entry of ``status`` (bound now: it is built in a loop)."""
    return lambda reply: ListEntries(status=status, offset=0, limit=10**9, reply=reply)


def _delete_entry(entry_id: str) -> Callable[[Reply], DeleteEntry]:
    """The message that deletes entry ``entry_id`` (bound now: it is built in a loop)."""
    return lambda reply: DeleteEntry(id=entry_id, reply=reply)


async def scoped_forget(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = convert_body(await read_json_object(request), ScopedForgetBody)
    subject = _subject(body.subject)
    scoped = scoped_layers()
    removed: dict[str, int] = {layer: 0 for layer in scoped}
    # The tombstone first: a stamped write produced before this erase is dropped even
    # when the deletions below fail and the client retries the forget.
    epoch = await ep.record_forget(request, name, subject, body.forget_epoch)
    if await character_exists(request, name):
        for layer in scoped:
            for entry in filter_visible(await _entries(request, name, layer), [subject]):
                await ask(rt, name, layer, _delete_entry(entry["id"]), DeleteAnswer)
                removed[layer] += 1
        async with _meta_locks.setdefault(name, asyncio.Lock()):
            await asyncio.to_thread(ScopedMeta(rt.character_paths(name).folder).forget, subject.key)
    answer: dict[str, Any] = {"status": "forgotten", "subject": subject.fields(), "removed": removed}
    if epoch is not None:
        answer["forget_epoch"] = epoch
    return JSONResponse(answer)


def _stamp(entry: PublicEntry) -> str:
    return max(str(entry.get(k) or "") for k in ("created_at", "updated_at", "archived_at"))


async def scoped_subjects(request: Request) -> Response:
    """``{"subjects": [row]}``, one row per subject with memories (or a kept record) on
    ``platform``: the subject fields, ``display_name``, the per-layer counts (``facts``
    active, ``facts_archived``, ``reflections``, ``persona``), ``prompt_locale``,
    ``corrections`` (persona contradictions about its entries waiting for the model),
    ``staged`` (always 0: nekomem applies a write in its request and holds nothing
    staged), ``last_write_at`` and ``archived`` (its facts were all archived and nothing
    else of it is active)."""
    rt = runtime_of(request)
    name = character_name(request)
    platform = (request.query_params.get("platform") or "").strip()
    if not await character_exists(request, name):
        return JSONResponse({"subjects": []})
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    ids: dict[tuple[str, str], set[str]] = {}
    # (count key, layer, ListEntries status): each scoped layer's counts, as declared.
    counted = [(key, spec.address, status) for spec in layers() if spec.scoped is not None for key, status in spec.scoped.counts]

    def row_of(subject: Subject) -> dict[str, Any] | None:
        if platform and subject.subject_id.split(":", 1)[0] != platform:
            return None
        ids.setdefault(subject.marker, set())
        return rows.setdefault(
            subject.marker,
            {
                **subject.fields(),
                "display_name": None,
                **{key: 0 for key, _layer, _status in counted},
                "prompt_locale": None,
                "corrections": 0,
                "staged": 0,
                "last_write_at": None,
                "archived": False,
            },
        )

    for count, layer, status in counted:
        page = await ask(rt, name, layer, _list_entries(status), PageAnswer)
        for entry in page.items:
            subject = entry_subject(entry) if isinstance(entry, dict) else None
            row = row_of(subject) if subject is not None else None
            if subject is None or row is None:
                continue
            row[count] += 1
            ids[subject.marker].add(str(entry.get("id")))
            stamp = _stamp(entry)
            if stamp and stamp > (row["last_write_at"] or ""):
                row["last_write_at"] = stamp
    kept = await asyncio.to_thread(ScopedMeta(rt.character_paths(name).folder).read)
    for key, record in kept.items():
        kind, _, subject_id = key.partition(":")
        try:
            subject = make_subject(kind, subject_id)
        except SubjectError:
            continue
        row = row_of(subject)
        if row is None:
            continue
        row["display_name"] = record.get("display_name") or None
        row["prompt_locale"] = record.get("prompt_locale") or None
        written = str(record.get("last_write_at") or "")
        if written > (row["last_write_at"] or ""):
            row["last_write_at"] = written
    corrections = (await ask(rt, name, PERSONA, lambda reply: ListCorrections(reply=reply), CorrectionsAnswer)).items
    for marker, row in rows.items():
        row["corrections"] = sum(1 for c in corrections if c.old_entry_id in ids[marker] or c.source_id in ids[marker])
        row["archived"] = row["facts_archived"] > 0 and row["facts"] == row["reflections"] == row["persona"] == 0
    return JSONResponse({"subjects": list(rows.values())})
