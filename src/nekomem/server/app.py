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
from nekomem.http.operations import (
    ID,
    LAYER,
    NAME,
    PAGE,
    QUERY,
    RELEASE_CLAIM,
    RID,
    SUBJECT_KEYS,
    TEXT,
    Operation,
    starlette_routes,
)
from nekomem.http.release_fence import ReleaseFence
from nekomem.mcp import mount_if_available
from nekomem.runtime.clock import Clock
from nekomem.runtime.reply import ActorFailure
from nekomem.runtime.runtime import Runtime

if TYPE_CHECKING:  # imported by the runtime when it needs them
    from nekomem.models.embeddings import EmbeddingService
    from nekomem.models.llm import LLMClient

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


def operations() -> list[Operation]:
    """The route table, in the router's order: every operation the app serves, each with
    what /openapi.json says of it (``server/openapi.py`` reads this same table)."""
    from nekomem.http import (
        browse,
        character_moves,
        erasure,
        external_import,
        identity,
        importing,
        knowledge,
        lifecycle,
        persona_json,
        prompt_locale,
        recall,
        repetition,
        scoped,
        scoped_epochs,
        startup_gate,
        theater,
    )
    from nekomem.http import schemas as s
    from nekomem.server import openapi

    c, sy, lt, sc = conversation, system, longterm, scoped
    ei, pl, lc = external_import, prompt_locale, lifecycle
    m = "/internal/memory/{name:str}"
    # The router tries routes in order: the conversation routes, which carry nearly all
    # traffic, come first (no other route shares their paths).
    return [
        Operation("/cache/{name:str}", "POST", c.cache, "Store finished turns", [NAME], s.HistoryBody, s.WriteAnswer),
        Operation("/new_dialog/{name:str}", "GET", c.new_dialog, "The working context", [NAME], answer=TEXT),
        Operation("/process/{name:str}", "POST", c.process, "Store, then compress at session end", [NAME], s.HistoryBody, s.WriteAnswer),
        Operation("/renew/{name:str}", "POST", c.renew, "Store, then compress in detailed mode", [NAME], s.HistoryBody, s.WriteAnswer),
        Operation("/settle/{name:str}", "POST", c.settle, "Compress what is cached", [NAME], s.HistoryBody, s.WriteAnswer),
        *browse.operations(),
        Operation("/health", "GET", sy.health, "Liveness, launcher probe and storage state", answer=s.HealthAnswer),
        Operation("/openapi.json", "GET", openapi.openapi, "This document"),
        Operation("/metrics", "GET", metrics.scrape, "Prometheus metrics (text exposition format)", answer=TEXT),
        Operation("/get_recent_history/{name:str}", "GET", c.get_recent_history, "The recent window as text", [NAME], answer=TEXT),
        Operation(
            "/last_conversation_gap/{name:str}",
            "GET",
            c.last_conversation_gap,
            "Seconds since the last turn",
            [NAME],
            answer=s.GapAnswer,
        ),
        Operation(
            "/api/memory/powerful_memory_config",
            "GET",
            sy.powerful_memory_get,
            "The powerful-memory switch",
            answer=s.EnabledAnswer,
        ),
        Operation(
            "/api/memory/powerful_memory_config",
            "POST",
            sy.powerful_memory_post,
            "Set the powerful-memory switch",
            body=s.PowerfulMemoryBody,
            answer=s.ToggleAnswer,
        ),
        Operation(
            "/internal/memory/reset_confirmed_at",
            "POST",
            sy.reset_confirmed_at,
            "Restart confirmed reflections' clocks",
            answer=s.CountAnswer,
        ),
        *startup_gate.operations(),
        Operation("/reflect/{name:str}", "POST", lt.reflect, "Synthesise and promote now", [NAME], answer=s.ReflectAnswer),
        Operation("/followup_topics/{name:str}", "GET", lt.followup_topics, "Reflections to bring up", [NAME]),
        Operation("/record_surfaced/{name:str}", "POST", lt.record_surfaced, "Record surfaced reflections", [NAME], s.RecordSurfacedBody),
        Operation("/query_memory/{name:str}", "POST", recall.query_memory, "Recall", [NAME], s.QueryBody, s.RecallAnswer),
        Operation("/api/tools/recall_memory", "GET", recall.recall_tool, "The recall_memory tool schema"),
        Operation(
            "/search_for_memory/{name:str}/{query:path}",
            "GET",
            recall.search_for_memory,
            "The recall block for a query, as a JSON string",
            [NAME, QUERY],
            answer=str,
        ),
        Operation(
            "/get_persona/{name:str}",
            "GET",
            persona_json.get_persona,
            "The persona in the reference's persona.json shape",
            [NAME],
        ),
        Operation("/cancel_correction/{name:str}", "POST", lc.cancel_correction, "Cancel pending context corrections", [NAME]),
        Operation(
            "/reload",
            "POST",
            lc.reload,
            "Reload every character from disk, closing release claims (body optional)",
            body=lc.ReloadBody,
        ),
        Operation(
            "/release_character/{name:str}",
            "POST",
            lc.release_character,
            "Release a character's files under a claim",
            [NAME, *RELEASE_CLAIM],
        ),
        Operation(f"{m}/scoped_facts", "POST", sc.scoped_facts, "Add facts about a scoped subject", [NAME], sc.ScopedFactsBody),
        Operation(f"{m}/scoped_history", "POST", sc.scoped_history, "Store scoped conversation", [NAME], sc.ScopedHistoryBody),
        Operation(f"{m}/scoped_context", "POST", sc.scoped_context, "Context of scoped subjects", [NAME], sc.ScopedContextBody),
        Operation(f"{m}/scoped_mentions", "POST", sc.scoped_mentions, "Record scoped mentions", [NAME], sc.ScopedMentionsBody),
        Operation(f"{m}/scoped_forget", "POST", sc.scoped_forget, "Forget a scoped subject", [NAME], sc.ScopedForgetBody),
        Operation(f"{m}/scoped_subjects", "GET", sc.scoped_subjects, "Scoped subjects", [NAME]),
        Operation(
            f"{m}/forget_epochs",
            "GET",
            scoped_epochs.forget_epochs,
            "Erase generations of scoped subjects",
            [NAME, SUBJECT_KEYS],
        ),
        Operation(
            "/internal/memory/import_external_markdown",
            "POST",
            ei.import_external_markdown,
            "Import OpenClaw / Hermes Markdown candidates",
            body=ei.ExternalImportBody,
            answer=ei.ExternalImportAnswer,
        ),
        *identity.operations(),
        *knowledge.operations(),
        Operation(
            f"{m}/repetition_insights",
            "POST",
            repetition.repetition_insights,
            "Phrases the character repeats",
            [NAME],
            repetition.RepetitionBody,
        ),
        Operation("/prompt-locale/{name:str}", "GET", pl.get_prompt_locale, "A character's context language", [NAME]),
        Operation(
            "/prompt-locale/{name:str}",
            "PUT",
            pl.put_prompt_locale,
            "Set a character's context language",
            [NAME],
            pl.PromptLocaleBody,
        ),
        *theater.operations(),
        Operation("/api/characters", "GET", lt.list_all_characters, "Every character", answer=s.CharactersAnswer),
        Operation(
            "/api/import/neko",
            "POST",
            importing.import_neko,
            "Import a reference memory folder (server-side path)",
            body=importing.ImportNekoBody,
        ),
        *erasure.operations(),
        *character_moves.operations(),
        Operation("/api/characters/{name:str}/card", "POST", lt.import_card, "Import a character card", [NAME], s.CardBody),
        Operation("/api/characters/{name:str}/facts", "POST", lt.import_facts, "Import facts", [NAME], s.FactsBody, s.ImportAnswer),
        Operation(
            "/api/characters/{name:str}/reflections/{reflection_id:str}/feedback",
            "POST",
            lt.feedback,
            "Confirm or deny a reflection",
            [NAME, RID],
            s.FeedbackBody,
        ),
        Operation(
            "/api/characters/{name:str}/{layer:str}",
            "GET",
            lt.list_layer,
            "List a layer",
            [NAME, LAYER, *PAGE],
            answer=s.PageAnswer,
        ),
        Operation(
            "/api/characters/{name:str}/{layer:str}/{entry_id:str}",
            "PATCH",
            lt.edit_entry,
            "Edit an entry (recent: by index, body {text})",
            [NAME, LAYER, ID],
            s.EntryEdit,
        ),
        Operation("/api/characters/{name:str}/{layer:str}/{entry_id:str}", "DELETE", lt.edit_entry, "Delete an entry", [NAME, LAYER, ID]),
    ]


def routes() -> list[BaseRoute]:
    """The router's routes, from :func:`operations`."""
    return starlette_routes(operations())


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

    table = operations()
    app = Starlette(
        routes=starlette_routes(table),
        lifespan=lifespan,
        exception_handlers={**ROUTE_ERROR_HANDLERS, Exception: internal_error_handler},
    )
    app.state.runtime = rt
    app.state.operations = table  # what /openapi.json documents (cluster mode adds its own)
    mcp = mount_if_available(app, settings.server.api_token) if settings.server.mcp_enabled else None
    app.state.longterm_renderer = longterm.render_longterm
    app.add_middleware(LimitedModeMiddleware, runtime=rt)
    app.add_middleware(ReleaseFence, runtime=rt)  # /release_character's hold (http/release_fence.py)
    cluster = None
    if settings.cluster.cluster_etcd_url:  # cluster mode (nekomem.cluster.routes); off: nothing changes
        from nekomem.cluster import routes as cluster_http

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
