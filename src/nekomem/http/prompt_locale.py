"""``GET|PUT /prompt-locale/{name}``: a character's language for its context texts.

The reference's chat server (``main_routers/characters_router/language_preference.py``)
stores a per-character template language here and reads it back for its settings page;
without the route that page answers 503. Shapes (the reference's):

- ``GET`` -> ``{"success": true, "language": str | null, "order": int,
  "effective_language": str}`` (``effective_language``: the stored language, else the
  ``context_language`` setting);
- ``PUT {"language": "zh-CN" | "zh-TW" | "en" | "ja" | "ko" | "ru" | "es" | "pt" ...}`` ->
  ``{"success": true, "language", "order", "previous_language", "changed"}``; an
  unsupported language is 400 ``unsupported_language``.

``order`` numbers the writes of one character. The stored language is what
``/new_dialog`` and ``/get_recent_history`` render in when the request names none (as the
reference's durable locale). Besides ``PUT``, a supported ``language`` sent with a write
(``/cache``, ``/process``, ``/renew``, ``/settle``) or with ``/new_dialog`` becomes the
stored language (:func:`remember_language`), as the reference records it. It lives in ``prompt_locale.json`` in the character folder,
written here under one lock per character (a sidecar, like the scoped erase generations).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.domain.locale.context import normalise_language
from nekomem.http.bodies import character_name, decode_body
from nekomem.http.errors import ApiError
from nekomem.http.runtime_access import runtime_of
from nekomem.http.schemas import Body
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.layout import CharacterPaths

FILE_NAME = "prompt_locale.json"
# The reference's full codes for nekomem's context languages.
_FULL = {"zh": "zh-CN", "zh-TW": "zh-TW"}
_locks: dict[str, asyncio.Lock] = {}


class PromptLocaleBody(Body):
    language: str


def _paths(request: Request, name: str) -> CharacterPaths:
    rt = runtime_of(request)
    return rt.character_paths(name)


def _read(request: Request, name: str) -> dict[str, Any]:
    raw, status = read_json(_paths(request, name).folder / FILE_NAME, default={})
    return raw if status == "ok" and isinstance(raw, dict) else {}


def full_code(raw: str) -> str | None:
    """The reference's code for a language nekomem renders (``zh`` -> ``zh-CN``), or None."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    short = normalise_language(raw)
    # normalise_language answers English for anything it does not know: only "en..." is.
    if short == "en" and not raw.strip().lower().startswith("en"):
        return None
    return _FULL.get(short, short)


def stored_language(request: Request, name: str) -> str | None:
    """The character's stored language, or None (read only; a missing file is none)."""
    value = _read(request, name).get("language")
    return value if isinstance(value, str) and full_code(value) else None


async def get_prompt_locale(request: Request) -> Response:
    name = character_name(request)
    state = _read(request, name)
    language = stored_language(request, name)
    default = full_code(runtime_of(request).settings.server.context_language) or "en"
    order = state.get("order") if isinstance(state.get("order"), int) else 0
    return JSONResponse({"success": True, "language": language, "order": order, "effective_language": language or default})


async def _store(request: Request, name: str, language: str) -> tuple[str | None, int, bool]:
    """Store ``language`` (a full code) as the character's; returns (previous, order,
    changed). The same language again writes nothing."""
    async with _locks.setdefault(name, asyncio.Lock()):
        state = _read(request, name)
        previous = stored_language(request, name)
        stored_order = state.get("order")
        order = stored_order if isinstance(stored_order, int) else 0
        if previous == language:
            return previous, order, False
        order += 1
        paths = _paths(request, name)
        await asyncio.to_thread(paths.ensure)
        await asyncio.to_thread(atomic_write_json, paths.folder / FILE_NAME, {"language": language, "order": order})
    return previous, order, True


async def remember_language(request: Request, name: str, raw: object) -> None:
    """Keep the ``language`` a write or ``/new_dialog`` names as the character's language,
    as the reference records an explicit request language durably; a missing or
    unsupported one changes nothing (only an explicit, known language is evidence)."""
    language = full_code(raw) if isinstance(raw, str) else None
    if language is not None:
        await _store(request, name, language)


async def put_prompt_locale(request: Request) -> Response:
    name = character_name(request)
    body = await decode_body(request, PromptLocaleBody)
    language = full_code(body.language)
    if language is None:
        raise ApiError(400, "unsupported_language", f"unsupported language {body.language[:20]!r}")
    previous, order, _changed = await _store(request, name, language)
    return JSONResponse(
        {"success": True, "language": language, "order": order, "previous_language": previous, "changed": previous != language}
    )
