"""Request counts and latencies per route, as pure ASGI middleware (no BaseHTTPMiddleware).

A request is labelled with the *template* of the route that answered it
(``/cache/{name}``), never with its path: a path carries a character name and the
``/api/characters/...`` ids, and a query string may carry recall text. Requests that no
route matched (404, and the guard's 401/403/415 refusals, which answer before routing)
share one label, ``<unmatched>``. Methods outside the HTTP set share ``OTHER``: neither a
path nor a method can mint new series.

The per-request cost is two ``perf_counter`` calls, one dict lookup of the cached label
pair and a counter increment plus a histogram observation on cached children.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import Counter, Histogram
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED = "<unmatched>"
OTHER_METHOD = "OTHER"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(route: BaseRoute) -> str:
    """A route's path template with converters dropped (``/cache/{name:str}`` -> ``/cache/{name}``)."""
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return UNMATCHED
    out: list[str] = []
    for part in path.split("{"):
        if "}" in part:
            inside, rest = part.split("}", 1)
            out.append("{" + inside.split(":", 1)[0] + "}" + rest)
        else:
            out.append(part)
    return "".join(out) or "/"


class RouteLabels:
    """The route label of a finished request, cached per route object."""

    def __init__(self, routes: Callable[[], list[BaseRoute]]) -> None:
        self._routes = routes
        self._labels: dict[int, str] = {}

    def of(self, scope: Scope) -> str:
        # Starlette's router records the route it dispatched to in scope["route"] (a
        # partial match, i.e. a 405, too). Older versions do not: match the table then.
        route = scope.get("route")
        if route is None:
            route = self._match(scope) if "endpoint" in scope else None
            if route is None:
                return UNMATCHED
        label = self._labels.get(id(route))
        if label is None:
            label = self._labels[id(route)] = route_template(route)
        return label

    def _match(self, scope: Scope) -> BaseRoute | None:
        partial = None
        for route in self._routes():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route
            if match is Match.PARTIAL and partial is None:
                partial = route
        return partial


class RequestMetrics:
    """Counts every HTTP request by method, route template and status and observes its
    latency (until the handler returned, the body included) by method and route.

    A handler that raises counts as status 500 (Starlette's outermost error middleware
    answers it after this one has seen the exception). WebSocket and lifespan scopes pass
    through uncounted.
    """

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram, labels: RouteLabels) -> None:
        self.app = app
        self.requests = requests
        self.latency = latency
        self.labels = labels
        # (method, route, status) -> (counter child, histogram child): labels() takes a
        # lock and builds a key each call; the children are stable, so look them up once.
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self._record(scope, status, time.perf_counter() - started)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        method = scope["method"]
        if method not in METHODS:
            method = OTHER_METHOD
        key = (method, self.labels.of(scope), status)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(method, key[1], str(status)),
                self.latency.labels(method, key[1]),
            )
        children[0].inc()
        children[1].observe(seconds)
