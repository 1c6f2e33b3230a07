"""``POST /cache/{name}`` served past the layers that have nothing to do for it.

A chat posts one ``/cache`` per turn: nearly all of a server's requests. Between the
concurrency bound and the route, such a request crosses the request guard, the release
fence, limited mode, Starlette's exception middleware, the router and the route's own
exception wrapper, each an ASGI layer with its own coroutine and ``send`` wrapper; together
they cost more of the event loop's CPU per turn than the route's own work does
(docs/BENCHMARKS.md, bench.turn_cost).

:class:`HotRoute` sits right inside the concurrency bound (so every request is still
counted there and in the request metrics). For a ``POST`` whose path the ``/cache`` route
matches, it runs the checks of those layers itself, in their order, without any effect of
its own: when one of them would answer (a refused Host, Origin, token or content type, a
character /release_character holds, limited mode), the request takes the ordinary path
and that layer answers as always. Otherwise it sets the scope as the router would, calls
the route's handler and answers what it returns; an exception is answered by the app's own
handler for it (looked up by class, as Starlette does), and one without a handler goes on
to the outermost error middleware. Nothing is installed in cluster mode, whose forwarding
layer wraps the stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from nekomem.config.server import ServerSettings
from nekomem.http.guard import RequestGuard
from nekomem.http.release_fence import fenced_name
from nekomem.runtime.runtime import Runtime

PREFIX = "/cache/"
Handler = Callable[[Request, Exception], Awaitable[Response]]


class HotRoute:
    """ASGI middleware: ``POST /cache/{name}`` straight to its handler (see the module)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        runtime: Runtime,
        settings: ServerSettings,
        router: Router,
        route: Route,
        endpoint: Callable[[Request], Awaitable[Response]],
        handlers: Mapping[type[Exception], Handler],
    ) -> None:
        self.app = app
        self.runtime = runtime
        # The guard's checks are pure (its only state is a cache of Host verdicts).
        self.guard = RequestGuard(app, settings)
        self.router = router
        self.route = route
        self.endpoint = endpoint
        self.handlers = dict(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(PREFIX) or not self._served(scope):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await self.endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _served(self, scope: Scope) -> bool:
        """Whether no layer between here and the route would answer the request itself,
        and the ``/cache`` route matches it (then the scope is set as the router sets it)."""
        if self.guard.check(scope) is not None:
            return False
        runtime = self.runtime
        name = fenced_name(scope["path"], "POST")
        if name is not None and runtime.release_claims.held(runtime.names.canonical(name)):
            return False
        if runtime.blocking_reason() is not None:
            return False
        match, child = self.route.matches(scope)
        if match is not Match.FULL:
            return False
        if "router" not in scope:
            scope["router"] = self.router
        scope["route"] = self.route
        scope.update(child)
        return True

    def _handler(self, exc: Exception) -> Handler | None:
        """The app's handler for ``exc``: the first of its classes, most derived first."""
        for cls in type(exc).__mro__:
            handler = self.handlers.get(cls)
            if handler is not None:
                return handler
        return None
