"""The HTTP client of the user's own model endpoints (the embedding endpoint of
:mod:`nekomem.models.embedding_remote`, the re-ranker of :mod:`nekomem.models.rerank`).

One JSON ``POST`` to ``{base_url}{path}`` with a Bearer key when one is configured, bounded
by the endpoint's timeout, and every way it can go wrong (unreachable, timed out, an error
status, an answer that is not JSON) raised as one error type the caller names, so each
caller maps a failure to its own fallback. Optionally at most ``concurrency`` requests are
in flight at once (a semaphore shared by every thread using the client). Thread-safe.
"""

from __future__ import annotations

import json
import threading

import httpx

from nekomem.config.endpoint import Endpoint
from nekomem.models.tier_health import public_url


class EndpointError(RuntimeError):
    """An endpoint could not answer: unreachable, timed out, an error status or an answer
    of the wrong shape. Transient: the next call tries again."""


class EndpointClient:
    """POSTs JSON to one endpoint path (see the module docstring)."""

    def __init__(
        self,
        endpoint: Endpoint,
        path: str,
        *,
        error: type[EndpointError] = EndpointError,
        concurrency: int = 0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``path`` (e.g. ``/embeddings``) is appended to the base URL; ``error`` is the
        type raised on failure; ``concurrency`` > 0 bounds the requests in flight."""
        self.url = endpoint.base_url.strip().rstrip("/") + path
        self.model = endpoint.model.strip()
        self._error = error
        headers = {"Content-Type": "application/json"}
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        self._client = httpx.Client(timeout=endpoint.timeout_seconds, headers=headers, transport=transport)
        self._gate = threading.BoundedSemaphore(concurrency) if concurrency > 0 else None

    def describe(self) -> str:
        """The endpoint (no credentials in the URL) and model, for logs and /health."""
        return f"{public_url(self.url)} model={self.model}" if self.model else public_url(self.url)

    @property
    def public_url(self) -> str:
        """The URL without credentials."""
        return public_url(self.url)

    def post(self, body: dict[str, object]) -> object:
        """The decoded JSON answer of ``POST url`` with ``body``. Raises the configured
        error type when the request fails, the status is not 200 or the answer is not JSON."""
        content = json.dumps(body)
        try:
            if self._gate is None:
                answer = self._client.post(self.url, content=content)
            else:
                with self._gate:
                    answer = self._client.post(self.url, content=content)
        except httpx.HTTPError as exc:
            raise self._error(f"{type(exc).__name__}: {exc}") from None
        if answer.status_code != 200:
            raise self._error(f"HTTP {answer.status_code}")
        try:
            decoded: object = answer.json()
        except ValueError:
            raise self._error("answer is not JSON") from None
        return decoded

    def close(self) -> None:
        self._client.close()
