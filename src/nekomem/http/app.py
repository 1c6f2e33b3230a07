"""The Starlette application: one request becomes one actor message."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from nekomem.actors.host import ACTORS
from nekomem.config import Settings
from nekomem.http import conversation, longterm, metrics, system
from nekomem.http.backpressure import ConcurrencyLimit
from nekomem.http.errors import (
    ApiError,
    actor_failure_handler,
    api_error_handler,
    error_response,
    internal_error_handler,
    not_found_handler,
    os_error_handler,
)
from nekomem.http.guard import RequestGuard
from nekomem.http.hot_route import Handler, HotRoute
from nekomem.http.release_fence import ReleaseFence
from nekomem.mcp import mount_if_available
from nekomem.runtime.clock import Clock
from nekomem.runtime.reply import ActorFailure
from nekomem.runtime.runtime import Runtime

if TYPE_CHECKING:  # imported by the runtime when it needs them
    from nekomem.providers.llm import LLMClient
    from nekomem.recall.embeddings import EmbeddingService

log = logging.getLogger("nekomem.http")

# How an error a route raised is answered (an error no handler takes is answered 500
# ``internal_error`` by the outermost layer: ``create_app`` adds it for Exception).
ROUTE_ERROR_HANDLERS: dict[type[Exception], Handler] = {
    ApiError: api_error_handler,
    ActorFailure: actor_failure_handler,
    HTTPException: not_found_handler,
    OSError: os_error_handler,
}

# The reference memory server's limited-mode allow-list.
UNFENCED = {
    "/health",
    "/shutdown",
    "/internal/storage/startup/continue",
    "/internal/storage/startup/block",
    "/internal/storage/startup/activate",
}


class LimitedModeMiddleware:
    """While start-up recovery runs, or after /internal/storage/startup/block, every route
    but the reference's allow-list (and the memory browser's page) answers 409."""

    def __init__(self, app: ASGIApp, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = self.runtime.blocking_reason()
        path = scope.get("path", "")
        if scope["type"] == "http" and reason is not None and path not in UNFENCED and not path.startswith("/ui"):
            response = error_response(
                409,
                "storage_startup_blocked",
                "the server is in limited mode (start-up recovery, or blocked by the chat server); try again shortly",
                ok=False,
                blocking_reason=reason,
                limited_mode=True,
            )
            # Limited mode passes (recovery ends, the chat server continues): say when to retry.
            response.headers["Retry-After"] = str(self.runtime.settings.server.limited_retry_after_seconds)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def routes() -> list[BaseRoute]:
    from nekomem.http import (
        browse,
        character_moves,
        erasure,
        external_import,
        identity,
        importing,
        knowledge,
        lifecycle,
        openapi,
        persona_json,
        prompt_locale,
        recall,
        repetition,
        scoped,
        scoped_epochs,
        startup_gate,
        theater,
    )

    c, s, lt = conversation, system, longterm
    # The router tries routes in order: the conversation routes, which carry nearly all
    # traffic, come first (no other route shares their paths).
    table: list[BaseRoute] = [
        Route("/cache/{name:str}", c.cache, methods=["POST"]),
        Route("/new_dialog/{name:str}", c.new_dialog, methods=["GET"]),
        Route("/process/{name:str}", c.process, methods=["POST"]),
        Route("/renew/{name:str}", c.renew, methods=["POST"]),
        Route("/settle/{name:str}", c.settle, methods=["POST"]),
        *browse.routes(),
        Route("/health", s.health, methods=["GET"]),
        Route("/openapi.json", openapi.openapi, methods=["GET"]),
        Route("/metrics", metrics.scrape, methods=["GET"]),
        Route("/get_recent_history/{name:str}", c.get_recent_history, methods=["GET"]),
        Route("/last_conversation_gap/{name:str}", c.last_conversation_gap, methods=["GET"]),
        Route("/api/memory/powerful_memory_config", s.powerful_memory_get, methods=["GET"]),
        Route("/api/memory/powerful_memory_config", s.powerful_memory_post, methods=["POST"]),
        Route("/internal/memory/reset_confirmed_at", s.reset_confirmed_at, methods=["POST"]),
        *startup_gate.routes(),
        Route("/reflect/{name:str}", lt.reflect, methods=["POST"]),
        Route("/followup_topics/{name:str}", lt.followup_topics, methods=["GET"]),
        Route("/record_surfaced/{name:str}", lt.record_surfaced, methods=["POST"]),
        Route("/query_memory/{name:str}", recall.query_memory, methods=["POST"]),
        Route("/api/tools/recall_memory", recall.recall_tool, methods=["GET"]),
        Route("/search_for_memory/{name:str}/{query:path}", recall.search_for_memory, methods=["GET"]),
        Route("/get_persona/{name:str}", persona_json.get_persona, methods=["GET"]),
        Route("/cancel_correction/{name:str}", lifecycle.cancel_correction, methods=["POST"]),
        Route("/reload", lifecycle.reload, methods=["POST"]),
        Route("/release_character/{name:str}", lifecycle.release_character, methods=["POST"]),
        Route("/internal/memory/{name:str}/scoped_facts", scoped.scoped_facts, methods=["POST"]),
        Route("/internal/memory/{name:str}/scoped_history", scoped.scoped_history, methods=["POST"]),
        Route("/internal/memory/{name:str}/scoped_context", scoped.scoped_context, methods=["POST"]),
        Route("/internal/memory/{name:str}/scoped_mentions", scoped.scoped_mentions, methods=["POST"]),
        Route("/internal/memory/{name:str}/scoped_forget", scoped.scoped_forget, methods=["POST"]),
        Route("/internal/memory/{name:str}/scoped_subjects", scoped.scoped_subjects, methods=["GET"]),
        Route("/internal/memory/{name:str}/forget_epochs", scoped_epochs.forget_epochs, methods=["GET"]),
        Route("/internal/memory/import_external_markdown", external_import.import_external_markdown, methods=["POST"]),
        *identity.routes(),
        *knowledge.routes(),
        Route("/internal/memory/{name:str}/repetition_insights", repetition.repetition_insights, methods=["POST"]),
        Route("/prompt-locale/{name:str}", prompt_locale.get_prompt_locale, methods=["GET"]),
        Route("/prompt-locale/{name:str}", prompt_locale.put_prompt_locale, methods=["PUT"]),
        *theater.routes(),
        Route("/api/characters", lt.list_all_characters, methods=["GET"]),
        Route("/api/import/neko", importing.import_neko, methods=["POST"]),
        *erasure.routes(),
        *character_moves.routes(),
        Route("/api/characters/{name:str}/card", lt.import_card, methods=["POST"]),
        Route("/api/characters/{name:str}/facts", lt.import_facts, methods=["POST"]),
        Route("/api/characters/{name:str}/reflections/{reflection_id:str}/feedback", lt.feedback, methods=["POST"]),
        Route("/api/characters/{name:str}/{layer:str}", lt.list_layer, methods=["GET"]),
        Route("/api/characters/{name:str}/{layer:str}/{entry_id:str}", lt.edit_entry, methods=["PATCH", "DELETE"]),
    ]
    return table


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    llm: LLMClient | None = None,
    embeddings: EmbeddingService | None = None,
    runtime: Runtime | None = None,
) -> Starlette:
    """Build the app and its runtime. The runtime starts with the app's lifespan."""
    rt = runtime or Runtime(settings, clock, actors=ACTORS, llm=llm, embeddings=embeddings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        rt.start()
        app.state.metrics.attach()
        if cluster is not None:  # cluster mode: claim shards once the runtime is up
            cluster.start()
        try:
            # The MCP session manager's task group lives as long as the app.
            async with mcp.running() if mcp is not None else contextlib.nullcontext():
                yield
        finally:
            if cluster is not None:
                cluster.stop()  # hands the shards over before the characters stop
            app.state.metrics.detach()
            rt.stop()

    app = Starlette(
        routes=routes(),
        lifespan=lifespan,
        exception_handlers={**ROUTE_ERROR_HANDLERS, Exception: internal_error_handler},
    )
    app.state.runtime = rt
    mcp = mount_if_available(app, settings.server.api_token) if settings.server.mcp_enabled else None
    app.state.longterm_renderer = longterm.render_longterm
    app.add_middleware(LimitedModeMiddleware, runtime=rt)
    app.add_middleware(ReleaseFence, runtime=rt)  # /release_character's hold (http/release_fence.py)
    cluster = None
    if settings.cluster.cluster_etcd_url:  # cluster mode (nekomem.http.cluster); off: nothing changes
        from nekomem.http import cluster as cluster_http

        cluster = cluster_http.attach(app, rt, settings)
    # Added after limited mode, so it runs before it: no refused request reaches limited
    # mode or a route.
    app.add_middleware(RequestGuard, settings=settings.server)
    if cluster is None:
        # The turns' route past the layers above that have nothing to do for it (they are
        # checked there; http/hot_route.py). Inside the concurrency bound and the metrics.
        route = next(r for r in app.router.routes if isinstance(r, Route) and r.endpoint is conversation.cache)
        app.add_middleware(
            HotRoute,
            runtime=rt,
            settings=settings.server,
            router=app.router,
            route=route,
            endpoint=conversation.cache,
            handlers=ROUTE_ERROR_HANDLERS,
        )
    # Back-pressure before anything else is done for a request (the metrics still count it).
    app.add_middleware(ConcurrencyLimit, settings=settings.server)
    # It times every request and also counts the ones the guard refuses.
    measured = metrics.install(app, rt)
    if cluster is not None:
        # Outermost in cluster mode: a request for another node's character is forwarded
        # before the layers above (it does their part for what it answers itself).
        cluster_http.add_forwarding(app, cluster, measured)
    return app
