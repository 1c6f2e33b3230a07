"""One chat-completion response, read defensively (internal to the LLM client).

:class:`AttemptFailed` describes why one HTTP attempt gave no answer and whether it is
worth retrying; the helpers read an error body, a Retry-After header and the assistant
content of a completion without trusting its shape.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["AttemptFailed", "EXHAUSTED_FINISH_REASONS", "content_of", "error_detail", "retry_after"]

EXHAUSTED_FINISH_REASONS = ("length", "max_tokens")


class AttemptFailed(Exception):
    """Outcome of one failed attempt (internal)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        retry_after: float | None = None,
        output_exhausted: bool = False,
        accepted: bool = False,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after = retry_after
        self.output_exhausted = output_exhausted
        self.accepted = accepted  # the server answered 2xx: the request's form was accepted
        self.detail = detail  # the error body, matched by the negotiation (never logged)


def error_detail(response: httpx.Response, limit: int = 200) -> str:
    """A short description of an error body (the provider's message if it has one)."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:limit].strip()
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str):
            return message[:limit]
        if isinstance(error, str):
            return error[:limit]
    return response.text[:limit].strip()


def retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        return None  # an HTTP-date: fall back to our own backoff


def content_of(body: Any) -> tuple[str, str | None]:
    """(assistant content, finish_reason) of a chat completion body; raises AttemptFailed."""
    if not isinstance(body, dict):
        raise AttemptFailed("response body is not a JSON object", retryable=True)
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AttemptFailed("response has no choices", retryable=True)
    choice = choices[0]
    finish_reason = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    message = choice.get("message")
    if not isinstance(message, dict):
        raise AttemptFailed("response choice has no message", retryable=True)
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    exhausted = finish_reason in EXHAUSTED_FINISH_REASONS
    if not isinstance(content, str) or not content.strip():
        if isinstance(message.get("refusal"), str):
            raise AttemptFailed("model refused the task", retryable=True)
        reason = f" (finish_reason={finish_reason})" if finish_reason else ""
        raise AttemptFailed(f"response message has no content{reason}", retryable=True, output_exhausted=exhausted)
    return content, finish_reason
