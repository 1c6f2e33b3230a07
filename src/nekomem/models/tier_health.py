"""The health of the LLM tiers: each tier's counters, latest error and whether it is
failing now (from the first failed attempt after the last valid answer) or recovered; and
the start-up check of their configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import urlsplit, urlunsplit


@dataclass
class TierStats:
    """One tier's counters and health, kept by LLMClient under its lock."""

    calls: int = 0
    attempts: int = 0
    failures: int = 0
    skipped: int = 0
    last_error: str | None = None
    last_error_at: str | None = None
    # The tier's health: set at the first failed attempt after a success (or ever), cleared
    # by the next valid answer, which also clears last_error (kept as recovered_error).
    failing_since: str | None = None
    last_success_at: str | None = None
    recovered_error: str | None = None

    def failed(self, message: str, at: str) -> None:
        self.last_error, self.last_error_at = message, at
        if self.failing_since is None:
            self.failing_since = at

    def succeeded(self, at: str) -> None:
        self.last_success_at = at
        if self.last_error is not None:
            self.recovered_error = self.last_error
        self.failing_since = self.last_error = self.last_error_at = None

    def state(self, configured: bool) -> str:
        """``unconfigured``, ``failing`` (the latest attempt failed), ``ok`` (the latest
        answer was valid) or ``untried``."""
        if not configured:
            return "unconfigured"
        if self.failing_since is not None:
            return "failing"
        return "ok" if self.last_success_at is not None else "untried"


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def public_url(url: str) -> str:
    """The URL without any user:password part, for status and logs."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def endpoint_warnings(endpoints: Mapping[str, tuple[str, str] | None]) -> list[str]:
    """What looks wrong in the configured tiers, one sentence per problem naming the tiers
    it touches (checked at start-up; ``endpoints`` maps each tier to its (base URL, model)
    or None): an empty model name, or a base URL without an http(s) scheme or host
    (``localhost:8080`` is read as scheme "localhost"), which every call would fail on."""
    bad_url: dict[str, list[str]] = {}
    no_model: list[str] = []
    for tier, endpoint in endpoints.items():
        if endpoint is None:
            continue
        base_url, model = endpoint
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            bad_url.setdefault(public_url(base_url), []).append(tier)
        if not model.strip():
            no_model.append(tier)
    warnings = [
        f"LLM base URL {url!r} ({', '.join(tiers)}) has no http:// or https:// scheme and host: every call will fail "
        "(write e.g. 'http://localhost:8080/v1')"
        for url, tiers in bad_url.items()
    ]
    if no_model:
        warnings.append(
            f"no LLM model name for {', '.join(no_model)} (set llm_model, or llm_<tier>_model): most servers refuse a request without one"
        )
    return warnings
