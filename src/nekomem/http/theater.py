"""The reference's numeric-theater routes: the capsule write of /cache and
``/internal/memory/{name}/theater/{stories,forget,retract}``.

Semantics (read from the reference's memory server; the rules live in
:mod:`nekomem.domain.theater`, the writes in :mod:`nekomem.layers.recent.theater`):

- ``POST /cache/{name}`` with exactly one theater episode capsule (message
  ``metadata.source=theater_numeric_v2``, ``memory_tier=episode_summary``) upserts it by
  (story, session): posted twice, stored once. ``idempotency_key`` (at most 160
  characters) is the archive request id, ``theater_archive_attempt`` its attempt;
  with a retraction or forget tombstone matching, the answer is
  ``{"status": "retracted", "count": 0}`` and nothing is stored. A key on any other batch
  is refused (400 ``idempotency_key_requires_theater_episode``), as the reference refuses it.
- ``GET .../theater/stories`` -> ``{"ok": true, "stories": [{story_id, title,
  memory_summaries}]}`` (404 ``character_not_found`` for an unknown character).
- ``POST .../theater/forget`` ``{"story_id"}`` -> ``{"ok", "removed_recent",
  "removed_time_index", "forget_marker"}``.
- ``POST .../theater/retract`` ``{story_id, session_id, archive_through_revision,
  archive_request_id?, archive_attempt?}`` -> ``{"ok", "removed_recent",
  "removed_time_index"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import TheaterForget, TheaterRetract, TheaterWrite
from nekomem.domain import theater
from nekomem.domain.layers import RECENT
from nekomem.domain.turns import Turn
from nekomem.http.bodies import character_name, decode_body
from nekomem.http.errors import ApiError
from nekomem.http.operations import Operation, Parameter
from nekomem.http.readonly import character_exists
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.schemas import Body, HistoryBody, TheaterForgetAnswer, TheaterRetractAnswer, WriteAnswer
from nekomem.runtime.protocol import Message
from nekomem.runtime.reply import Reply

T = TypeVar("T")

KEY_MAX = 160
Ident = Annotated[str, Meta(min_length=1, max_length=256)]


Text = Annotated[str, Meta(max_length=100_000)] | None
Count = Annotated[int, Meta(ge=0)] | None


class TheaterMessageMeta(msgspec.Struct, kw_only=True):
    """The fields the theater code reads of a theater message's ``metadata`` (any other
    key is kept as sent). Checked at the edge so that no value can fail the recent
    actor. ``performed_at`` is taken as liberally as the reference takes it (any value:
    one that is no time is kept as sent and the capsule is journaled without a time),
    and an epoch number or a slash date is converted to ISO 8601
    (:func:`nekomem.domain.theater.performed_at_iso`)."""

    story_id: Annotated[str, Meta(max_length=256)] | int | None = None
    session_id: Annotated[str, Meta(max_length=256)] | int | None = None
    story_title: Text = None
    episode_status: Text = None
    ending_title: Text = None
    episode_summary: Text = None
    ending_summary: Text = None
    archive_through_revision: Count = None
    run_index: Count = None
    story_run_count: Count = None
    ending_titles_seen: list[Annotated[str, Meta(max_length=10_000)]] | None = None
    performed_at: Any = None


def checked_theater_turn(turn: Turn, index: int) -> Turn:
    """``turn`` when it is no theater message; else with its metadata checked (ids as
    strings, a ``performed_at`` that reads as a time as an ISO string, the server's own
    previous-version key dropped). Raises ApiError 422 ``bad_theater_metadata`` naming
    the field."""
    meta = turn.metadata
    if not meta or meta.get("source") != theater.THEATER_SOURCE:
        return turn
    where = f"input_history[{index}].metadata"
    try:
        checked = msgspec.convert(meta, TheaterMessageMeta)
    except msgspec.ValidationError as exc:
        raise ApiError(422, "bad_theater_metadata", str(exc).replace("`$", f"`{where}")) from None
    fixed = {k: v for k, v in meta.items() if k != theater.PREVIOUS_KEY}
    for key in ("story_id", "session_id"):
        if isinstance(fixed.get(key), int):
            fixed[key] = str(fixed[key])
    try:
        performed_at = theater.performed_at_iso(checked.performed_at)
    except ValueError:
        # The reference stores such a capsule with no time (it reads only an ISO string):
        # kept as sent, journaled without a time (theater.stored_performed_at).
        performed_at = None
    if performed_at is not None:
        fixed["performed_at"] = performed_at
    return msgspec.structs.replace(turn, metadata=fixed)


class TheaterForgetBody(Body):
    story_id: Ident


class TheaterRetractBody(Body):
    story_id: Ident
    session_id: Ident
    archive_through_revision: Annotated[int, Meta(ge=0)]
    archive_request_id: Annotated[str, Meta(max_length=KEY_MAX)] = ""
    archive_attempt: Annotated[int, Meta(ge=0)] = 0


class TheaterStory(msgspec.Struct):
    story_id: str
    title: str
    memory_summaries: list[str]


class TheaterStoriesAnswer(msgspec.Struct):
    ok: bool
    stories: list[TheaterStory]


async def _ask(request: Request, name: str, make: Callable[[Reply], Message], answer: type[T]) -> T:
    rt = runtime_of(request)
    return await ask(rt, name, RECENT, make, answer, timeout=rt.settings.server.ask_timeout_seconds)


async def theater_write(request: Request, name: str, turns: list[Turn], body: HistoryBody) -> Response:
    """/cache of a theater capsule (or of a batch carrying a body ``idempotency_key``)."""
    key = (body.idempotency_key or "").strip()
    if len(key) > KEY_MAX:
        raise ApiError(400, "idempotency_key_too_long", f"idempotency_key has {len(key)} characters; the limit is {KEY_MAX}")
    if not turns:
        return JSONResponse(msgspec.to_builtins(WriteAnswer(status="cached", count=0)))
    if len(turns) != 1 or not theater.is_capsule(turns[0]):
        # Only a theater capsule write is idempotent (an upsert by story and session);
        # an ordinary batch has no such identity, so the key is refused, not ignored.
        raise ApiError(
            400,
            "idempotency_key_requires_theater_episode",
            "idempotency_key is accepted only with a single theater episode message (metadata.source=theater_numeric_v2)",
        )
    result = await _ask(
        request,
        name,
        lambda reply: TheaterWrite(
            turn=turns[0],
            archive_request_id=key,
            archive_attempt=body.theater_archive_attempt,
            forget_marker=body.theater_forget_marker or None,
            reply=reply,
        ),
        WriteAnswer,
    )
    return JSONResponse(msgspec.to_builtins(result))


async def stories(request: Request) -> Response:
    from nekomem.http.runtime_access import recent_view

    name = character_name(request)
    if not await character_exists(request, name):
        raise ApiError(404, "character_not_found", "no memory is stored for this character")
    view = await recent_view(request, name, wait_settle=False)
    return JSONResponse({"ok": True, "stories": theater.stories(view.window)})


async def forget(request: Request) -> Response:
    name = character_name(request)
    body = await decode_body(request, TheaterForgetBody)
    story_id = body.story_id.strip()
    if not story_id:
        raise ApiError(422, "story_id_required", "story_id must not be blank")
    return JSONResponse(
        msgspec.to_builtins(await _ask(request, name, lambda reply: TheaterForget(story_id=story_id, reply=reply), TheaterForgetAnswer))
    )


async def retract(request: Request) -> Response:
    name = character_name(request)
    body = await decode_body(request, TheaterRetractBody)
    story_id, session_id = body.story_id.strip(), body.session_id.strip()
    if not story_id or not session_id:
        raise ApiError(422, "theater_episode_identity_required", "story_id and session_id must not be blank")
    result = await _ask(
        request,
        name,
        lambda reply: TheaterRetract(
            story_id=story_id,
            session_id=session_id,
            through_revision=body.archive_through_revision,
            archive_request_id=body.archive_request_id.strip(),
            archive_attempt=body.archive_attempt,
            reply=reply,
        ),
        TheaterRetractAnswer,
    )
    return JSONResponse(msgspec.to_builtins(result))


_NAME: Parameter = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def operations() -> list[Operation]:
    t = "/internal/memory/{name:str}/theater"
    return [
        Operation(f"{t}/stories", "GET", stories, "Theater stories kept in memory", [_NAME], answer=TheaterStoriesAnswer),
        Operation(f"{t}/forget", "POST", forget, "Forget a theater story", [_NAME], TheaterForgetBody, TheaterForgetAnswer),
        Operation(
            f"{t}/retract", "POST", retract, "Take back a declined theater archive", [_NAME], TheaterRetractBody, TheaterRetractAnswer
        ),
    ]
