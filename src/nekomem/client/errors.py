"""The exception a client call raises when the server refuses it or cannot be understood."""

from __future__ import annotations

from typing import Any

import msgspec


class NekomemError(Exception):
    """A request the server answered with an error (``status`` >= 400), or an answer the
    client could not decode.

    ``status`` is the HTTP status (0 when no answer came back), ``error_code`` and
    ``message`` are the server's JSON error fields (``http_error`` / the reason phrase when
    the body was not nekomem's error shape, ``bad_response`` when a 2xx body did not
    decode), and ``body`` is the whole decoded JSON error (it may carry more fields, such as
    ``blocking_reason`` in limited mode).
    """

    def __init__(self, status: int, error_code: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {error_code}: {message}")
        self.status = status
        self.error_code = error_code
        self.message = message
        self.body = body if body is not None else {}

    @classmethod
    def from_answer(cls, status: int, content: bytes, reason: str) -> NekomemError:
        """The error of an answer with status >= 400 (never raises)."""
        try:
            body = msgspec.json.decode(content)
        except msgspec.DecodeError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error_code"), str):
            return cls(status, body["error_code"], str(body.get("message", "")), body)
        return cls(status, "http_error", reason or f"HTTP {status}", body if isinstance(body, dict) else None)
