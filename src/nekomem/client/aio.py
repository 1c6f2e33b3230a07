"""``AsyncNekomemClient``: the typed asynchronous client of nekomem's HTTP API (httpx).

Every answer is decoded into the msgspec types the server itself declares
(:mod:`nekomem.http.schemas`); an error answer raises :class:`NekomemError` carrying the
server's JSON error. A 503 (not ready, an actor timeout, a failing disk) is retried up to
``retries`` times, waiting what its ``Retry-After`` asks (or a short backoff without one);
a conversation write carries an ``Idempotency-Key`` so that a retried write is stored once.
A 409 ``storage_startup_blocked`` (the seconds after a start while recovery runs, or limited
mode set by the chat server) is asked again after its ``Retry-After`` until
``max_startup_wait`` seconds of waiting are spent: a script that starts the server, waits
for ``/health`` and calls the client does not fail in the start-up gap. Nothing was stored
by a refused call, so asking again is safe.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import anyio
import httpx
import msgspec
from msgspec import UNSET

from nekomem.client.errors import NekomemError
from nekomem.http.schemas import (
    CardBody,
    CardEntry,
    CharactersAnswer,
    EntryEdit,
    FactImport,
    FactsBody,
    FeedbackBody,
    GapAnswer,
    HealthAnswer,
    HistoryBody,
    ImportAnswer,
    PageAnswer,
    QueryBody,
    RecallAnswer,
    ReflectAnswer,
    WriteAnswer,
)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:48912"
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_RETRIES = 3
DEFAULT_MAX_RETRY_WAIT_SECONDS = 30.0
# The most a call waits, in all, for limited mode (409 storage_startup_blocked) to end.
DEFAULT_MAX_STARTUP_WAIT_SECONDS = 30.0
# Limited mode that will not end by waiting: recovery failed (an operator has to act).
STARTUP_BLOCKED = "storage_startup_blocked"
STARTUP_FAILED_REASONS = frozenset({"storage_recovery_failed"})
# Without a Retry-After, the n-th retry waits BACKOFF * 2**n seconds.
BACKOFF_SECONDS = 0.5
URL_ENV = "NEKOMEM_URL"
TOKEN_ENV = "NEKOMEM_API_TOKEN"

Message = Mapping[str, Any]
Layer = Literal["facts", "reflections", "persona", "recent"]
Feedback = Literal["confirmed", "denied", "ignored"]


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for (delta-seconds or an HTTP date), or None
    when it is absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - (now or datetime.now(timezone.utc))).total_seconds())


def _segment(value: str) -> str:
    """One path segment: a character name may hold spaces and any script."""
    return quote(value, safe="")


class AsyncNekomemClient:
    """The asynchronous client. Use it as ``async with AsyncNekomemClient(...) as client``
    (or call :meth:`aclose`).

    ``base_url`` defaults to ``$NEKOMEM_URL`` or ``http://127.0.0.1:48912``; ``token`` to
    ``$NEKOMEM_API_TOKEN`` (sent as ``Authorization: Bearer``; none when empty);
    ``timeout`` (60 s) bounds each attempt; ``retries`` (3) is how many times a 503 is
    retried; a 503 whose ``Retry-After`` asks for more than ``max_retry_wait`` (30 s) is
    raised at once; ``max_startup_wait`` (30 s, 0: never) bounds the total wait for a 409
    ``storage_startup_blocked`` to pass (see the module). ``transport`` replaces httpx's network transport (for example an
    ``httpx.ASGITransport`` over the app itself, as the in-server MCP mount does).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        retries: int = DEFAULT_RETRIES,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT_SECONDS,
        max_startup_wait: float = DEFAULT_MAX_STARTUP_WAIT_SECONDS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if max_startup_wait < 0:
            raise ValueError("max_startup_wait must be >= 0")
        url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        # Bytes: a token with non-ASCII characters is sent as its UTF-8 (httpx would refuse a str).
        headers = {b"Authorization": f"Bearer {token}".encode()} if token else {}
        self.retries = retries
        self.max_retry_wait = max_retry_wait
        self.max_startup_wait = max_startup_wait
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncNekomemClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # -- plumbing -------------------------------------------------------------------------
    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """Send one request, retrying a 503 and waiting out limited mode (see the class);
        return the 2xx answer.

        Raises NekomemError for an error answer, and with status 0 when the server cannot
        be reached (``error_code`` ``unreachable``) or an attempt times out (``timeout``);
        the httpx error is its ``__cause__``."""
        content = None if body is None else msgspec.json.encode(body)
        send_headers = dict(headers or {})
        if content is not None:
            send_headers["Content-Type"] = "application/json"
        query = {k: v for k, v in (params or {}).items() if v is not None}
        attempt = 0
        startup_waited = 0.0
        while True:
            try:
                response = await self._http.request(method, path, content=content, params=query, headers=send_headers)
            except httpx.TimeoutException as exc:
                raise NekomemError(
                    0, "timeout", f"{method} {path}: no answer from {self._http.base_url} in time ({type(exc).__name__})"
                ) from exc
            except httpx.HTTPError as exc:
                raise NekomemError(
                    0, "unreachable", f"{method} {path}: cannot reach nekomem at {self._http.base_url} ({type(exc).__name__})"
                ) from exc
            if response.status_code < 400:
                return response
            error = NekomemError.from_answer(response.status_code, response.content, response.reason_phrase)
            wait = retry_after_seconds(response.headers.get("retry-after"))
            if response.status_code == 409 and error.error_code == STARTUP_BLOCKED:
                pause = self._startup_pause(error, wait, startup_waited)
                if pause is None:
                    raise error
                startup_waited += pause
                await anyio.sleep(pause)
                continue
            if response.status_code != 503 or attempt >= self.retries:
                raise error
            if wait is None:
                wait = BACKOFF_SECONDS * 2**attempt
            if wait > self.max_retry_wait:
                raise error
            attempt += 1
            await anyio.sleep(wait)

    def _startup_pause(self, error: NekomemError, retry_after: float | None, waited: float) -> float | None:
        """How long to wait before asking again after a 409 storage_startup_blocked, or
        None when the call gives up (recovery failed, or the wait budget is spent)."""
        if error.body.get("blocking_reason") in STARTUP_FAILED_REASONS:
            return None
        pause = BACKOFF_SECONDS if retry_after is None else retry_after
        left = self.max_startup_wait - waited
        if left <= 0:
            return None
        return min(pause, left)

    async def _json(self, cls: type[T], method: str, path: str, **kwargs: Any) -> T:
        response = await self._send(method, path, **kwargs)
        try:
            return msgspec.json.decode(response.content, type=cls)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise NekomemError(response.status_code, "bad_response", f"{method} {path}: {exc}") from None

    async def _text(self, path: str, params: Mapping[str, str | None]) -> str:
        response = await self._send("GET", path, params={k: v for k, v in params.items() if v is not None})
        return response.text

    async def _write(self, route: str, name: str, messages: Sequence[Message], idempotency_key: str | None) -> WriteAnswer:
        key = idempotency_key or uuid.uuid4().hex
        body = HistoryBody(input_history=[dict(m) for m in messages])
        return await self._json(WriteAnswer, "POST", f"/{route}/{_segment(name)}", body=body, headers={"Idempotency-Key": key})

    # -- system ---------------------------------------------------------------------------
    async def health(self) -> HealthAnswer:
        """``GET /health``. Raises NekomemError on an error answer."""
        return await self._json(HealthAnswer, "GET", "/health")

    async def characters(self) -> CharactersAnswer:
        """``GET /api/characters``: the characters on disk and whether each is active."""
        return await self._json(CharactersAnswer, "GET", "/api/characters")

    # -- conversation ---------------------------------------------------------------------
    async def cache(self, name: str, messages: Sequence[Message], *, idempotency_key: str | None = None) -> WriteAnswer:
        """``POST /cache/{name}``: store finished turns (``{"role", "content"}`` messages,
        optionally with ``timestamp``). A fresh Idempotency-Key is sent unless one is given,
        so a retried attempt is stored once. Raises NekomemError (400/422 bad messages)."""
        return await self._write("cache", name, messages, idempotency_key)

    async def process(self, name: str, messages: Sequence[Message], *, idempotency_key: str | None = None) -> WriteAnswer:
        """``POST /process/{name}``: store, then compress at session end (see :meth:`cache`)."""
        return await self._write("process", name, messages, idempotency_key)

    async def renew(self, name: str, messages: Sequence[Message], *, idempotency_key: str | None = None) -> WriteAnswer:
        """``POST /renew/{name}``: store, then compress in detailed mode (see :meth:`cache`)."""
        return await self._write("renew", name, messages, idempotency_key)

    async def settle(self, name: str, messages: Sequence[Message] = (), *, idempotency_key: str | None = None) -> WriteAnswer:
        """``POST /settle/{name}``: compress what is cached (see :meth:`cache`)."""
        return await self._write("settle", name, messages, idempotency_key)

    async def new_dialog(
        self, name: str, *, language: str | None = None, render_language: str | None = None, master_name: str | None = None
    ) -> str:
        """``GET /new_dialog/{name}``: the working context to inject ("" for an unknown character)."""
        params = {"language": language, "render_language": render_language, "master_name": master_name}
        return await self._text(f"/new_dialog/{_segment(name)}", params)

    async def recent_history(self, name: str, *, language: str | None = None, master_name: str | None = None) -> str:
        """``GET /get_recent_history/{name}``: the recent window, one ``speaker | text`` line per item."""
        return await self._text(f"/get_recent_history/{_segment(name)}", {"language": language, "master_name": master_name})

    async def last_conversation_gap(self, name: str) -> float:
        """``GET /last_conversation_gap/{name}``: seconds since the last turn, -1 without history."""
        answer = await self._json(GapAnswer, "GET", f"/last_conversation_gap/{_segment(name)}")
        return answer.gap_seconds

    # -- long-term memory -----------------------------------------------------------------
    async def recall(
        self,
        name: str,
        query: str | None = None,
        time: str | None = None,
        *,
        markdown: bool = False,
        language: str | None = None,
    ) -> RecallAnswer:
        """``POST /query_memory/{name}``: at most 8 rows matching ``query`` and/or within
        ``time`` (ISO or natural, e.g. "last week"); with ``markdown`` the answer's
        ``markdown`` is the text block for a model. Neither query nor time: no rows."""
        body = QueryBody(query=query, time=time, render="markdown" if markdown else None, language=language)
        return await self._json(RecallAnswer, "POST", f"/query_memory/{_segment(name)}", body=body)

    async def add_facts(self, name: str, facts: Sequence[FactImport | str]) -> ImportAnswer:
        """``POST /api/characters/{name}/facts``: add facts through the import path, so a
        duplicate of a stored fact is skipped (counted in ``skipped_duplicates``). A plain
        string is a fact of importance 5. Raises NekomemError 422 naming a bad fact."""
        items = [FactImport(text=f) if isinstance(f, str) else f for f in facts]
        return await self._json(ImportAnswer, "POST", f"/api/characters/{_segment(name)}/facts", body=FactsBody(facts=items))

    async def import_card(self, name: str, entries: Sequence[tuple[str, str]]) -> dict[str, Any]:
        """``POST /api/characters/{name}/card``: (entity, text) pairs become protected persona entries."""
        body = CardBody(entries=[CardEntry(entity=e, text=t) for e, t in entries])
        return await self._json(dict[str, Any], "POST", f"/api/characters/{_segment(name)}/card", body=body)

    async def entries(
        self,
        name: str,
        layer: Layer,
        *,
        status: str | None = None,
        entity: str | None = None,
        offset: int | None = None,
        limit: int | None = None,
    ) -> PageAnswer:
        """``GET /api/characters/{name}/{layer}``: one page of a layer's entries.
        Raises NekomemError 404 for an unknown character."""
        params = {"status": status, "entity": entity, "offset": offset, "limit": limit}
        query = {k: str(v) for k, v in params.items() if v is not None}
        return await self._json(PageAnswer, "GET", f"/api/characters/{_segment(name)}/{layer}", params=query)

    async def persona(self, name: str) -> PageAnswer:
        """The character's persona entries (see :meth:`entries`)."""
        return await self.entries(name, "persona")

    async def edit_entry(
        self,
        name: str,
        layer: Layer,
        entry_id: str,
        *,
        text: str | None = None,
        importance: int | None = None,
        entity: str | None = None,
    ) -> dict[str, Any]:
        """``PATCH /api/characters/{name}/{layer}/{id}``: change the given fields (a recent
        item, addressed by its index, has only ``text``); answers the edited entry.
        Raises NekomemError 404 (unknown id) or 422 (a field the layer does not have)."""
        edit = EntryEdit(
            text=UNSET if text is None else text,
            importance=UNSET if importance is None else importance,
            entity=UNSET if entity is None else entity,
        )
        path = f"/api/characters/{_segment(name)}/{layer}/{_segment(entry_id)}"
        return await self._json(dict[str, Any], "PATCH", path, body=edit)

    async def delete_entry(self, name: str, layer: Layer, entry_id: str) -> dict[str, Any]:
        """``DELETE /api/characters/{name}/{layer}/{id}``. Raises NekomemError 404."""
        return await self._json(dict[str, Any], "DELETE", f"/api/characters/{_segment(name)}/{layer}/{_segment(entry_id)}")

    async def feedback(self, name: str, reflection_id: str, feedback: Feedback) -> dict[str, Any]:
        """``POST .../reflections/{id}/feedback``; answers the updated reflection.
        Raises NekomemError 404 for an unknown reflection."""
        path = f"/api/characters/{_segment(name)}/reflections/{_segment(reflection_id)}/feedback"
        return await self._json(dict[str, Any], "POST", path, body=FeedbackBody(feedback=feedback))

    async def confirm(self, name: str, reflection_id: str) -> dict[str, Any]:
        """The user confirmed a reflection (see :meth:`feedback`)."""
        return await self.feedback(name, reflection_id, "confirmed")

    async def deny(self, name: str, reflection_id: str) -> dict[str, Any]:
        """The user denied a reflection (see :meth:`feedback`)."""
        return await self.feedback(name, reflection_id, "denied")

    async def reflect(self, name: str) -> ReflectAnswer:
        """``POST /reflect/{name}``: run a synthesis and a promotion pass now."""
        return await self._json(ReflectAnswer, "POST", f"/reflect/{_segment(name)}")

    async def followup_topics(self, name: str) -> dict[str, Any]:
        """``GET /followup_topics/{name}``: pending reflections worth asking about."""
        return await self._json(dict[str, Any], "GET", f"/followup_topics/{_segment(name)}")
