"""Reading and validating request bodies and path parameters."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request

from nekomem.domain.turns import MessageError, Turn, normalize_message
from nekomem.http.errors import ApiError
from nekomem.stores.layout import InvalidName, validate_name


def character_name(request: Request) -> str:
    settings = request.app.state.runtime.settings.server
    try:
        return validate_name(request.path_params["name"], settings.name_max_length)
    except InvalidName as exc:
        raise ApiError(400, exc.code, exc.message) from None


async def read_body(request: Request) -> bytes:
    """The raw body, refusing (413) anything over ``max_body_bytes`` before reading it all."""
    limit = request.app.state.runtime.settings.server.max_body_bytes
    declared = request.headers.get("content-length")
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


async def read_json_object(request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        if allow_empty:
            return {}
        raise ApiError(400, "empty_body", "the request needs a JSON object body")
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(422, "body_not_object", f"the body must be a JSON object, not {type(value).__name__}")
    return value


def convert_body(value: dict[str, Any], cls: type[Any]) -> Any:
    try:
        return msgspec.convert(value, cls)
    except msgspec.ValidationError as exc:
        raise ApiError(422, "schema_violation", str(exc)) from None


def parse_history(body: dict[str, Any], default_ts: str, max_chars: int, max_messages: int) -> list[Turn]:
    """``input_history`` as a list of Turns. The array may arrive JSON-encoded in a string
    (the reference client double-encodes). Raises ApiError 422 naming the bad message."""
    if "input_history" not in body:
        raise ApiError(422, "missing_input_history", "the body needs 'input_history' (an array of messages)")
    history = body["input_history"]
    if isinstance(history, str):
        if not history.strip():
            history = []
        else:
            try:
                history = msgspec.json.decode(history.encode("utf-8"))
            except msgspec.DecodeError as exc:
                raise ApiError(422, "bad_input_history", f"input_history is a string but not a JSON array: {exc}") from None
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
