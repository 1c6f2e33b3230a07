"""Cluster mode's HTTP side: start and stop the node with the app, the forwarding
middleware, the ``cluster`` object of ``/health``, the cluster-wide routes and metrics.

Nothing here is imported in single-node mode (``cluster_etcd_url`` empty).

Cluster-wide answers (decided here; the issue asks for aggregation without a shape):

* ``GET /health`` carries ``cluster: {node_id, nodes, shards_owned, moving, draining}``
  for this node (cheap: the launcher polls it); ``GET /health?scope=cluster`` adds
  ``members``: every live node's own ``/health``.
* ``GET /metrics?scope=cluster``: every live node's series with a ``node`` label.
* ``POST /reload`` runs on every live node (a reload must reach the node owning each
  character); the answer lists each node's status.
* ``GET /api/browse/characters`` lists the shared memory root, which every node sees whole.
* ``GET /cluster/status``: every node's view (nodes, shards per node, moving shards).
* ``POST /cluster/drain`` ``{"node": id, "undo": false}``: mark a node drained (its shards
  move to the others) or not.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nekomem.cluster.etcd import EtcdError
from nekomem.cluster.forward import FORWARDED_HEADER, ForwardingMiddleware
from nekomem.cluster.node import ClusterNode
from nekomem.cluster.schemas import DrainBody
from nekomem.config import Settings
from nekomem.http.bodies import convert_body, read_json_object
from nekomem.http.errors import ApiError, error_response
from nekomem.http.metrics import Metrics
from nekomem.http.metrics_middleware import RouteLabels
from nekomem.http.operations import Operation, starlette_routes
from nekomem.runtime.runtime import Runtime

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def node_identity(settings: Settings) -> tuple[str, str]:
    """(node id, advertise URL) from the settings, defaulted from the host name and port.
    Raises ValueError for an id etcd keys cannot carry."""
    c, server = settings.cluster, settings.server
    node_id = c.cluster_node_id or f"{socket.gethostname()}-{server.port}"
    if not _NODE_ID.match(node_id):
        raise ValueError(f"cluster_node_id {node_id!r}: use letters, digits, '-', '_' and '.' (64 at most)")
    url = c.cluster_advertise_url or f"http://{server.host}:{server.port}"
    return node_id, url.rstrip("/")


class ClusterHook:
    """The cluster node of one app, started and stopped by the app's lifespan."""

    def __init__(self, app: Starlette, runtime: Runtime, settings: Settings) -> None:
        node_id, url = node_identity(settings)
        self.node = ClusterNode(settings, runtime, node_id=node_id, url=url)
        self.app = app
        self.forwarder: ForwardingMiddleware | None = None
        self.http = httpx.AsyncClient(timeout=settings.cluster.cluster_aggregate_timeout_seconds)

    def start(self) -> None:
        self.node.start()
        metrics = getattr(self.app.state, "metrics", None)
        if metrics is not None:
            metrics.registry.register(ClusterCollector(self.node))

    def stop(self) -> None:
        self.node.stop()

    async def others(self, method: str, path: str, **kwargs: Any) -> dict[str, httpx.Response | str]:
        """The same call on every other live node (marked forwarded): node -> answer or error."""
        urls = {n: u for n, u in self.node.table.member_urls().items() if n != self.node.node_id}
        headers = {FORWARDED_HEADER.decode(): self.node.node_id, **kwargs.pop("headers", {})}

        async def one(url: str) -> httpx.Response | str:
            try:
                return await self.http.request(method, url + path, headers=headers, **kwargs)
            except httpx.HTTPError as exc:
                return type(exc).__name__

        answers = await asyncio.gather(*(one(u) for u in urls.values()))
        return dict(zip(urls, answers, strict=True))


def operations() -> list[Operation]:
    """The routes of cluster mode (listed in /openapi.json only then)."""
    return [
        Operation("/cluster/status", "GET", cluster_status, "Every node's view: nodes, shards per node, moving shards"),
        Operation("/cluster/drain", "POST", cluster_drain, "Drain a node (its shards move to the others) or end the drain", body=DrainBody),
    ]


def attach(app: Starlette, runtime: Runtime, settings: Settings) -> ClusterHook:
    """Cluster mode for ``app``: the node, the cluster-wide middleware and the /cluster
    routes. Call between adding the limited-mode middleware and the request guard, then
    :func:`add_forwarding` once every other middleware is added."""
    hook = ClusterHook(app, runtime, settings)
    cluster_ops = operations()
    app.router.routes.extend(starlette_routes(cluster_ops))
    app.state.operations = [*app.state.operations, *cluster_ops]  # documented in /openapi.json too
    app.state.cluster = hook
    app.add_middleware(ClusterWideMiddleware, hook=hook)
    return hook


def add_forwarding(app: Starlette, hook: ClusterHook, metrics: Metrics) -> None:
    """The forwarding middleware, outermost of the app's own: call after adding every other
    middleware (the request metrics included, whose numbers it feeds)."""
    labels = RouteLabels(lambda: app.router.routes)
    app.add_middleware(ForwardingMiddleware, node=hook.node, routes=app.router.routes, stats=metrics.requests, labels=labels)


def _hook(request: Request) -> ClusterHook:
    hook: ClusterHook = request.app.state.cluster
    return hook


async def cluster_status(request: Request) -> Response:
    """This node's view plus every other live node's (unless asked by another node)."""
    hook = _hook(request)
    own = hook.node.table.snapshot()
    own["owners"] = _owner_counts(hook.node)
    watch = hook.node.watch
    own["watch"] = {"up": watch.healthy, "events": watch.events, "breaks": watch.breaks, "reads": hook.node.counters.view_reads}
    nodes: dict[str, Any] = {hook.node.node_id: own}
    if FORWARDED_HEADER.decode() not in request.headers:
        for node, answer in (await hook.others("GET", "/cluster/status")).items():
            nodes[node] = (
                answer.json()["nodes"].get(node)
                if isinstance(answer, httpx.Response) and answer.status_code == 200
                else {"error": str(answer)}
            )
    return JSONResponse({"status": "success", "node_id": hook.node.node_id, "nodes": nodes})


def _owner_counts(node: ClusterNode) -> dict[str, int]:
    counts: dict[str, int] = {}
    for member in list(node.table.owners.values()):
        counts[member.node] = counts.get(member.node, 0) + 1
    return counts


async def cluster_drain(request: Request) -> Response:
    hook = _hook(request)
    body = convert_body(await read_json_object(request), DrainBody)
    target, undo = body.node, body.undo
    if not _NODE_ID.match(target):
        raise ApiError(400, "invalid_node", "body field 'node' must be a node id")
    try:
        await asyncio.to_thread(hook.node.set_drain, target, not undo)
    except EtcdError as exc:
        raise ApiError(503, "etcd_unavailable", f"the drain mark could not be written: {exc}") from None
    return JSONResponse({"status": "success", "node": target, "draining": not undo})


class ClusterWideMiddleware:
    """Adds the ``cluster`` object to /health and makes /health, /metrics (with
    ``?scope=cluster``) and /reload cluster-wide."""

    def __init__(self, app: ASGIApp, hook: ClusterHook) -> None:
        self.app = app
        self.hook = hook

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == "/api/import/neko":  # the importer writes the single-node layout
            response = error_response(
                409, "import_unsupported_in_cluster_mode", "import into a single node, then move the folders into their shard folders"
            )
            await response(scope, receive, send)
            return
        if path not in ("/health", "/metrics", "/reload"):
            await self.app(scope, receive, send)
            return
        forwarded = any(key == FORWARDED_HEADER for key, _ in scope["headers"])
        wide = b"scope=cluster" in scope.get("query_string", b"") and not forwarded
        if path == "/metrics" and not wide:
            await self.app(scope, receive, send)
            return
        status, headers, body = await _capture(self.app, scope, receive)
        if path == "/health" and status == 200:
            answer = json.loads(body)
            answer["cluster"] = self.hook.node.table.snapshot()
            if wide:
                members = {}
                for node, reply in (await self.hook.others("GET", "/health")).items():
                    members[node] = reply.json() if isinstance(reply, httpx.Response) else {"error": reply}
                answer["cluster"]["members"] = members
            body = json.dumps(answer, ensure_ascii=False).encode()
        elif path == "/metrics":
            parts = [_label(body.decode(), self.hook.node.node_id)]
            for node, reply in (await self.hook.others("GET", "/metrics")).items():
                if isinstance(reply, httpx.Response) and reply.status_code == 200:
                    parts.append(_label(reply.text, node))
            body = "".join(parts).encode()
        elif path == "/reload" and not forwarded and status == 200:
            answer = json.loads(body)
            nodes = {self.hook.node.node_id: "success"}
            for node, reply in (await self.hook.others("POST", "/reload")).items():
                nodes[node] = (
                    "success"
                    if isinstance(reply, httpx.Response) and reply.status_code == 200
                    else f"failed: {getattr(reply, 'status_code', reply)}"
                )
            answer["nodes"] = nodes
            body = json.dumps(answer, ensure_ascii=False).encode()
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"] + [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _capture(app: ASGIApp, scope: Scope, receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Run ``app`` and keep its whole answer."""
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def keep(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, keep)
    return int(start.get("status", 500)), list(start.get("headers", [])), b"".join(chunks)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?(\s.*)$")


def _label(text: str, node: str) -> str:
    """Prometheus text with ``node="<id>"`` added to every sample (comments kept once per node)."""
    out: list[str] = []
    for line in text.splitlines():
        match = _SAMPLE.match(line) if line and not line.startswith("#") else None
        if match is None:
            out.append(line)
            continue
        name, labels, rest = match.groups()
        inner = labels[1:-1] if labels else ""
        out.append(f'{name}{{node="{node}"{"," + inner if inner else ""}}}{rest}')
    return "\n".join(out) + "\n"


class ClusterCollector(Collector):
    """Forwards, moves, fencing refusals and ownership, read at scrape time."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        n = self.node
        forwards = CounterMetricFamily(
            "nekomem_cluster_forwards", "Requests forwarded to the owner of their shard, by outcome", labels=["outcome"]
        )
        for outcome, count in sorted(n.counters.forwards.items()):
            forwards.add_metric([outcome], count)
        yield forwards
        moves = CounterMetricFamily(
            "nekomem_cluster_shard_moves", "Shards claimed, released (handed over) or lost by this node", labels=["kind"]
        )
        for kind, count in sorted(n.counters.moves.items()):
            moves.add_metric([kind], count)
        yield moves
        yield CounterMetricFamily(
            "nekomem_cluster_fencing_refusals", "Writes refused by the fence (shard not owned or deadline passed)", value=n.fence.refusals
        )
        yield CounterMetricFamily(
            "nekomem_cluster_unavailable", "Requests answered 503 for want of a shard owner", value=n.counters.unavailable
        )
        yield CounterMetricFamily("nekomem_cluster_etcd_errors", "etcd calls that failed", value=n.counters.etcd_errors)
        yield GaugeMetricFamily("nekomem_cluster_watch_up", "1 while the watch on etcd's keys is streaming", value=float(n.watch.healthy))
        yield CounterMetricFamily("nekomem_cluster_watch_events", "Key changes the etcd watch reported", value=n.watch.events)
        yield CounterMetricFamily("nekomem_cluster_watch_breaks", "Times the etcd watch stream broke", value=n.watch.breaks)
        yield CounterMetricFamily(
            "nekomem_cluster_view_reads", "Full reads of the membership and shard owners from etcd", value=n.counters.view_reads
        )
        yield CounterMetricFamily(
            "nekomem_cluster_lock_overrides",
            "Shards taken over while a paused previous owner held the folder lock",
            value=n.locks.overrides,
        )
        prepared = CounterMetricFamily(
            "nekomem_cluster_prepared_characters",
            "Characters loaded while a dead owner's lease ran out: prepared, then adopted at the claim or loaded again (stale)",
            labels=["outcome"],
        )
        for outcome, count in (("prepared", n.prep.prepared), ("adopted", n.prep.adopted), ("stale", n.prep.stale)):
            prepared.add_metric([outcome], count)
        yield prepared
        yield CounterMetricFamily(
            "nekomem_cluster_prepared_abandoned",
            "Shards prepared for a take-over that went elsewhere or never came",
            value=n.prep.abandoned,
        )
        snap = n.table.snapshot()
        yield GaugeMetricFamily("nekomem_cluster_shards_owned", "Shards this node serves", value=float(snap["shards_owned"]))  # type: ignore[arg-type]
        yield GaugeMetricFamily("nekomem_cluster_nodes", "Live nodes in the cluster", value=float(len(snap["nodes"])))  # type: ignore[arg-type]
        yield GaugeMetricFamily(
            "nekomem_cluster_fence_seconds", "Seconds until the fencing deadline (negative: writes refused)", value=n.fence.remaining()
        )
