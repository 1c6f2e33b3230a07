"""Request counts and latencies per route, as pure ASGI middleware (no BaseHTTPMiddleware).

A request is labelled with the *template* of the route that answered it
(``/cache/{name}``), never with its path: a path carries a character name and the
``/api/characters/...`` ids, and a query string may carry recall text. Requests that no
route matched (404, and the guard's 401/403/415 refusals, which answer before routing)
share one label, ``<unmatched>``. Methods outside the HTTP set share ``OTHER``: neither a
path nor a method can mint new series.

The per-request cost is two ``perf_counter`` calls, a few dict lookups and integer
increments (no lock: only the event loop's thread writes); the series are built from
those numbers at scrape time by :class:`RequestCollector`.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
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
        return self.of_route(route)

    def of_route(self, route: BaseRoute) -> str:
        """The label of ``route`` (one of the app's routes, or of a mounted app's)."""
        label = self._labels.get(id(route))
        if label is None:
            label = self._labels[id(route)] = self._label(route)
        return label

    def _label(self, route: BaseRoute) -> str:
        """The template of ``route``; for a route inside a mounted application (whose own
        router records its route last), prefixed with the mount's template."""
        table = self._routes()
        if any(top is route for top in table):
            return route_template(route)
        for top in table:
            inner: list[BaseRoute] = getattr(top, "routes", None) or []
            if any(r is route for r in inner):
                outer, rest = route_template(top).rstrip("/"), route_template(route)
                return outer + ("" if rest == "/" else rest) or "/"
        return route_template(route)

    def _match(self, scope: Scope) -> BaseRoute | None:
        partial = None
        for route in self._routes():
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route
            if match is Match.PARTIAL and partial is None:
                partial = route
        return partial


class RouteStats:
    """Requests of one (method, route): counts per status and a latency histogram."""

    __slots__ = ("statuses", "buckets", "seconds")

    def __init__(self, bounds: int) -> None:
        self.statuses: dict[int, int] = {}
        self.buckets = [0] * (bounds + 1)  # per bucket, not cumulative; the last is +Inf
        self.seconds = 0.0


class RequestStats:
    """What :class:`RequestMetrics` counts, as plain numbers.

    Written only by the event loop's thread, so without a lock; read at a scrape (from
    another thread) by copying, which the GIL makes consistent enough for counters. This
    is several times cheaper per request than prometheus_client's Counter and Histogram,
    whose every increment takes a lock.
    """

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.routes: dict[tuple[str, str], RouteStats] = {}

    def record(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one answered request of ``method`` on route template ``route``."""
        if method not in METHODS:
            method = OTHER_METHOD
        key = (method, route)
        stats = self.routes.get(key)
        if stats is None:
            stats = self.routes[key] = RouteStats(len(self.bounds))
        stats.statuses[status] = stats.statuses.get(status, 0) + 1
        stats.buckets[bisect.bisect_left(self.bounds, seconds)] += 1
        stats.seconds += seconds

    def snapshot(self) -> list[tuple[str, str, dict[int, int], list[int], float]]:
        """(method, route, count per status, per-bucket counts, seconds) of every route seen."""
        return [(m, r, dict(s.statuses), list(s.buckets), s.seconds) for (m, r), s in list(self.routes.items())]


class RequestCollector(Collector):
    """Exposes :class:`RequestStats` as ``nekomem_http_requests_total`` and the
    ``nekomem_http_request_duration_seconds`` histogram."""

    def __init__(self, stats: RequestStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "nekomem_http_requests", "HTTP requests answered, by method, route template and status", labels=["method", "route", "status"]
        )
        latency = HistogramMetricFamily(
            "nekomem_http_request_duration_seconds",
            "Time from a request's arrival until its response was sent, by method and route template",
            labels=["method", "route"],
        )
        # prometheus_client.utils is unannotated; floatToGoString(float) -> str.
        bounds = [*(floatToGoString(b) for b in self.stats.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for method, route, statuses, buckets, seconds in self.stats.snapshot():
            for status, count in sorted(statuses.items()):
                requests.add_metric([method, route, str(status)], count)
            cumulative = list(itertools.accumulate(buckets))
            latency.add_metric([method, route], list(zip(bounds, cumulative, strict=True)), seconds)
        yield requests
        yield latency


class RequestMetrics:
    """Counts every HTTP request by method, route template and status and observes its
    latency (until the handler returned, the body included) by method and route.

    A handler that raises counts as status 500 (Starlette's outermost error middleware
    answers it after this one has seen the exception). WebSocket and lifespan scopes pass
    through uncounted.
    """

    def __init__(self, app: ASGIApp, stats: RequestStats, labels: RouteLabels) -> None:
        self.app = app
        self.stats = stats
        self.labels = labels

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
        self.stats.record(scope["method"], self.labels.of(scope), status, seconds)
