"""Cluster mode's front door: every request for a character goes to its shard's owner.

An ASGI middleware, the outermost of the app's own (see :class:`ForwardingMiddleware` for
what it does in place of the layers inside it; a request the request guard refuses is
refused on the first hop). It finds the character the way the routes do (the first route of
the app that matches the path, its ``name`` parameter, validated), then:

* this node owns the shard and it is ready: the request is served here, counted in flight
  on the shard (a hand-over waits for it);
* another node owns it: the request is sent there with the same method, path, query, body
  and headers (``Idempotency-Key`` included) on a pooled keep-alive connection
  (:mod:`nekomem.cluster.hop_pool`), and the answer is relayed; a request that arrived forwarded is never forwarded again;
* the shard is moving or has no owner yet: the request waits up to
  ``cluster_owner_wait_seconds`` for one, then answers 503 ``shard_unavailable`` with
  ``Retry-After`` (and the reference client's limited-mode fields).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nekomem.cluster.hop_pool import HopPool, Lost, Unreachable
from nekomem.cluster.node import ClusterNode
from nekomem.cluster.table import Route
from nekomem.http.backpressure import busy_response
from nekomem.http.errors import error_response
from nekomem.http.guard import RequestGuard
from nekomem.http.metrics_middleware import RequestStats, RouteLabels
from nekomem.stores.layout import InvalidName, validate_name
from nekomem.stores.shard_layout import shard_of

log = logging.getLogger("nekomem.cluster")

FORWARDED_HEADER = b"x-nekomem-forwarded-by"
SERVED_BY_HEADER = b"x-nekomem-node"  # on every character answer: the node that served it
SLOT_HEADER = b"x-nekomem-slot"  # ... and its front-proxy slot (cluster_proxy_slot), when set
# Hop-by-hop headers (RFC 9110 §7.6.1) and the framing the hop sets itself; ``expect``
# too: the forwarding node has read the whole body already, so no 100-continue is awaited.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"content-length",
        b"proxy-connection",
        b"expect",
    }
)
_WAIT_STEP = 0.05
# Requests' (method, path) -> their Target, remembered: matching a path against every
# route of the app and validating the name was a tenth of a forwarding node's CPU per
# request, and the shard's hash (NFC, BLAKE2b) a few percent more.
# Bounded: forgotten all at once past this many (a client sending endless distinct paths).
_CHARACTER_CACHE = 4096


class Target(NamedTuple):
    """The character a request addresses: its canonical name, shard, and the metrics label
    of the route it matched."""

    name: str
    shard: int
    route: str


class ForwardingMiddleware:
    """The outermost of the app's own middlewares (inside only Starlette's error handler).

    A request this node serves passes on to the rest of the stack (metrics, back-pressure,
    the request guard, limited mode, the routes). A request it forwards, or answers 503
    for, is answered here: the stack's per-request layers were a fifth of a forwarding
    node's CPU per hop, so this middleware does their part itself. It applies the request
    guard's checks first (a request the guard refuses is passed on, and refused there, on
    the first hop), counts the answer in the request metrics under the route's label, and
    bounds the forwards in flight by ``max_concurrent_requests`` (beyond it: 503
    ``server_busy`` with Retry-After, as the back-pressure answers).
    """

    def __init__(self, app: ASGIApp, node: ClusterNode, routes: Sequence[BaseRoute], stats: RequestStats, labels: RouteLabels) -> None:
        self.app = app
        self.node = node
        self.routes = routes
        self.stats = stats
        self.labels = labels
        c, server = node.settings.cluster, node.settings.server
        self.guard = RequestGuard(app, server)  # its checks only; the stack's own guard answers
        self.max_forwards = server.max_concurrent_requests
        self.busy_retry_after = server.busy_retry_after_seconds
        self.forwarding = 0
        self.wait = c.cluster_owner_wait_seconds
        self.max_length = server.name_max_length
        # One second: the request already waited here for an owner (cluster_owner_wait_seconds),
        # and a retry waits again the same way, so a client told to come back soon is served
        # as soon as the shard is (half the TTL, as before, kept a client away seconds after
        # a failover had ended).
        self.retry_after = "1"
        self.slot = c.cluster_proxy_slot
        self._targets: dict[tuple[str, str], Target | None] = {}
        self.pool = HopPool(max_idle=c.cluster_forward_connections, timeout=c.cluster_forward_timeout_seconds)

    def target(self, scope: Scope) -> Target | None:
        """The character a request addresses, or None (not a character route, or a name the
        route will refuse itself)."""
        key = (scope["method"], scope["path"])
        try:
            return self._targets[key]
        except KeyError:
            pass
        found = self._match(scope)
        if len(self._targets) >= _CHARACTER_CACHE:
            self._targets.clear()
        self._targets[key] = found
        return found

    def _match(self, scope: Scope) -> Target | None:
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.FULL:
                raw = child.get("path_params", {}).get("name")
                if not isinstance(raw, str):
                    return None
                try:
                    name = validate_name(raw, self.max_length)
                except InvalidName:
                    return None
                return Target(name, shard_of(name, self.node.shards), self.labels.of_route(route))
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        target = self.target(scope)
        if target is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        shard = target.shard
        forwarded = any(key == FORWARDED_HEADER for key, _ in scope["headers"])
        table = self.node.table
        body: bytes | None = None
        checked = False
        end = started + self.wait
        while True:
            route = table.route(shard, forwarded=forwarded)
            if route.kind == "local" and table.enter(shard):
                try:
                    await self.app(scope, _replay(body, receive) if body is not None else receive, self._mark(send))
                finally:
                    table.leave(shard)
                return
            if not checked:  # answered here from now on: the guard's checks first
                checked = True
                if self.guard.check(scope) is not None:
                    await self.app(scope, receive, send)  # refused by the stack's guard
                    return
            if route.kind == "forward":
                if self.forwarding >= self.max_forwards:
                    await self._answer(busy_response(self.max_forwards, self.busy_retry_after), scope, send, target, started)
                    return
                if body is None:
                    body = await _read_body(receive)
                self.forwarding += 1
                try:
                    status = await self._forward(route, scope, body, send)
                finally:
                    self.forwarding -= 1
                if status is not None:
                    self.stats.record(scope["method"], target.route, status, time.perf_counter() - started)
                    return
            if time.perf_counter() >= end:
                break
            await asyncio.sleep(_WAIT_STEP)
        self.node.counters.unavailable += 1
        response = error_response(
            503,
            "shard_unavailable",
            "the character's shard is moving to another node or has no owner yet; nothing was stored. Retry shortly",
            ok=False,
            limited_mode=True,
            blocking_reason="shard_moving",
            shard=shard,
        )
        response.headers["Retry-After"] = self.retry_after
        await self._answer(response, scope, send, target, started)

    async def _answer(self, response: Response, scope: Scope, send: Send, target: Target, started: float) -> None:
        """Send an answer of this middleware's own, counted in the request metrics."""
        await response(scope, _no_body, send)
        self.stats.record(scope["method"], target.route, response.status_code, time.perf_counter() - started)

    def _mark(self, send: Send) -> Send:
        """``send`` with the served-by header added to the answer's start."""
        marks = [(SERVED_BY_HEADER, self.node.node_id.encode())]
        if self.slot:
            marks.append((SLOT_HEADER, str(self.slot).encode()))

        async def marked(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *marks]}
            await send(message)

        return marked

    async def _forward(self, route: Route, scope: Scope, body: bytes, send: Send) -> int | None:
        """Send the request to the owner and relay its answer; the status answered, or None
        when the owner could not be reached (nothing was sent: the caller waits for a new
        owner)."""
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        headers.append((FORWARDED_HEADER, self.node.node_id.encode()))
        target = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        if query:
            target += b"?" + query
        try:
            status, answer_headers, content = await self.pool.request(route.url, scope["method"], target, headers, body)
        except Unreachable:
            self.node.counters.forward("unreachable")
            self.node.suspect(route.node)  # its shards may soon be ours: load them meanwhile
            return None
        except Lost as exc:
            # Sent, then lost: it may have been stored. Only the client can retry safely
            # (with its Idempotency-Key).
            self.node.counters.forward("failed")
            log.warning("a request forwarded to %s failed: %s", route.node, exc)
            response = error_response(503, "forward_failed", "the owner node did not answer; the request may or may not have been stored")
            response.headers["Retry-After"] = self.retry_after
            await response(scope, _no_body, send)
            return response.status_code
        self.node.counters.forward("ok")
        out = [(k, v) for k, v in answer_headers if k not in _HOP]  # the pool gives names in lower case
        out.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": content})
        return status

    async def aclose(self) -> None:
        await self.pool.close()


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields the already-read body once, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
