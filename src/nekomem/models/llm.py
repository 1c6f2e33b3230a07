"""OpenAI-compatible chat client for the LLM tasks of SPEC §6.1.

One :class:`LLMClient` serves the whole process and is called from the model worker pool, so
it is thread-safe: one pooled ``httpx.Client`` per base URL, counters behind a lock. Every
call is ``POST {base_url}/chat/completions``; the answer's content is parsed defensively and
validated against the task's output Struct. What each endpoint accepts (``response_format``
level, token-limit parameter name) is negotiated once and remembered (see
``models/negotiation.py``); a refused format is re-sent at once at the next level, not
retried. Connection errors, timeouts, 429, 5xx and malformed or invalid output are retried
with exponential backoff and jitter; any other HTTP error is final at once. An answer cut
off at its token limit keeps its complete items.

Logs at INFO carry the task, tier, attempt, status code and elapsed time only; neither the
prompt nor the output is logged above DEBUG, and the API key never is.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from nekomem.config.llm import TIERS, LLMSettings
from nekomem.models.chat_response import (
    EXHAUSTED_FINISH_REASONS,
    AttemptFailed,
    content_of,
    error_detail,
    retry_after,
)
from nekomem.models.jsonparse import ModelOutputError, extract_json_object, salvage_truncated_object
from nekomem.models.negotiation import (
    Negotiator,
    format_fallback,
    response_format_field,
    state_schema_in_messages,
    token_param_fallback,
)
from nekomem.models.tasks import TASKS, TaskSpec, task_spec, validate_output
from nekomem.models.tier_health import TierStats, endpoint_warnings, public_url, utc_now_iso

__all__ = [
    "Endpoint",
    "LLMClient",
    "LLMError",
    "LLMNotConfigured",
    "LLMTaskFailed",
    "TASK_HEADER",
    "CallObserver",
    "resolve_endpoints",
]

log = logging.getLogger("nekomem.llm")

TASK_HEADER = "X-Nekomem-Task"

CallObserver = Callable[[str, str, str, float], None]
"""Told of every finished :meth:`LLMClient.run` as ``(task, tier, outcome, seconds)``;
``outcome`` is ``"ok"``, ``"failed"`` (LLMTaskFailed), ``"skipped"`` (tier not configured)
or ``"error"`` (anything else). Called on the calling thread; it must be quick and must
not raise."""


class LLMError(Exception):
    """Base of every error raised by :class:`LLMClient`."""


class LLMNotConfigured(LLMError):
    """The task's tier has no endpoint: the LLM stage is skipped, not faked."""

    def __init__(self, task: str, tier: str) -> None:
        super().__init__(f"LLM task {task} needs the {tier} tier, which has no endpoint configured")
        self.task = task
        self.tier = tier


class LLMTaskFailed(LLMError):
    """A task gave no valid answer within its attempts.

    ``status_code`` is the HTTP status of the last attempt (None for a transport error or a
    200 with bad output); ``output_exhausted`` says the last answer stopped on its
    output-token limit.
    """

    def __init__(
        self,
        task: str,
        attempts: int,
        last_error: str,
        *,
        status_code: int | None = None,
        output_exhausted: bool = False,
    ) -> None:
        super().__init__(f"LLM task {task} failed after {attempts} attempt(s): {last_error}")
        self.task = task
        self.attempts = attempts
        self.last_error = last_error
        self.status_code = status_code
        self.output_exhausted = output_exhausted


@dataclass(frozen=True)
class Endpoint:
    """Where one tier sends its requests. ``repr`` hides the key."""

    base_url: str
    model: str
    api_key: str
    timeout_seconds: float

    def __repr__(self) -> str:
        key = "set" if self.api_key else "none"
        return f"Endpoint(base_url={public_url(self.base_url)!r}, model={self.model!r}, api_key=<{key}>, timeout_seconds={self.timeout_seconds})"


def resolve_endpoints(settings: LLMSettings) -> dict[str, Endpoint | None]:
    """The endpoint of each tier; a tier's own fields win over the global ones.

    A tier whose resolved base URL is empty maps to None (not configured).
    """
    endpoints: dict[str, Endpoint | None] = {}
    for tier in TIERS:
        base_url = (getattr(settings, f"llm_{tier}_base_url") or settings.llm_base_url).strip()
        if not base_url:
            endpoints[tier] = None
            continue
        timeout = getattr(settings, f"llm_{tier}_timeout_seconds") or settings.llm_timeout_seconds
        endpoints[tier] = Endpoint(
            base_url=base_url.rstrip("/"),
            model=getattr(settings, f"llm_{tier}_model") or settings.llm_model,
            api_key=getattr(settings, f"llm_{tier}_api_key") or settings.llm_api_key,
            timeout_seconds=float(timeout),
        )
    return endpoints


@dataclass(frozen=True)
class _Request:
    """One task call's fixed parts; the negotiated parts are added per request."""

    spec: TaskSpec
    endpoint: Endpoint
    messages: list[dict[str, Any]]
    max_output_tokens: int
    timeout: float
    headers: dict[str, str]

    @property
    def key(self) -> tuple[str, str]:
        return (self.endpoint.base_url, self.endpoint.model)


class LLMClient:
    """Runs contract tasks against the configured tiers (thread-safe).

    ``sleep`` is called with each backoff delay (inject a no-op in tests).
    """

    def __init__(
        self,
        settings: LLMSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        now_iso: Callable[[], str] = utc_now_iso,
    ) -> None:
        self._settings = settings
        self._sleep = sleep
        self._now_iso = now_iso
        self._rng = rng or random.Random()
        self._endpoints = resolve_endpoints(settings)
        self._negotiator = Negotiator(settings.llm_response_format, settings.llm_output_tokens_param)
        self._lock = threading.Lock()
        self._http: dict[str, httpx.Client] = {}
        self._stats = {tier: TierStats() for tier in TIERS}
        self._requests: dict[tuple[str, str], int] = {}  # (tier, task) -> HTTP requests sent
        self._observers: tuple[CallObserver, ...] = ()
        self._schema_json = {name: msgspec.json.encode(spec.schema).decode() for name, spec in TASKS.items()}
        self._closed = False

    # --- configuration ---------------------------------------------------------------------

    @property
    def endpoints(self) -> dict[str, Endpoint | None]:
        return dict(self._endpoints)

    def available(self, tier: str) -> bool:
        """True when ``tier`` has an endpoint. Raises ValueError for an unknown tier."""
        if tier not in self._endpoints:
            raise ValueError(f"unknown LLM tier {tier!r} (expected one of {', '.join(TIERS)})")
        return self._endpoints[tier] is not None

    def config_warnings(self) -> list[str]:
        """What looks wrong in the configured tiers (see tier_health.endpoint_warnings)."""
        return endpoint_warnings({t: (e.base_url, e.model) if e else None for t, e in self._endpoints.items()})

    def tier_for(self, task: str) -> str:
        """The tier that runs ``task``. Raises UnknownTaskError (a KeyError) for an unknown task."""
        return task_spec(task).tier

    def task_available(self, task: str) -> bool:
        """True when the tier of ``task`` has an endpoint."""
        return self.available(self.tier_for(task))

    # --- calls -----------------------------------------------------------------------------

    def run(
        self,
        task: str,
        messages: list[dict[str, Any]],
        *,
        max_output_tokens: int | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> msgspec.Struct:
        """Run ``task`` on its tier and return the validated output Struct.

        ``max_output_tokens``, ``timeout`` and ``max_retries`` override the settings for this
        call. Raises LLMNotConfigured when the tier has no endpoint, LLMTaskFailed when no
        attempt gave a valid answer (after the retries, or at once for a 4xx other than
        429 that no negotiation step explains), UnknownTaskError for a task outside the
        contract, LLMError once closed.
        """
        spec = task_spec(task)
        started = time.perf_counter()
        outcome = "error"
        try:
            result = self._run(spec, messages, max_output_tokens, timeout, max_retries)
            outcome = "ok"
            return result
        except LLMNotConfigured:
            outcome = "skipped"
            raise
        except LLMTaskFailed:
            outcome = "failed"
            raise
        finally:
            elapsed = time.perf_counter() - started
            for observer in self._observers:
                observer(spec.name, spec.tier, outcome, elapsed)

    def _run(
        self, spec: TaskSpec, messages: list[dict[str, Any]], max_output_tokens: int | None, timeout: float | None, max_retries: int | None
    ) -> msgspec.Struct:
        """The body of :meth:`run` (which times it and tells the observers)."""
        task, tier = spec.name, spec.tier
        endpoint = self._endpoints[tier]
        if endpoint is None:
            with self._lock:
                self._stats[tier].skipped += 1
            log.info("llm task=%s tier=%s skipped: tier not configured", task, tier)
            raise LLMNotConfigured(task, tier)
        client = self._client_for(endpoint)
        timeout, max_output_tokens, max_retries = self._limits(task, endpoint, timeout, max_output_tokens, max_retries)
        headers = {TASK_HEADER: task, "Content-Type": "application/json"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        request = _Request(spec, endpoint, messages, max_output_tokens, timeout, headers)

        with self._lock:
            self._stats[tier].calls += 1

        attempts = 0
        last: AttemptFailed | None = None
        total = max_retries + 1
        while attempts < total:
            if attempts:
                self._sleep(self._backoff(attempts - 1, last))
            attempts += 1
            try:
                result = self._negotiated_attempt(client, request, attempts)
            except AttemptFailed as failure:
                last = failure
                with self._lock:
                    self._stats[tier].failed(f"{task}: {failure.message}", self._now_iso())
                log.warning(
                    "llm task=%s tier=%s attempt=%d/%d failed: %s",
                    task,
                    tier,
                    attempts,
                    total,
                    failure.message,
                )
                if not failure.retryable:
                    break
                continue
            with self._lock:
                self._stats[tier].succeeded(self._now_iso())
            return result

        assert last is not None
        with self._lock:
            self._stats[tier].failures += 1
        raise LLMTaskFailed(
            task,
            attempts,
            last.message,
            status_code=last.status_code,
            output_exhausted=last.output_exhausted,
        )

    def _limits(
        self, task: str, endpoint: Endpoint, timeout: float | None, max_output_tokens: int | None, max_retries: int | None
    ) -> tuple[float, int, int]:
        """(timeout, output token limit, retries) of one call: the overrides given, else the
        task's settings (review and rerank have their own), else the tier's."""
        settings = self._settings
        if timeout is None:
            if task == "review_recent":
                timeout = settings.llm_review_timeout_seconds
            elif task == "rerank":
                timeout = settings.llm_rerank_timeout_seconds
            else:
                timeout = endpoint.timeout_seconds
        if max_output_tokens is None:
            max_output_tokens = settings.llm_review_max_output_tokens if task == "review_recent" else settings.llm_max_output_tokens
        if max_retries is None:
            max_retries = settings.llm_rerank_max_retries if task == "rerank" else settings.llm_max_retries
        return timeout, max_output_tokens, max_retries

    def _negotiated_attempt(self, client: httpx.Client, request: _Request, attempt: int) -> msgspec.Struct:
        """One attempt: a request in the endpoint's dialect, and when the endpoint refuses
        that dialect, the same request at once in the next one (see negotiation.py).

        While the endpoint's dialect is unsettled, attempts to it run one at a time, so the
        first refusal teaches every later call. Raises AttemptFailed.
        """
        negotiator = self._negotiator
        key = request.key
        probe = None if negotiator.settled(key) else negotiator.probe_lock(key)
        if probe is not None:
            probe.acquire()
        try:
            dialect = negotiator.current(key)
            level, param, confirmed = dialect.response_format, dialect.tokens_param, dialect.format_confirmed
            switched_param = False
            probed: tuple[int, str] | None = None
            while True:
                try:
                    output = self._attempt(client, request, level, param, attempt)
                except AttemptFailed as failure:
                    if failure.accepted:
                        negotiator.accepted(key, level, param)
                    if failure.status_code is None or failure.accepted:
                        raise
                    status, detail = failure.status_code, failure.detail
                    other = None if negotiator.tokens_pinned or switched_param else token_param_fallback(param, status, detail)
                    if other is not None:
                        negotiator.refused_tokens_param(key, param, other, status)
                        self._log_fallback(request, f"{param} -> {other}", status)
                        param, switched_param = other, True
                        continue
                    step = None if negotiator.format_pinned else format_fallback(level, confirmed, status, detail)
                    if step is None:
                        raise
                    following, certain = step
                    if certain:
                        negotiator.refused_format(key, level, following, status)
                    elif not negotiator.may_probe(key):
                        raise
                    elif probed == (status, detail):
                        # The level below failed exactly like the one above: not the format.
                        negotiator.block_probing(key, self._settings.llm_negotiation_reprobe_seconds)
                        raise
                    else:
                        probed = (status, detail)
                    self._log_fallback(request, f"{level} -> {following}", status)
                    level, confirmed = following, False
                    continue
                negotiator.accepted(key, level, param)
                return output
        finally:
            if probe is not None:
                probe.release()

    def _log_fallback(self, request: _Request, step: str, status: int) -> None:
        log.warning(
            "llm task=%s tier=%s endpoint=%s model=%s refused the request (HTTP %d): trying %s",
            request.spec.name,
            request.spec.tier,
            public_url(request.endpoint.base_url),
            request.endpoint.model,
            status,
            step,
        )

    def _payload(self, request: _Request, level: str, param: str) -> bytes:
        """The request body in one dialect. Below json_schema the schema is also stated in
        the system message, as the server may not enforce it."""
        spec = request.spec
        messages = request.messages
        if level != "json_schema":
            messages = state_schema_in_messages(messages, self._schema_json[spec.name])
        payload: dict[str, Any] = {
            "model": request.endpoint.model,
            "messages": messages,
            param: request.max_output_tokens,
        }
        response_format = response_format_field(level, spec.name, spec.schema)
        if response_format is not None:
            payload["response_format"] = response_format
        return msgspec.json.encode(payload)

    def _attempt(self, client: httpx.Client, request: _Request, level: str, param: str, attempt: int) -> msgspec.Struct:
        """One HTTP request; the validated output, or AttemptFailed saying what went wrong."""
        task, tier, timeout = request.spec.name, request.spec.tier, request.timeout
        with self._lock:
            self._stats[tier].attempts += 1
            self._requests[(tier, task)] = self._requests.get((tier, task), 0) + 1
        url = f"{request.endpoint.base_url}/chat/completions"
        body = self._payload(request, level, param)
        started = time.perf_counter()
        try:
            response = client.post(url, content=body, headers=request.headers, timeout=timeout)
        except httpx.TimeoutException:
            raise AttemptFailed(f"timed out after {timeout:g} s", retryable=True) from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise AttemptFailed(f"bad endpoint URL: {type(exc).__name__}", retryable=False) from None
        except httpx.HTTPError as exc:
            raise AttemptFailed(f"transport error: {type(exc).__name__}", retryable=True) from None
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        status = response.status_code
        log.info(
            "llm task=%s tier=%s attempt=%d status=%d response_format=%s elapsed_ms=%.0f",
            task,
            tier,
            attempt,
            status,
            level,
            elapsed_ms,
        )

        if not 200 <= status < 300:
            raise AttemptFailed(
                f"HTTP {status}: {error_detail(response)}",
                retryable=status == 429 or status >= 500,
                status_code=status,
                retry_after=retry_after(response) if status == 429 else None,
                detail=error_detail(response, limit=2000) + " " + response.text[:2000],
            )
        try:
            decoded = response.json()
        except ValueError:
            raise AttemptFailed("response body is not JSON", retryable=True, accepted=True) from None
        try:
            content, finish_reason = content_of(decoded)
        except AttemptFailed as failure:
            failure.accepted = True
            raise
        log.debug("llm task=%s output: %s", task, content)
        return self._parse(request.spec, content, finish_reason in EXHAUSTED_FINISH_REASONS)

    def _parse(self, spec: TaskSpec, content: str, exhausted: bool) -> msgspec.Struct:
        """Validate the answer; a cut-off answer keeps its complete items when the task
        allows it. Raises AttemptFailed."""
        task, tier = spec.name, spec.tier
        try:
            try:
                return validate_output(task, extract_json_object(content))
            except ModelOutputError:
                if not (exhausted and spec.keeps_complete_items):
                    raise
            obj, kept = salvage_truncated_object(content)
            output = validate_output(task, obj)
        except ModelOutputError as exc:
            suffix = " (output stopped at its token limit)" if exhausted else ""
            raise AttemptFailed(f"{exc}{suffix}", retryable=True, output_exhausted=exhausted, accepted=True) from None
        log.warning("llm task=%s tier=%s output stopped at its token limit: kept %d complete item(s)", task, tier, kept)
        return output

    def _backoff(self, retry_index: int, last: AttemptFailed | None) -> float:
        """Delay before retry ``retry_index`` (0-based): doubling from the base, capped, then
        shortened by a random share of up to ``llm_backoff_jitter`` so that callers that
        failed together do not retry together; never shorter than a Retry-After."""
        settings = self._settings
        delay = min(settings.llm_backoff_base_seconds * float(2**retry_index), settings.llm_backoff_max_seconds)
        if settings.llm_backoff_jitter:
            delay *= 1.0 - settings.llm_backoff_jitter * self._rng.random()
        if last is not None and last.retry_after is not None:
            delay = min(max(delay, last.retry_after), settings.llm_backoff_max_seconds)
        return delay

    def _client_for(self, endpoint: Endpoint) -> httpx.Client:
        with self._lock:
            if self._closed:
                raise LLMError("LLM client is closed")
            client = self._http.get(endpoint.base_url)
            if client is None:
                client = httpx.Client(timeout=endpoint.timeout_seconds)
                self._http[endpoint.base_url] = client
            return client

    # --- health and shutdown -------------------------------------------------------------

    def status(self) -> dict[str, dict[str, Any]]:
        """Per-tier state for /health (never the key).

        ``calls`` counts run() calls that reached an endpoint, ``attempts`` the HTTP
        requests, ``failures`` the calls that ended in LLMTaskFailed, ``skipped`` the calls
        refused because the tier is not configured; ``state`` is ``ok`` / ``failing`` /
        ``untried`` / ``unconfigured`` (failing from ``failing_since``, the first failed
        attempt after the last valid answer at ``last_success_at``; a valid answer clears
        ``last_error`` into ``recovered_error``); ``negotiated`` is what the tier's
        endpoint is sent (response_format level, token parameter, whether a 2xx confirmed
        them, the fallbacks taken), None without an endpoint.
        """
        with self._lock:
            out: dict[str, dict[str, Any]] = {}
            for tier in TIERS:
                endpoint = self._endpoints[tier]
                stats = self._stats[tier]
                out[tier] = {
                    "configured": endpoint is not None,
                    "model": endpoint.model if endpoint else "",
                    "base_url": public_url(endpoint.base_url) if endpoint else "",
                    "calls": stats.calls,
                    "attempts": stats.attempts,
                    "failures": stats.failures,
                    "skipped": stats.skipped,
                    "last_error": stats.last_error,
                    "last_error_at": stats.last_error_at,
                    "state": stats.state(endpoint is not None),
                    "failing_since": stats.failing_since,
                    "last_success_at": stats.last_success_at,
                    "recovered_error": stats.recovered_error,
                    "negotiated": self._negotiator.status((endpoint.base_url, endpoint.model)) if endpoint else None,
                }
            return out

    def add_observer(self, observer: CallObserver) -> None:
        """Tell ``observer`` of every finished run() from now on (see CallObserver)."""
        with self._lock:
            self._observers = (*self._observers, observer)

    def remove_observer(self, observer: CallObserver) -> None:
        """Stop telling ``observer``; no error when it was not added."""
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)

    def request_counts(self) -> dict[tuple[str, str], int]:
        """HTTP requests sent so far per (tier, task), retries and negotiation re-sends
        included (for /metrics)."""
        with self._lock:
            return dict(self._requests)

    def close(self) -> None:
        """Close every pooled connection; later calls raise LLMError. Idempotent."""
        with self._lock:
            self._closed = True
            clients = list(self._http.values())
            self._http.clear()
        for client in clients:
            client.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
