"""Back-pressure: a bound on the requests being answered at once.

Without it a burst of thousands of requests all queue inside the server (on the actors'
mailboxes and the event loop) and every one of them, the cheap reads included, waits
seconds. Beyond ``max_concurrent_requests`` a request is answered at once with 503
``server_busy`` and ``Retry-After``, so that the client backs off and the requests already
admitted finish in their usual time. ``/health`` is never refused (the launcher polls it to
tell a busy server from a dead one). Pure ASGI: the count is a plain integer, written only
on the event loop's thread.
"""

from __future__ import annotations

import logging

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from nekomem.config.server import ServerSettings
from nekomem.http.errors import error_response

log = logging.getLogger("nekomem.http.backpressure")

EXEMPT = frozenset({"/health"})


def busy_response(limit: int, retry_after: int) -> Response:
    """The 503 ``server_busy`` answer (with Retry-After) of a request beyond ``limit``."""
    response = error_response(503, "server_busy", f"the server is answering {limit} requests already; retry after {retry_after} s")
    response.headers["Retry-After"] = str(retry_after)
    return response


class ConcurrencyLimit:
    """Admit at most ``settings.max_concurrent_requests`` HTTP requests at once."""

    def __init__(self, app: ASGIApp, settings: ServerSettings) -> None:
        self.app = app
        self.limit = settings.max_concurrent_requests
        self.retry_after = settings.busy_retry_after_seconds
        self.in_flight = 0
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("server busy: %d requests refused so far (max_concurrent_requests=%d)", self.refused, self.limit)
            await busy_response(self.limit, self.retry_after)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
