"""Conversation messages: the wire encodings a chat server sends and the stored shape.

A chat server sends either OpenAI-style ``{"role": "user", "content": ...}`` or the on-disk
style ``{"type": "human", "data": {"content": ...}}``; content is a string or a list of
``{"type": "text", "text": ...}`` parts. Everything is normalised to :class:`Turn`.
On disk (recent.json and the ``message`` column of time_indexed.db) a turn is
``{"type": "human"|"ai"|"system", "data": {"content": str}}``.
"""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo
from typing import Any, Literal

import msgspec

Role = Literal["human", "ai", "system"]

_ROLE_ALIASES: dict[str, Role] = {
    "user": "human",
    "human": "human",
    "master": "human",
    "assistant": "ai",
    "ai": "ai",
    "character": "ai",
    "system": "system",
}


class Turn(msgspec.Struct, frozen=True, gc=False):
    """One message of the conversation, normalised.

    ``ts`` is a naive-free ISO 8601 timestamp with offset (the server clock by default).
    ``metadata`` is the message's own ``metadata`` object as the client sent it (the
    reference's theater tags its story capsules there, e.g. ``source=theater_numeric_v2``);
    kept verbatim in recent.json and the journal (``data.metadata``), never interpreted
    except by :mod:`nekomem.domain.theater`.
    """

    role: Role
    text: str
    ts: str = ""
    metadata: dict[str, Any] | None = None

    def to_disk(self) -> dict[str, Any]:
        data: dict[str, Any] = {"content": self.text}
        if self.ts:
            data["additional_kwargs"] = {"timestamp": self.ts}
        if self.metadata:
            data["metadata"] = self.metadata
        return {"type": self.role, "data": data}

    @property
    def openai_role(self) -> str:
        return {"human": "user", "ai": "assistant", "system": "system"}[self.role]


class MessageError(ValueError):
    """A message of a request body has the wrong shape; ``index`` says which one."""

    def __init__(self, index: int, problem: str) -> None:
        super().__init__(f"input_history[{index}]: {problem}")
        self.index = index
        self.problem = problem


def content_text(content: Any) -> str | None:
    """Flatten a content value (string or list of parts) to text; None if it has no text shape."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                if part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
                # non-text parts (images, audio) are not memory: dropped
            else:
                return None
        return "".join(parts)
    return None


def parse_iso(value: object, naive_tz: tzinfo | None = timezone.utc) -> datetime | None:
    """An ISO 8601 value as a datetime keeping its own offset; a naive value is read in
    ``naive_tz`` (left naive when that is None); a trailing ``Z`` means UTC. None when
    absent or invalid."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.replace(tzinfo=naive_tz) if parsed.tzinfo is None and naive_tz is not None else parsed


def parse_timestamp(value: str) -> datetime:
    """Parse an ISO 8601 timestamp; a value without offset is taken as UTC.
    Raises ValueError when it is not ISO 8601."""
    parsed = parse_iso(value)
    if parsed is None:
        raise ValueError(f"not an ISO 8601 timestamp: {value!r}")
    return parsed


def normalize_message(raw: Any, index: int, default_ts: str, max_chars: int) -> Turn:
    """Turn one wire message into a :class:`Turn` or raise :class:`MessageError`."""
    if not isinstance(raw, dict):
        raise MessageError(index, f"expected an object, got {type(raw).__name__}")
    if "role" in raw:
        role_raw = raw["role"]
        content = raw.get("content", "")
        metadata = raw.get("metadata")
    elif "type" in raw:
        role_raw = raw["type"]
        data = raw.get("data")
        if not isinstance(data, dict):
            raise MessageError(index, "'data' must be an object with 'content'")
        content = data.get("content", "")
        metadata = data.get("metadata", raw.get("metadata"))
    else:
        raise MessageError(index, "needs 'role' and 'content', or 'type' and 'data'")
    if not isinstance(role_raw, str):
        raise MessageError(index, "role/type must be a string")
    # As the reference does, any other role ("tool", "function", a typo) is stored as a
    # human message: rejecting it would fail the whole batch, which its connector then
    # resends every turn until the session ends.
    role = _ROLE_ALIASES.get(role_raw.strip().lower(), "human")
    text = content_text(content)
    if text is None:
        raise MessageError(index, "content must be a string or a list of text parts")
    if len(text) > max_chars:
        raise MessageError(index, f"content has {len(text)} characters; the limit is {max_chars}")
    if "\x00" in text:
        raise MessageError(index, "content contains a NUL character")
    ts = default_ts
    stamp = raw.get("timestamp")
    if stamp is None and isinstance(raw.get("data"), dict):
        kwargs = raw["data"].get("additional_kwargs")
        if isinstance(kwargs, dict) and isinstance(kwargs.get("timestamp"), str):
            stamp = kwargs["timestamp"]
    if stamp is not None:
        if not isinstance(stamp, str):
            raise MessageError(index, "timestamp must be an ISO 8601 string")
        try:
            ts = parse_timestamp(stamp).isoformat()
        except ValueError:
            raise MessageError(index, f"timestamp {stamp!r} is not ISO 8601") from None
    # Any metadata shape other than a non-empty object is dropped, as the reference's
    # message conversion does: it is the client's annotation, not memory text.
    return Turn(role=role, text=text, ts=ts, metadata=metadata if isinstance(metadata, dict) and metadata else None)


def from_disk(raw: Any) -> Turn | None:
    """Read a stored message (either encoding); None for a record with no text shape."""
    try:
        return normalize_message(raw, 0, "", max_chars=10**9)
    except MessageError:
        return None
