"""Operational routes: /health, the powerful-memory switch, reset_confirmed_at."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import nekomem
from nekomem.actors.messages import ResetConfirmedAt
from nekomem.domain.layers import REFLECTIONS
from nekomem.http.bodies import decode_body
from nekomem.http.errors import ApiError
from nekomem.http.guard import bearer_matches
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.schemas import PowerfulMemoryBody
from nekomem.runtime.runtime import Runtime
from nekomem.runtime.switches import POWERFUL, SwitchError
from nekomem.stores.fact_backlog import backlog_remaining


def embeddings_status(rt: Runtime) -> dict[str, Any]:
    emb = rt.embeddings
    if emb is None:
        return {"state": "disabled", "model": "", "pending": 0, "reason": "no embedding service configured"}
    status = {
        "state": emb.state,
        "model": getattr(emb, "model_id", "") or "",
        "pending": rt.services.pending(),
    }
    reason = getattr(emb, "reason", None)
    if reason:
        status["reason"] = reason
    error = getattr(emb, "error", None)
    if error:
        status["error"] = error  # a remote endpoint failing now: recall uses its other legs
    return status


async def health(request: Request) -> Response:
    rt = runtime_of(request)
    llm_status = rt.llm.status() if rt.llm is not None else {}
    llm_available = any(t.get("configured") for t in llm_status.values())
    skipped = [tier for tier, t in llm_status.items() if not t.get("configured")]
    failing = [tier for tier, t in llm_status.items() if t.get("state") == "failing"]
    llm_state = "unconfigured" if not llm_available else "failing" if failing else "ok"
    # The first four keys are the reference's build_health_response (app, service, status,
    # instance_id). Its launcher's probe (utils/port_utils.py probe_neko_health) takes the
    # port for a N.E.K.O. service on "app" alone. "status" is "starting" while the routes
    # answer 409 storage_startup_blocked (start-up recovery, or a /block of the chat
    # server), so a script that waits for "ok" can then call them; the reference says "ok"
    # even then. A failing model (the server still stores and serves everything) shows
    # only in "overall" ("degraded") and in each tier's "state": "status" stays "ok".
    # nekomem's own identity follows in "server".
    blocking = rt.blocking_reason()
    storage = rt.services.storage
    assert storage is not None  # Services.__post_init__ creates it
    stored = await asyncio.to_thread(storage.snapshot)
    backlog = _fact_backlog(rt)
    token = rt.settings.server.api_token
    # /health is open (the launcher probes it without a token): with a token set, only
    # a caller that gives it learns the process, the root and the character names.
    shown = not token or bearer_matches(request.headers.get("authorization", ""), token.encode("utf-8"))
    if not shown:
        stored = _without_names(stored)
        backlog["characters"] = {}
    body = {
        "app": rt.settings.server.health_app_name,
        "service": "memory",
        "status": "starting" if blocking is not None else "ok",
        "instance_id": rt.instance_id,
        "server": "nekomem",
        "version": nekomem.__version__,
        "overall": "starting" if blocking is not None else "degraded" if failing else "ok",
        "limited_mode": blocking is not None,
        "blocking_reason": blocking,
        "active_characters": rt.registry.active_count(),
        "llm": {
            "available": llm_available,
            "state": llm_state,
            "failing_tiers": failing,
            "tiers": llm_status,
            "skipped_tiers": skipped,
            "config_warnings": rt.llm.config_warnings() if rt.llm is not None else [],
        },
        "embeddings": embeddings_status(rt),
        "reranker": (
            rt.services.reranker.status()
            if rt.services.reranker is not None
            else rt.services.llm_reranker.status()
            if rt.services.llm_reranker is not None
            else {"state": "unconfigured"}
        ),
        "model_jobs": rt.pool.total_busy(),
        "supervision": {"child_restarts": 0, "failed_children": 0, "handler_errors": 0, **rt.services.counters.snapshot()},
        "storage": stored,
        "files": rt.files.snapshot(),
        "case_insensitive_root": rt.names.insensitive,
        "fact_backlog": backlog,
    }
    if shown:
        body["pid"] = os.getpid()
        body["memory_root"] = str(rt.memory_root.resolve())
    else:
        body["names_withheld"] = True
    return JSONResponse(body)


def fact_backlog_of(rt: Runtime, name: str, stored: int | None = None) -> int:
    """The stored turns of ``name`` still waiting for fact extraction: the count its
    recent actor published (exact, kept current while it is loaded), else ``stored`` (the
    character list's summary row, read with the journal's turns) or the count read once
    from its journal, kept either way (a passive character's backlog cannot change). The
    memory browser's listing shows this, and /health the same tally (:func:`_fact_backlog`).
    Blocking (it may open the journal read-only): call it off the event loop."""
    tally = rt.services.backlog
    known = tally.known(name)
    if known is not None:
        return known
    if stored is None:
        stored = backlog_remaining(rt.character_paths(name).time_index_db)
    return tally.publish_stored(name, stored)


def _without_names(storage: dict[str, Any]) -> dict[str, Any]:
    """The storage state with no character name (nor a detail, which may quote a path):
    each listed problem keeps its layer, view, code and time."""
    kept = dict(storage)
    for key in ("faults", "unrebuilt_views", "damaged_journals"):
        kept[key] = [{k: v for k, v in entry.items() if k not in ("character", "detail")} for entry in storage.get(key, [])]
    return kept


def _fact_backlog(rt: Runtime) -> dict[str, Any]:
    """The stored turns still waiting for fact extraction because they arrived before a
    model that can extract facts was configured: the setting, the rows remaining in all,
    and per character (those with any left), from the tally :func:`fact_backlog_of`
    reads: what each character loaded since the start published, and what the browser's
    listing read for the others (a backlog is mined by a loaded character; start-up loads
    those that have one when a model is configured). No journal is opened, so /health
    stays cheap with thousands of characters."""
    per = rt.services.backlog.snapshot()
    return {"enabled": rt.settings.longterm.fact_backlog_enabled, "rows_remaining": sum(per.values()), "characters": per}


def _toggle_lock(request: Request) -> asyncio.Lock:
    lock = getattr(request.app.state, "toggle_lock", None)
    if lock is None:
        lock = request.app.state.toggle_lock = asyncio.Lock()
    return lock


async def powerful_memory_get(request: Request) -> Response:
    rt = runtime_of(request)
    async with _toggle_lock(request):
        try:
            enabled = await asyncio.to_thread(rt.switches.get, POWERFUL)
        except SwitchError as exc:
            raise ApiError(503, "invalid_memory_setting", str(exc)) from None
    return JSONResponse({"enabled": enabled})


async def reset_all_confirmed_at(request: Request) -> int:
    rt = runtime_of(request)
    names = await asyncio.to_thread(rt.known_characters)
    total = 0
    for name in names:
        total += await ask(rt, name, REFLECTIONS, lambda reply: ResetConfirmedAt(reply=reply), int)
    return total


async def powerful_memory_post(request: Request) -> Response:
    rt = runtime_of(request)
    try:
        enabled = (await decode_body(request, PowerfulMemoryBody)).enabled
    except ApiError as exc:
        # The reference answers 400 (not 422) for anything but a JSON object with a boolean.
        raise ApiError(400, "bad_enabled" if exc.status == 422 else exc.code, exc.message) from None
    async with _toggle_lock(request):
        try:
            previous = await asyncio.to_thread(rt.switches.get, POWERFUL)
        except SwitchError:
            previous = True  # only a confirmed false may skip the migration
        if previous and not enabled:
            await reset_all_confirmed_at(request)
        await asyncio.to_thread(rt.switches.set, POWERFUL, enabled)
    return JSONResponse({"success": True, "enabled": enabled})


async def reset_confirmed_at(request: Request) -> Response:
    count = await reset_all_confirmed_at(request)
    return JSONResponse({"ok": True, "count": count})
