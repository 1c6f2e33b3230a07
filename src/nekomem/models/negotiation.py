"""What each OpenAI-compatible endpoint accepts: structured output and the token-limit name.

Servers differ. OpenAI and vLLM take ``response_format: {"type": "json_schema", ...}``;
llama-cpp-python answers 500 to it but takes ``{"type": "json_object", "schema": ...}``;
others answer 400 or ignore the field. Newer OpenAI models refuse ``max_tokens``, older
servers refuse ``max_completion_tokens``. :class:`Negotiator` keeps, per endpoint (base URL
and model), the structured-output level and the token parameter to send, walks the ladder
``json_schema -> json_object -> none`` when a request is refused, and remembers the answer.

Which errors move down the ladder (everything else is an ordinary failure with backoff):

- a 400, 422, 500 or 501 whose body mentions ``response_format``, the schema,
  a grammar or structured output: the level is refused, move down and remember it;
- a 400, 422 or 500 that explains nothing, while the current level has never been accepted
  by this endpoint: try the next level at once; it is remembered only when a lower level
  then gets a 2xx (a server that is merely broken leaves no false memory). When the lower
  level fails with the very same error, the error was not about the format: the probe stops
  and such errors are plain failures for ``llm_negotiation_reprobe_seconds``;
- a 400 or 422 naming the token parameter as unsupported, unknown or extra: switch to the
  other name and remember it.

The memory lives in the process only: one refused request per endpoint after a restart is
cheaper than trusting a stale record when the server behind a URL has been swapped.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FORMAT_LEVELS",
    "TOKEN_PARAMS",
    "EndpointDialect",
    "Negotiator",
    "format_fallback",
    "response_format_field",
    "state_schema_in_messages",
    "token_param_fallback",
]

FORMAT_LEVELS = ("json_schema", "json_object", "none")
TOKEN_PARAMS = ("max_completion_tokens", "max_tokens")

_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object|schema|grammar|structured", re.IGNORECASE)
_REFUSAL_WORDS = re.compile(
    r"unsupported|not supported|unrecognized|unrecognised|unknown|extra|not permitted|not allowed|"
    r"unexpected|instead|forbidden|invalid (?:field|param|argument|key)",
    re.IGNORECASE,
)
_EXPLAINED_FORMAT_STATUSES = frozenset({400, 422, 500, 501})
_PROBE_STATUSES = frozenset({400, 422, 500})
_TOKEN_STATUSES = frozenset({400, 422})


@dataclass
class EndpointDialect:
    """What one endpoint is sent. ``*_confirmed`` means a 2xx answered a request sent so."""

    response_format: str
    tokens_param: str
    format_confirmed: bool = False
    tokens_confirmed: bool = False
    fallbacks: list[str] = field(default_factory=list)


def response_format_field(level: str, name: str, schema: dict[str, Any]) -> dict[str, Any] | None:
    """The ``response_format`` request field of ``level`` (None for level ``none``)."""
    if level == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    if level == "json_object":
        return {"type": "json_object", "schema": schema}
    return None


def state_schema_in_messages(messages: list[dict[str, Any]], schema_json: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` whose system message also states the answer's JSON schema.

    Used when the server does not enforce the schema (levels json_object and none). Without a
    string system message first, one is inserted.
    """
    statement = f"The answer is one JSON object valid against this JSON schema: {schema_json}"
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{statement}"
    else:
        out.insert(0, {"role": "system", "content": statement})
    return out


def format_fallback(level: str, confirmed: bool, status: int, detail: str) -> tuple[str, bool] | None:
    """The level to try after ``status``/``detail`` refused a request sent at ``level``.

    Returns ``(next_level, certain)``: ``certain`` when the error names the structured output
    (remember at once), False for a probe of an unconfirmed level (remember only on success).
    None when the error is not about the format (an ordinary failure) or no level is left.
    """
    if level not in FORMAT_LEVELS or level == "none":
        return None
    following = FORMAT_LEVELS[FORMAT_LEVELS.index(level) + 1]
    if status in _EXPLAINED_FORMAT_STATUSES and _FORMAT_WORDS.search(detail):
        return following, True
    if not confirmed and status in _PROBE_STATUSES and not _names_token_param(detail):
        return following, False
    return None


def _names_token_param(detail: str) -> bool:
    return any(name in detail for name in TOKEN_PARAMS)


def token_param_fallback(param: str, status: int, detail: str) -> str | None:
    """The other token-limit name when ``detail`` refuses one of them by name, else None."""
    if status not in _TOKEN_STATUSES or not _names_token_param(detail) or not _REFUSAL_WORDS.search(detail):
        return None
    return TOKEN_PARAMS[1] if param == TOKEN_PARAMS[0] else TOKEN_PARAMS[0]


class Negotiator:
    """Per-endpoint dialects (thread-safe).

    ``response_format`` and ``tokens_param`` are the settings: ``auto`` negotiates starting
    at json_schema / max_completion_tokens; any other value pins that choice for every
    endpoint and is never changed. While an endpoint's choices are unconfirmed, requests to
    it are serialised through :meth:`probe_lock`, so a refusal is met once per endpoint.
    """

    def __init__(self, response_format: str = "auto", tokens_param: str = "auto") -> None:
        if response_format != "auto" and response_format not in FORMAT_LEVELS:
            raise ValueError(f"unknown response format {response_format!r}")
        if tokens_param != "auto" and tokens_param not in TOKEN_PARAMS:
            raise ValueError(f"unknown output-token parameter {tokens_param!r}")
        self._format_pinned = response_format != "auto"
        self._tokens_pinned = tokens_param != "auto"
        self._initial = EndpointDialect(
            response_format=FORMAT_LEVELS[0] if response_format == "auto" else response_format,
            tokens_param=TOKEN_PARAMS[0] if tokens_param == "auto" else tokens_param,
            format_confirmed=self._format_pinned,
            tokens_confirmed=self._tokens_pinned,
        )
        self._lock = threading.Lock()
        self._dialects: dict[tuple[str, str], EndpointDialect] = {}
        self._probe_locks: dict[tuple[str, str], threading.Lock] = {}
        self._no_probe_until: dict[tuple[str, str], float] = {}

    @property
    def format_pinned(self) -> bool:
        return self._format_pinned

    @property
    def tokens_pinned(self) -> bool:
        return self._tokens_pinned

    def _dialect(self, key: tuple[str, str]) -> EndpointDialect:
        dialect = self._dialects.get(key)
        if dialect is None:
            initial = self._initial
            dialect = EndpointDialect(initial.response_format, initial.tokens_param, initial.format_confirmed, initial.tokens_confirmed)
            self._dialects[key] = dialect
        return dialect

    def current(self, key: tuple[str, str]) -> EndpointDialect:
        """A snapshot of what ``key`` is sent now."""
        with self._lock:
            d = self._dialect(key)
            return EndpointDialect(d.response_format, d.tokens_param, d.format_confirmed, d.tokens_confirmed, list(d.fallbacks))

    def settled(self, key: tuple[str, str]) -> bool:
        """True when nothing about ``key`` is left to probe."""
        with self._lock:
            d = self._dialect(key)
            return d.format_confirmed and d.tokens_confirmed

    def probe_lock(self, key: tuple[str, str]) -> threading.Lock:
        """The lock that serialises requests to ``key`` while it is not settled."""
        with self._lock:
            return self._probe_locks.setdefault(key, threading.Lock())

    def may_probe(self, key: tuple[str, str]) -> bool:
        """False while a recent probe of ``key`` showed its errors are not about the format."""
        with self._lock:
            return time.monotonic() >= self._no_probe_until.get(key, 0.0)

    def block_probing(self, key: tuple[str, str], seconds: float) -> None:
        """Treat unexplained errors of ``key`` as plain failures for ``seconds``."""
        with self._lock:
            self._no_probe_until[key] = time.monotonic() + seconds

    def accepted(self, key: tuple[str, str], level: str, param: str) -> bool:
        """Record that a request sent at ``level`` with ``param`` got a 2xx.

        Returns True when this changed the remembered level (a probed fallback committed).
        """
        with self._lock:
            d = self._dialect(key)
            changed = False
            if not self._format_pinned and (d.response_format != level or not d.format_confirmed):
                if d.response_format != level:
                    d.fallbacks.append(f"{d.response_format} -> {level}")
                    changed = True
                d.response_format, d.format_confirmed = level, True
            if not self._tokens_pinned and (d.tokens_param != param or not d.tokens_confirmed):
                d.tokens_param, d.tokens_confirmed = param, True
            return changed

    def refused_format(self, key: tuple[str, str], level: str, following: str, status: int) -> None:
        """Remember that ``key`` refused ``level`` for certain (the error named it)."""
        with self._lock:
            d = self._dialect(key)
            if self._format_pinned or FORMAT_LEVELS.index(d.response_format) > FORMAT_LEVELS.index(level):
                return  # pinned, or another thread already moved further down
            d.response_format, d.format_confirmed = following, False
            d.fallbacks.append(f"{level} -> {following} (HTTP {status})")

    def refused_tokens_param(self, key: tuple[str, str], param: str, other: str, status: int) -> None:
        """Remember that ``key`` refused the token parameter ``param``."""
        with self._lock:
            d = self._dialect(key)
            if self._tokens_pinned or d.tokens_param != param:
                return
            d.tokens_param, d.tokens_confirmed = other, False
            d.fallbacks.append(f"{param} -> {other} (HTTP {status})")

    def status(self, key: tuple[str, str]) -> dict[str, Any]:
        """What /health shows for one endpoint."""
        d = self.current(key)
        return {
            "response_format": d.response_format,
            "response_format_confirmed": d.format_confirmed,
            "response_format_pinned": self._format_pinned,
            "output_tokens_param": d.tokens_param,
            "output_tokens_param_confirmed": d.tokens_confirmed,
            "fallbacks": d.fallbacks[-6:],
        }
