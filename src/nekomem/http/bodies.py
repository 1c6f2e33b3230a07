"""Reading and validating request bodies and path parameters."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from starlette.requests import Request

from nekomem.domain.opaque import OpaqueTooLarge, check_opaque, json_depth
from nekomem.domain.turns import MessageError, Turn, normalize_message
from nekomem.http.errors import ApiError
from nekomem.http.runtime_access import runtime_of
from nekomem.http.schemas import HistoryBody
from nekomem.stores.layout import InvalidName, validate_name

T = TypeVar("T")


def character_name(request: Request) -> str:
    """The ``name`` path parameter, validated and canonical; ApiError 400 when refused."""
    runtime = runtime_of(request)
    try:
        name = validate_name(request.path_params["name"], runtime.settings.server.name_max_length, runtime.settings.server.name_max_units)
    except InvalidName as exc:
        raise ApiError(400, exc.code, exc.message) from None
    # One spelling per folder on a case-insensitive memory root (stores.namefold).
    return str(runtime.names.canonical(name))


def raw_header(request: Request, name: bytes) -> str | None:
    """The first value of header ``name`` (lower-case bytes), or None: one pass over the
    raw list (Starlette's ``headers.get`` raises and catches a KeyError for a missing one)."""
    headers: list[tuple[bytes, bytes]] = request.scope["headers"]  # the ASGI scope's raw header list
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


async def read_body(request: Request) -> bytes:
    """The raw body, refusing (413) anything over ``max_body_bytes`` before reading it all."""
    limit = runtime_of(request).settings.server.max_body_bytes
    declared = raw_header(request, b"content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise ApiError(413, "body_too_large", f"the body has {declared} bytes; the limit is {limit}")
        except ValueError:
            raise ApiError(400, "bad_content_length", "Content-Length is not a number") from None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body_too_large", f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes, cls: type[T], max_depth: int) -> T:
    """Decode a request body into ``cls`` (a msgspec Struct of :mod:`nekomem.http.schemas`).

    Raises ApiError: 400 ``empty_body``, ``malformed_json`` or ``body_too_deep`` (nesting
    beyond ``max_depth`` anywhere, also inside untyped parts), 422 ``body_not_object`` or
    ``schema_violation`` naming the offending field.
    """
    if not raw.strip():
        raise ApiError(400, "empty_body", "the request needs a JSON object body")
    try:
        value = msgspec.json.decode(raw, type=cls)
    except RecursionError:
        raise ApiError(400, "body_too_deep", f"the body nests deeper than {max_depth} levels") from None
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith("Expected `object`, got"):
            raise ApiError(422, "body_not_object", f"the body must be a JSON object: {text}") from None
        raise ApiError(422, "schema_violation", text) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    # +1: the body object itself is a level. Every level opens with its own bracket, so a
    # body with no more brackets than that cannot be too deep (counted in C, no walk).
    if raw.count(b"[") + raw.count(b"{") > max_depth + 1 and json_depth(value, max_depth + 1) > max_depth + 1:
        raise ApiError(400, "body_too_deep", f"the body nests deeper than {max_depth} levels")
    return value


async def decode_body(request: Request, cls: type[T]) -> T:
    """Read (see :func:`read_body`) and decode (see :func:`decode_json`) the body."""
    raw = await read_body(request)
    return decode_json(raw, cls, runtime_of(request).settings.server.body_max_depth)


async def read_json_object(request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
    """The body as a JSON object, with the depth bound of :func:`decode_json` (for routes
    that still check their fields by hand; prefer :func:`decode_body` with a type)."""
    raw = await read_body(request)
    if allow_empty and not raw.strip():
        return {}
    return decode_json(raw, dict[str, Any], runtime_of(request).settings.server.body_max_depth)


def convert_body(value: dict[str, Any], cls: type[T]) -> T:
    """``value`` converted into ``cls``; ApiError 422 ``schema_violation`` otherwise."""
    try:
        return msgspec.convert(value, cls)
    except msgspec.ValidationError as exc:
        raise ApiError(422, "schema_violation", str(exc)) from None


def bounded_opaque(value: Any, what: str, request: Request) -> Any:
    """``value`` when within the opaque bounds (settings); ApiError 422 otherwise."""
    server = runtime_of(request).settings.server
    try:
        check_opaque(value, what=what, max_depth=server.opaque_max_depth, max_bytes=server.opaque_max_bytes)
    except OpaqueTooLarge as exc:
        raise ApiError(422, "opaque_too_large", str(exc)) from None
    return value


async def decode_history(request: Request) -> HistoryBody:
    """The body of a conversation write; the schema errors name ``input_history``."""
    try:
        return await decode_body(request, HistoryBody)
    except ApiError as exc:
        if exc.code == "schema_violation" and "input_history" in exc.message:
            missing = "missing required field" in exc.message
            code = "missing_input_history" if missing else "bad_input_history"
            raise ApiError(422, code, exc.message) from None
        raise


def parse_history(
    body: HistoryBody | dict[str, Any], default_ts: str, max_chars: int, max_messages: int, max_depth: int = 32
) -> list[Turn]:
    """``input_history`` as a list of Turns. The array may arrive JSON-encoded in a string
    (the reference client double-encodes). Raises ApiError 422 naming the bad message."""
    if isinstance(body, dict):
        if "input_history" not in body:
            raise ApiError(422, "missing_input_history", "the body needs 'input_history' (an array of messages)")
        history: Any = body["input_history"]
    else:
        history = body.input_history
    if isinstance(history, str):
        if not history.strip():
            history = []
        else:
            try:
                history = msgspec.json.decode(history.encode("utf-8"))
            except RecursionError:
                raise ApiError(400, "body_too_deep", f"input_history nests deeper than {max_depth} levels") from None
            except msgspec.DecodeError as exc:
                raise ApiError(422, "bad_input_history", f"input_history is a string but not a JSON array: {exc}") from None
            if json_depth(history, max_depth) > max_depth:
                raise ApiError(400, "body_too_deep", f"input_history nests deeper than {max_depth} levels")
    if not isinstance(history, list):
        raise ApiError(422, "bad_input_history", f"input_history must be an array, not {type(history).__name__}")
    if len(history) > max_messages:
        raise ApiError(413, "too_many_messages", f"{len(history)} messages; the limit is {max_messages}")
    turns: list[Turn] = []
    for index, raw in enumerate(history):
        try:
            turns.append(normalize_message(raw, index, default_ts, max_chars))
        except MessageError as exc:
            raise ApiError(422, "bad_message", str(exc)) from None
    return turns
